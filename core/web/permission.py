"""When a turn may reach the web: permission follows the conversation.

The ``web_research`` tool is shown only in a turn whose message asks for the web ("search the web
for...", "look it up online"), or approves Pepper's offer to search ("yes please" after "Shall I
look that up online?"), or follows such a message closely: the next ``followups`` messages of the
person within ``window`` (3 messages, 30 minutes by default), so "I mean the 48 GB version" works
without asking again. An hour later, or four messages on, the tool is gone.

A turn that may reach the web sees only the person's earlier messages in its memory block, not
Pepper's answers (``core.memory.block``): an earlier answer may carry a page's text, which would
otherwise ride into the next hand-off's request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.conversation import Message

WEB = "web"  # the connection name a permitted turn's session holds (``SessionContext.connections``)

_ASKS = re.compile(
    r"\b(?:the\s+web|web\s*search|on\s*line|online|internet|google|googling|bing|duckduckgo|browse"
    r"|look\s+(?:it|that|this|them|those)?\s*up|search\s+(?:for|the\s+(?:web|net)))\b",
    re.IGNORECASE,
)
_YES = re.compile(r"^\W*(?:yes|yeah|yep|yup|sure|ok|okay|please|go\s+ahead|do\s+it|sounds\s+good)\b", re.IGNORECASE)


def asks_for_web(text: str) -> bool:
    return _ASKS.search(text) is not None


@dataclass(frozen=True)
class WebWindow:
    followups: int = 3
    window: timedelta = timedelta(minutes=30)

    def permits(self, text: str, earlier: Sequence[Message], now: datetime) -> bool:
        """Whether the person's message ``text`` at ``now``, after ``earlier`` (the conversation's
        recent messages, oldest first), may use the web."""
        grants: list[datetime] = []  # when the person asked for the web (or said yes to it)
        person: list[datetime] = []  # every message of the person, to count follow-ups
        offered = False
        for message in earlier:
            if message.direction == "outbound":
                offered = asks_for_web(message.body)
                continue
            if message.author is not None:  # a caller's words, not the person's
                continue
            person.append(message.created_at)
            if asks_for_web(message.body) or (offered and _YES.search(message.body)):
                grants.append(message.created_at)
            offered = False
        if asks_for_web(text) or (offered and _YES.search(text)):
            return True
        if not grants:
            return False
        last = grants[-1]
        followup = sum(1 for at in person if at > last) + 1  # this message's number after the grant
        return followup <= self.followups and now - last <= self.window
