"""The calendar's detectors: what each finds in a snapshot of a person's coming days.

Each detector is a function from a :class:`Snapshot` to :class:`Suggestion`s. A suggestion has a
stable ``key`` (the same finding on the next run has the same key, so it is neither duplicated
nor, once dismissed, brought back) and, where there is one, the action accepting it runs: a tool
call (``create_event`` or ``move_event``) that goes through the gate like any other.

Everything here is code: dates in mail, todos and notes are found by ``core.suggestions.dates``,
invitations by parsing their iCalendar parts. No text from a mail reaches a model.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import icalendar

from core.store.queries import Queries
from core.suggestions.dates import Found, dates_in, due_dates_in
from core.suggestions.mail import MailItem
from core.tools.areas.calendar import Busy, Event
from core.tools.areas.calendar.model import merge
from core.tools.areas.places import Travel, travel_between
from core.tools.connectors import Connectors

# Free slots are offered in these local hours, on half-hour marks.
DAY_START, DAY_END, STEP = time(9), time(18), timedelta(minutes=30)
SLOTS = 3
BLOCK = timedelta(minutes=60)  # the time a deadline's block takes unless the todo says
TITLE_MAX, DETAIL_MAX = 300, 4000
_WORD = re.compile(r"[^\W_]{4,}")  # words of four letters or more, any alphabet
_STOP = frozenset({"with", "from", "this", "that", "your", "have", "will", "about", "meeting", "event", "todo"})
_LENGTH = re.compile(r"\b(\d{1,3})\s*(h|hrs?|hours?|m|mins?|minutes?)\b|\b(an?|one|half an?) hour\b", re.IGNORECASE)


@dataclass(frozen=True)
class Suggestion:
    detector: str
    key: str
    title: str
    detail: str = ""
    action: dict[str, Any] | None = None  # {"tool": NAME, "arguments": {...}}


@dataclass
class Snapshot:
    """What the detectors read: the events of the window, busy time, open todos, recent notes
    and mail. ``mine``: the person's own addresses (to read their answer to an invitation)."""

    account_id: UUID
    tz: ZoneInfo
    now: datetime
    end: datetime
    events: list[Event]
    unavailable: list[str] = field(default_factory=list)
    mine: frozenset[str] = frozenset()
    todos: list[Any] = field(default_factory=list)  # rows: id, title, created_at
    notes: list[Any] = field(default_factory=list)  # rows: id, title, body
    mail: list[MailItem] = field(default_factory=list)
    mail_unavailable: list[str] = field(default_factory=list)  # mailboxes that could not be read, named
    _busy: list[Busy] | None = field(default=None, repr=False)

    def attended(self) -> list[Event]:
        """Timed, busy events the person has not declined, by start."""
        return sorted(
            (e for e in self.events if e.busy and not e.all_day and attends(e, self.mine)), key=lambda e: e.start
        )

    def busy(self) -> list[Busy]:
        """Busy time, merged. Read-only feeds (a school calendar) show in the agenda but do not block time."""
        if self._busy is None:
            raw = [Busy(e.start, e.end) for e in self.events if e.busy and e.kind != "ical" and attends(e, self.mine)]
            self._busy = merge(raw, self.now - timedelta(days=1), self.end + timedelta(days=2))
        return self._busy


def attends(event: Event, mine: frozenset[str]) -> bool:
    if event.extra.get("self_status") == "declined":
        return False
    return not any(a.email.lower() in mine and a.status.lower() == "declined" for a in event.attendees)


def stable_key(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:32]


def _fmt(value: datetime, tz: ZoneInfo) -> str:
    return f"{value.astimezone(tz):%a %d %b %H:%M}"


def _iso(value: datetime, tz: ZoneInfo) -> str:
    return value.astimezone(tz).replace(microsecond=0).isoformat()


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def free_slots(
    busy: Sequence[Busy], start: datetime, end: datetime, length: timedelta, tz: ZoneInfo, limit: int = SLOTS
) -> list[datetime]:
    """Up to ``limit`` starts of free ``length``-long slots in [start, end), in working hours
    (one per day at most, so the choice spreads over days)."""
    merged = merge(list(busy), start, end)  # sorted and disjoint: a bisection finds the one in the way
    starts = [b.start for b in merged]
    out: list[datetime] = []
    day = start.astimezone(tz).date()
    while len(out) < limit and datetime.combine(day, time(), tz) < end:
        lo = max(datetime.combine(day, DAY_START, tz), start)
        hi = min(datetime.combine(day, DAY_END, tz), end)
        slot = _round_up(lo, tz)
        while slot + length <= hi:
            i = bisect.bisect_left(starts, slot + length)  # intervals before i start before the slot ends
            if i == 0 or merged[i - 1].end <= slot:
                out.append(slot)
                break
            slot = _round_up(merged[i - 1].end, tz)
        day += timedelta(days=1)
    return out


def _round_up(value: datetime, tz: ZoneInfo) -> datetime:
    local = value.astimezone(tz).replace(second=0, microsecond=0)
    step = int(STEP.total_seconds() // 60)
    extra = (-local.minute) % step
    rounded = local + timedelta(minutes=extra)
    return rounded if rounded >= value else rounded + STEP


def _create(title: str, start: datetime, end: datetime, tz: ZoneInfo, **more: Any) -> dict[str, Any]:
    args = {"title": title[:TITLE_MAX], "start": _iso(start, tz), "end": _iso(end, tz), "send_invitations": False}
    args.update({k: (v[:DETAIL_MAX] if isinstance(v, str) else v) for k, v in more.items() if v})
    return {"tool": "create_event", "arguments": args}


# --- the detectors ----------------------------------------------------------------------------


async def clashes(snap: Snapshot, db: Queries, connectors: Connectors) -> list[Suggestion]:
    """Overlapping events the person attends; the later one can move to a free slot that day."""
    events, out = snap.attended(), []
    busy = snap.busy()
    for i, a in enumerate(events):
        for b in events[i + 1 :]:
            if b.start >= a.end:
                break
            day_end = datetime.combine(b.start.astimezone(snap.tz).date(), DAY_END, snap.tz)
            action: dict[str, Any] | None = None
            slot = [] if b.read_only else free_slots(
                busy, max(a.end, snap.now), day_end + timedelta(days=1), b.end - b.start, snap.tz, 1
            )  # fmt: skip
            if slot:
                action = {"tool": "move_event", "arguments": {"event": b.ref, "new_start": _iso(slot[0], snap.tz)}}
            title = f"{a.title} and {b.title} overlap on {_fmt(b.start, snap.tz)}"
            detail = f"{a.title}: {_fmt(a.start, snap.tz)}-{a.end.astimezone(snap.tz):%H:%M} ({a.calendar}); " + (
                f"{b.title}: {_fmt(b.start, snap.tz)}-{b.end.astimezone(snap.tz):%H:%M} ({b.calendar})."
            )
            if slot:
                detail += f" Accept to move {b.title} to {_fmt(slot[0], snap.tz)}."
            out.append(Suggestion("clash", stable_key(a.ref, a.start, b.ref, b.start), title, detail, action))
    return out


async def travel(snap: Snapshot, db: Queries, connectors: Connectors) -> list[Suggestion]:
    """Consecutive events on one day at different places: the time to get from one to the next,
    and a block for it before the second."""
    events, out = snap.attended(), []
    trips: dict[tuple[str, str], Travel | None] = {}
    for a, b in itertools.pairwise(events):
        if (
            not a.location
            or not b.location
            or " ".join(a.location.lower().split()) == " ".join(b.location.lower().split())
        ):
            continue
        if a.start.astimezone(snap.tz).date() != b.start.astimezone(snap.tz).date() or b.start < a.end:
            continue
        pair = (a.location, b.location)
        if pair not in trips:  # a day often goes back and forth between the same places
            trips[pair] = (await travel_between(db, connectors, snap.account_id, a.location, b.location))[0]
        trip = trips[pair]
        if trip is None:
            continue
        gap = b.start - a.end
        need = timedelta(minutes=trip.minutes)
        fits = need <= gap
        title = (
            f"Leave {a.title} by {_fmt(b.start - need, snap.tz)} for {b.title}"
            if fits
            else f"Not enough time to get from {a.title} to {b.title} on {_fmt(b.start, snap.tz)}"
        )
        detail = f"{a.location} to {b.location}: {trip.describe()}; {int(gap.total_seconds() // 60)} min between them."
        leave = max(a.end, b.start - need)
        action = None  # back to back: there is no time to block, only the warning
        if leave < b.start:
            action = _create(f"Travel to {b.location}", leave, b.start, snap.tz,
                             description=f"Travel from {a.location} ({trip.describe()})")  # fmt: skip
        key = stable_key(a.ref, a.end, b.ref, b.start, a.location, b.location)
        out.append(Suggestion("travel-time", key, title, detail, action))
    return out


def _ics_events(item: MailItem, snap: Snapshot) -> list[tuple[str, datetime, datetime, str | None, str]]:
    """(title, start, end, location, uid) of each VEVENT in the mail's iCalendar parts."""
    found = []
    for part in item.calendars:
        try:
            cal = icalendar.Calendar.from_ical(part)
        except ValueError:
            continue
        if str(cal.get("METHOD", "REQUEST")).upper() == "CANCEL":
            continue
        for comp in cal.walk("VEVENT"):
            try:
                start = comp.decoded("DTSTART")
                end = comp.decoded("DTEND") if comp.get("DTEND") is not None else None
            except (KeyError, ValueError):
                continue
            if not isinstance(start, datetime):
                start = datetime.combine(start, time(), snap.tz)
            if start.tzinfo is None:
                start = start.replace(tzinfo=snap.tz)
            if end is None or not isinstance(end, datetime):
                end = start + BLOCK
            elif end.tzinfo is None:
                end = end.replace(tzinfo=snap.tz)
            location = str(comp["LOCATION"]) if comp.get("LOCATION") else None
            title = " ".join(str(comp.get("SUMMARY", "")).split()) or item.subject or "Invitation"
            found.append((title, start, end, location,
                          str(comp.get("UID", ""))))  # fmt: skip
    return found


def _on_calendar(snap: Snapshot, start: datetime, end: datetime, title: str, uid: str = "") -> bool:
    words = _words(title)
    for ev in snap.events:
        if uid and ev.extra.get("uid") == uid:
            return True
        # Overlapping and about the same thing (a title word in common; with no word to go by,
        # the same start). A dense calendar always has something at that hour.
        if ev.start < end and ev.end > start and ((words & _words(ev.title)) if words else ev.start == start):
            return True
    return False


async def mail_events(snap: Snapshot, db: Queries, connectors: Connectors) -> list[Suggestion]:
    """An invitation (an iCalendar part) or a dated, timed event in a mail, not on the calendar."""
    out = []
    invitations: set[tuple[str, datetime]] = set()  # one invitation in two mailboxes is one card
    for item in snap.mail:
        found: list[tuple[str, datetime, datetime, str | None, str, str]] = []
        for e in _ics_events(item, snap):
            if e[4] and (e[4], e[1]) in invitations:
                continue
            invitations.add((e[4], e[1]))
            found.append((*e, "invitation"))
        if not item.calendars:
            for f in dates_in(f"{item.subject}\n{item.text}", snap.tz, snap.now):
                if f.has_time:
                    found.append((item.subject or "Event from a mail", f.start, f.end or f.start + BLOCK, None, "",
                                  f.quote))  # fmt: skip
        for title, start, end, location, uid, quote in found:
            if end <= snap.now or start > snap.end or _on_calendar(snap, start, end, title, uid):
                continue
            sender = item.sender or "a mail"
            detail = f"From {sender}'s mail {item.subject!r}: \u201c{quote}\u201d. Not on your calendar."
            action = _create(title, start, end, snap.tz, location=location,
                             description=f"From a mail from {sender}: {item.subject}")  # fmt: skip
            key = stable_key(item.source, item.id, uid, start)
            out.append(Suggestion("mail-event", key, f"Add {title!r} on {_fmt(start, snap.tz)}?", detail, action))
    return out


def _blocked_before(snap: Snapshot, title: str, due: datetime) -> bool:
    words = _words(title)
    return bool(words) and any(e.start < due and e.end > snap.now and words & _words(e.title) for e in snap.events)


def _length(text: str) -> timedelta | None:
    m = _LENGTH.search(text)
    if m is None:
        return None
    if m[3]:
        return timedelta(minutes=30 if m[3].lower().startswith("half") else 60)
    n = int(m[1])
    minutes = n * 60 if m[2].lower().startswith("h") else n
    return timedelta(minutes=minutes) if 5 <= minutes <= 8 * 60 else None


def _deadline(snap: Snapshot, source: str, ref: object, title: str, due: Found) -> Suggestion | None:
    if due.start <= snap.now or due.start > snap.end or _blocked_before(snap, title, due.start):
        return None
    length = BLOCK
    slots = free_slots(snap.busy(), snap.now, due.start, length, snap.tz)
    name = title.strip().splitlines()[0][:120] if title.strip() else "it"
    detail = f"Due {_fmt(due.start, snap.tz)} (\u201c{due.quote}\u201d, {source}); no time is blocked for it."
    if slots:
        detail += " Free: " + ", ".join(_fmt(s, snap.tz) for s in slots) + "."
        action = _create(f"Work on: {name}", slots[0], slots[0] + length, snap.tz)
    else:
        detail += " There is no free hour before then."
        action = None
    return Suggestion("deadline", stable_key(source, ref, due.start), f"Block time for {name!r}", detail, action)


async def deadlines(snap: Snapshot, db: Queries, connectors: Connectors) -> list[Suggestion]:
    """A due date in a todo, a mail or a note, with no event about it before then."""
    out = []
    for todo in snap.todos:
        for due in due_dates_in(todo["title"], snap.tz, snap.now)[:1]:
            if (s := _deadline(snap, "a todo", f"todo:{todo['id']}", todo["title"], due)) is not None:
                out.append(s)
    for note in snap.notes:
        text = f"{note['title'] or ''}\n{note['body']}"
        for due in due_dates_in(text, snap.tz, snap.now)[:1]:
            if (s := _deadline(snap, "a note", f"note:{note['id']}", note["title"] or note["body"], due)) is not None:
                out.append(s)
    for item in snap.mail:
        for due in due_dates_in(f"{item.subject}\n{item.text}", snap.tz, snap.now)[:1]:
            s = _deadline(snap, f"mail from {item.sender}", f"mail:{item.source}:{item.id}", item.subject, due)
            if s is not None:
                out.append(s)
    return out


async def todo_slots(snap: Snapshot, db: Queries, connectors: Connectors) -> list[Suggestion]:
    """A todo that says how long it takes (and has no due date: that is a deadline), with free
    slots of that length in the coming days."""
    out = []
    for todo in snap.todos:
        title = todo["title"]
        length = _length(title)
        if length is None or due_dates_in(title, snap.tz, snap.now) or _blocked_before(snap, title, snap.end):
            continue
        slots = free_slots(snap.busy(), snap.now, snap.end, length, snap.tz)
        if not slots:
            continue
        detail = f"Needs {int(length.total_seconds() // 60)} min. Free: " + ", ".join(_fmt(s, snap.tz) for s in slots)
        action = _create(title, slots[0], slots[0] + length, snap.tz)
        out.append(Suggestion("todo-slot", stable_key("todo", todo["id"]), f"Find time for {title!r}", detail, action))
    return out


Detect = Callable[[Snapshot, Queries, Connectors], Awaitable[list[Suggestion]]]
DETECT: dict[str, Detect] = {
    "clash": clashes,
    "travel-time": travel,
    "mail-event": mail_events,
    "deadline": deadlines,
    "todo-slot": todo_slots,
}
