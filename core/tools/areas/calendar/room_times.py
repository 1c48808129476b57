"""Members' calendars as a room may see them, and a meeting finder over them.

Each member picks, per room and per calendar, what the room sees (``core.records.rooms``): nothing,
free/busy, titles and times, or everything. :func:`shared_calendars` reads every calendar shared
above nothing; one that cannot be read is returned with ``events=None``: **unknown**, never free.
``find_room_time`` (area ``room``: only a room's turn sees it) proposes times when every member who
shares a calendar is free, from busy intervals only, and proposes nothing while any shared
calendar is unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.records import rooms
from core.store.queries import Queries
from core.tools.areas.calendar.model import Busy, CalendarUnavailable, Event, merge
from core.tools.areas.calendar.sources import calendars, remote_events
from core.tools.areas.calendar.store import own_events
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

log = logging.getLogger(__name__)

SLOT_STEP = timedelta(minutes=30)
DAY_HOURS = (time(8), time(20))  # proposals fall within these local hours
MAX_PROPOSALS = 5


@dataclass(frozen=True)
class SharedCalendar:
    member: str
    account_id: UUID
    calendar: str
    level: str
    events: list[Event] | None  # None: it could not be read (unknown)


async def shared_calendars(
    db: Queries, connectors: Connectors | None, room_id: UUID, start: datetime, end: datetime, tz: ZoneInfo
) -> list[SharedCalendar]:
    """Every calendar a member shares with the room above ``nothing``, with its events in [start, end)."""
    levels = await rooms.shares(db, room_id)
    found: list[SharedCalendar] = []
    for member in await rooms.members(db, room_id):
        for cal in await calendars(db, member.account_id):
            level = levels.get((member.account_id, cal.id), "nothing")
            if level == "nothing":
                continue
            events: list[Event] | None
            try:
                if cal.kind == "pepper":
                    events = await own_events(db, member.account_id, start, end, cal.name)
                elif connectors is None:
                    raise CalendarUnavailable("no outside services are set up on this server")
                else:
                    events = await remote_events(db, connectors, cal, start, end, tz)
                events.sort(key=lambda e: (e.start, e.title))
            except CalendarUnavailable as exc:
                log.warning("a shared calendar could not be read: kind=%s error=%s", cal.kind, exc.code)
                events = None
            found.append(SharedCalendar(member.name, member.account_id, cal.name, level, events))
    return found


def _proposals(busy: list[Busy], start: datetime, end: datetime, length: timedelta, tz: ZoneInfo) -> list[datetime]:
    found: list[datetime] = []
    slot = start
    while slot + length <= end and len(found) < MAX_PROPOSALS:
        local_start, local_end = slot.astimezone(tz), (slot + length).astimezone(tz)
        in_hours = (local_start.date() == local_end.date() and local_start.time() >= DAY_HOURS[0]
                    and local_end.time() <= DAY_HOURS[1])  # fmt: skip
        if in_hours and not any(b.start < slot + length and slot < b.end for b in busy):
            found.append(slot)
        slot += SLOT_STEP
    return found


def make_room_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _find(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        room_id = ctx.session.room_id
        assert room_id is not None  # the gate shows room tools only in a room
        tz = ZoneInfo(ctx.session.timezone)
        length = timedelta(minutes=int(args.get("minutes", 60)))
        start = ctx.now.replace(second=0, microsecond=0)
        start += timedelta(minutes=(-start.minute) % 30)
        end = start + timedelta(days=int(args.get("days", 7)))
        shared = await shared_calendars(ctx.db, connectors, room_id, start, end, tz)
        unknown = [f"{s.member}'s calendar {s.calendar!r}" for s in shared if s.events is None]
        if unknown:
            return ToolOutcome.failed(
                f"No time proposed: {', '.join(unknown)} cannot be read right now, so that time is unknown, not"
                " free. Say so; do not guess a time."
            )
        if not shared:
            return ToolOutcome.empty("no member shares a calendar with this room, so no common free time is known")
        busy = merge([Busy(e.start, e.end) for s in shared for e in s.events or () if e.busy], start, end)
        counted = sorted({s.member for s in shared})
        others = sorted({m.name for m in await rooms.members(ctx.db, room_id)} - set(counted))
        slots = _proposals(busy, start, end, length, tz)
        note = f" Not counted (they share no calendar with this room): {', '.join(others)}." if others else ""
        if not slots:
            return ToolOutcome.empty(f"no {length.seconds // 60}-minute time when {', '.join(counted)} are all free"
                                     f" between 08:00 and 20:00 ({tz.key}) in the next days.{note}")  # fmt: skip
        lines = [f"- {s.astimezone(tz):%a %d %b %H:%M}-{(s + length).astimezone(tz):%H:%M}" for s in slots]
        head = f"Times ({tz.key}) when {', '.join(counted)} are all free, from what they share:"
        return ToolOutcome.ok("\n".join([head, *lines]) + (f"\n{note.strip()}" if note else ""))

    return (
        Tool(
            name="find_room_time",
            description="Propose meeting times when every member who shares a calendar with this room is free."
            " Never proposes a time over a calendar that cannot be read.",
            parameters={
                "type": "object",
                "properties": {
                    "minutes": {"type": "integer", "minimum": 15, "maximum": 480, "description": "length (default 60)"},
                    "days": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 14,
                        "description": "how far ahead (default 7)",
                    },
                },
                "additionalProperties": False,
            },
            handler=_find,
            area="room",
        ),
    )
