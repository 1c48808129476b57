"""Whether a room message gets a turn: decided here, in code, before any model call.

A member's message gets one when it mentions Pepper properly (its Matrix ID in the message's
``m.mentions``, a pill link, or the full ID typed out: not its name in passing), replies to one
of Pepper's posts, or follows up within :data:`FOLLOW_UP_WINDOW` of Pepper answering that member.
Anyone who is not a member (another agent, a bot, a guest), and any ``m.notice`` (what bots send),
gets a turn only with a proper mention, and never more than :data:`AGENT_EXCHANGE_CAP` answers to
non-members in a row: a member writing starts the count again. The turn's model may still say
nothing (``gateway.rooms.follow``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from core.adapters.matrix import RoomEvent
from core.records import rooms
from core.store.queries import Queries

FOLLOW_UP_WINDOW = timedelta(minutes=2)
AGENT_EXCHANGE_CAP = 3


@dataclass(frozen=True)
class Decision:
    speak: bool
    reason: str  # mention, reply, follow-up; or why not
    to_agent: bool = False


def mentions(event: RoomEvent, pepper: str) -> bool:
    return pepper in event.mentions or pepper.lower() in event.body.lower()


async def decide(
    db: Queries, room_id: UUID, event: RoomEvent, pepper: str, member: UUID | None, now: datetime,
    *, follow_up: timedelta = FOLLOW_UP_WINDOW, agent_cap: int = AGENT_EXCHANGE_CAP,
) -> Decision:  # fmt: skip
    if event.sender == pepper:
        return Decision(False, "own-post")
    if event.edit:
        return Decision(False, "edit")
    mentioned = mentions(event, pepper)
    if member is None or event.msgtype == "m.notice":
        if not mentioned:
            return Decision(False, "agent-not-mentioning")
        if await rooms.agent_answers_since_member(db, room_id) >= agent_cap:
            return Decision(False, "agent-exchange-cap")
        return Decision(True, "agent-mention", to_agent=True)
    if mentioned:
        return Decision(True, "mention")
    if event.reply_to and await rooms.is_pepper_event(db, event.reply_to):
        return Decision(True, "reply")
    answered = await rooms.last_answered(db, room_id, member)
    if answered is not None and now - answered <= follow_up:
        return Decision(True, "follow-up")
    return Decision(False, "not-addressed")
