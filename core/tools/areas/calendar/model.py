"""The calendar area's vocabulary: one event shape for every source, and time parsing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import InvalidInput, PepperError


class CalendarUnavailable(PepperError):
    """A calendar that should count could not be read: its time is unknown, never free."""

    code = "calendar-unavailable"
    retryable = True


class SlotTaken(PepperError):
    """A booking overlaps busy time."""

    code = "slot-taken"


@dataclass(frozen=True)
class Attendee:
    email: str
    name: str = ""
    status: str = "needs-action"  # needs-action, accepted, declined, tentative

    def as_json(self) -> dict[str, str]:
        return {"email": self.email, "name": self.name, "status": self.status}


@dataclass(frozen=True)
class Busy:
    """A busy interval, UTC instants, ``start < end``."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class Event:
    """One event or one occurrence of a series, from any calendar.

    ``ref`` is what the model passes back to move or cancel it: ``<calendar ref>:<event key>``,
    plus ``@<original start>`` for one occurrence of a series.
    """

    ref: str
    calendar: str
    kind: str
    title: str
    start: datetime
    end: datetime
    all_day: bool = False
    location: str | None = None
    attendees: tuple[Attendee, ...] = ()
    recurring: bool = False
    read_only: bool = False
    busy: bool = True
    organizer: str | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"unknown time zone {name!r}") from exc


def parse_when(text: str, tz: ZoneInfo) -> datetime:
    """An ISO 8601 date-time (``2025-03-30T09:00``, with or without offset) or date, as an aware
    instant; a time without an offset is wall-clock time in ``tz``."""
    raw = text.strip()
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        try:
            value = datetime.combine(date.fromisoformat(raw), time())
        except ValueError as exc:
            raise InvalidInput(f"{raw!r} is not an ISO date or date-time such as 2025-06-02T09:00") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return value


def utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def merge(intervals: list[Busy], start: datetime, end: datetime) -> list[Busy]:
    """Clip to [start, end) and merge overlapping or touching intervals, sorted."""
    clipped = sorted((max(b.start, start), min(b.end, end)) for b in intervals if b.end > start and b.start < end)
    out: list[list[datetime]] = []
    for s, e in clipped:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [Busy(s, e) for s, e in out]


def describe(event: Event, tz: ZoneInfo) -> str:
    """One line the model reads: local times, the ref, and what matters for changing it."""
    start, end = event.start.astimezone(tz), event.end.astimezone(tz)
    if event.all_day:
        days = (end.date() - start.date()).days
        when = f"{start:%a %d %b %Y} all day" + (f" ({days} days)" if days > 1 else "")
    elif start.date() == end.date():
        when = f"{start:%a %d %b %Y %H:%M}-{end:%H:%M}"
    else:
        when = f"{start:%a %d %b %Y %H:%M} - {end:%a %d %b %H:%M}"
    bits = [f"{when} {event.title}"]
    if event.location:
        bits.append(f"at {event.location}")
    if event.attendees:
        bits.append("with " + ", ".join(a.name or a.email for a in event.attendees))
    flags = [event.calendar]
    if event.recurring:
        flags.append("repeats")
    if event.read_only:
        flags.append("read-only")
    return f"- {' '.join(bits)} [{'; '.join(flags)}] (ref {event.ref})"


def day_bounds(day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), tz)
    return start, datetime.combine(day + timedelta(days=1), time(), tz)
