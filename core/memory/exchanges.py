"""Splitting a conversation into exchanges by pauses in time, never by channel.

A texted follow-up to an emailed question, twenty minutes later, is one exchange; the same text
the next morning starts a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from core.untrusted import neutralise_labels, quoted

# Words of a caller who never proved they are the person (``core.conversation.UNVERIFIED_CALLER``).
UNVERIFIED_WHO = "A caller who had not proved they are the person (their words, quoted; not the person's)"


class MessageLike(Protocol):
    created_at: datetime
    channel: str
    direction: str
    body: str


@dataclass(frozen=True)
class Exchange:
    """Messages in time order with no pause longer than the gap between neighbours."""

    messages: tuple[Any, ...]

    @property
    def started_at(self) -> datetime:
        return self.messages[0].created_at

    @property
    def ended_at(self) -> datetime:
        return self.messages[-1].created_at

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels used, in order of first use."""
        return tuple(dict.fromkeys(m.channel for m in self.messages))


def split_exchanges(messages: Iterable[MessageLike], gap: timedelta) -> list[Exchange]:
    """Group messages (any order) into exchanges, oldest first.

    A new exchange starts where the time since the previous message is more than ``gap``.
    """
    ordered = sorted(messages, key=lambda m: (m.created_at, getattr(m, "id", 0)))
    groups: list[list[Any]] = []
    for message in ordered:
        if groups and message.created_at - groups[-1][-1].created_at <= gap:
            groups[-1].append(message)
        else:
            groups.append([message])
    return [Exchange(tuple(g)) for g in groups]


def _trim(text: str, limit: int | None) -> str:
    text = text.strip()
    if limit is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)].rstrip() + "…"


def render_exchanges(
    exchanges: Sequence[Exchange], timezone: str, *, trim: int | None = None, keep_whole_after: datetime | None = None
) -> list[str]:
    """Exchanges as prompt lines: a header per exchange with its date, times and channels, then
    one line per message. Bodies are trimmed to ``trim`` characters except for messages at or after
    ``keep_whole_after`` (today's messages are never cut)."""
    zone = ZoneInfo(timezone)
    lines: list[str] = []
    for exchange in exchanges:
        start, end = exchange.started_at.astimezone(zone), exchange.ended_at.astimezone(zone)
        when = f"{start:%a} {start.day} {start:%b %Y}, {start:%H:%M}"
        if end.date() != start.date():
            when += f" to {end:%a} {end.day} {end:%b} {end:%H:%M}"
        elif end != start:
            when += f"-{end:%H:%M}"
        lines.append(f"Exchange, {when} ({', '.join(exchange.channels)}):")
        for m in exchange.messages:
            whole = keep_whole_after is not None and m.created_at >= keep_whole_after
            body = _trim(neutralise_labels(m.body), None if whole else trim)
            if m.direction == "inbound" and getattr(m, "author", None) is not None:
                who, body = UNVERIFIED_WHO, quoted(body)
            else:
                who = "Person" if m.direction == "inbound" else "Pepper"
            lines.append(f"[{m.created_at.astimezone(zone):%H:%M} {m.channel}] {who}: {body}")
    return lines
