"""The calendar's public functions: free/busy, booking, and the reads and writes behind its tools.

``free_busy`` and ``book`` are what the answering service uses. ``book`` never double-books:
bookings for one person are serialised by a transaction-scoped advisory lock, and the overlap
check and the insert happen under it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import icalendar

from core.errors import InvalidInput
from core.following import store as following_store
from core.store.pool import transaction
from core.store.queries import Queries
from core.tools.areas.calendar import ical
from core.tools.areas.calendar.model import Attendee, Busy, CalendarUnavailable, Event, SlotTaken, merge
from core.tools.areas.calendar.recurrence import series_end
from core.tools.areas.calendar.sources import (
    CalendarRow,
    caldav_client,
    calendars,
    google_event,
    google_path,
    remote_events,
)
from core.tools.areas.calendar.store import (
    ensure_pepper_calendar,
    insert_event,
    own_busy,
    own_event,
    own_events,
    split_ref,
)
from core.tools.connectors import Connectors
from core.tools.google_api import GoogleClient, GoogleError
from core.vault import SecretKeyError

log = logging.getLogger(__name__)

MAX_WINDOW = timedelta(days=366)


def _window(start: datetime, end: datetime) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise InvalidInput("start and end must carry a time zone")
    if end <= start:
        raise InvalidInput("the end must come after the start")
    if end - start > MAX_WINDOW:
        raise InvalidInput("ask for at most a year at a time")


async def free_busy(
    db: Queries, account_id: UUID, start: datetime, end: datetime, *, connectors: Connectors | None = None
) -> list[Busy]:
    """Busy intervals in [start, end), merged, sorted, UTC.

    Covers Pepper's own calendar and, when ``connectors`` is given, every connected calendar
    that counts toward busy time (read-only feeds do not, by default). Opaque events are busy,
    all-day ones included (the owner's whole local day); transparent events are free. A calendar that cannot be
    read raises ``CalendarUnavailable``: its time is unknown, never reported as free.
    """
    _window(start, end)
    busy = await own_busy(db, account_id, start, end)
    if connectors is not None:
        remote = [cal for cal in await calendars(db, account_id) if cal.kind != "pepper" and cal.counts_busy]
        # An all-day event covers the owner's local day (a holiday in London is not 00:00-24:00 UTC).
        zone = ZoneInfo("UTC")
        if remote:
            zone = ZoneInfo(await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id) or "UTC")
        for cal in remote:
            for ev in await remote_events(db, connectors, cal, start, end, zone):
                if ev.busy:  # opaque, all-day ones too; transparent ("free") events never block time
                    busy.append(Busy(ev.start, ev.end))
    return merge(busy, start, end)


@dataclass(frozen=True)
class Booking:
    event_id: UUID
    start: datetime
    end: datetime
    created: bool  # False when the booking key had already booked this slot


async def lock_bookings(conn: Queries, account_id: UUID) -> None:
    """Take the account's booking lock until the transaction ends: bookings (and the answering
    service's holds on slots) of one account are checked and made one at a time."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('calendar-book:' || $1::uuid::text, 0))", account_id
    )


async def book(
    db: Queries,
    account_id: UUID,
    start: datetime,
    end: datetime,
    title: str,
    *,
    booking_key: str | None = None,
    attendees: list[Attendee] | None = None,
    description: str | None = None,
    tzid: str | None = None,
    connectors: Connectors | None = None,
) -> Booking:
    """Book [start, end) in Pepper's own calendar if the person is free then.

    Raises ``SlotTaken`` when any busy time overlaps (``CalendarUnavailable`` when a calendar
    that counts cannot be read). Two concurrent bookings of overlapping times: exactly one wins.
    The same ``booking_key`` twice books once and returns the first booking.
    """
    _window(start, end)
    if not title.strip():
        raise InvalidInput("a booking needs a title")
    remote: list[Busy] = []
    if connectors is not None:
        remote = [b for b in await free_busy(db, account_id, start, end, connectors=connectors)]
    async with transaction(db) as conn:
        await lock_bookings(conn, account_id)
        if booking_key is not None:
            row = await conn.fetchrow(
                "SELECT id, starts_at, ends_at FROM calendar_events WHERE account_id = $1 AND booking_key = $2",
                account_id,
                booking_key,
            )
            if row is not None:
                return Booking(row["id"], row["starts_at"], row["ends_at"], created=False)
        if remote or await own_busy(conn, account_id, start, end):
            raise SlotTaken("that time is not free")
        zone = tzid or await conn.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id) or "UTC"
        calendar_id = await ensure_pepper_calendar(conn, account_id)
        event_id = await insert_event(
            conn,
            account_id,
            calendar_id,
            title=title.strip(),
            start=start,
            end=end,
            tzid=zone,
            description=description,
            attendees=[a.as_json() for a in attendees or ()],
            booking_key=booking_key,
        )
    return Booking(event_id, start, end, created=True)


@dataclass
class Listing:
    events: list[Event]
    unavailable: list[str] = field(default_factory=list)  # calendars that could not be read


async def list_events(
    db: Queries, connectors: Connectors, account_id: UUID, start: datetime, end: datetime, tz: ZoneInfo
) -> Listing:
    """Events of every calendar in [start, end); a calendar that fails is named, not skipped silently."""
    _window(start, end)
    out = Listing([])
    for cal in await calendars(db, account_id):
        if cal.kind == "pepper":
            out.events += await own_events(db, account_id, start, end, cal.name)
            continue
        try:
            out.events += await remote_events(db, connectors, cal, start, end, tz)
        except CalendarUnavailable as exc:
            log.warning("calendar unavailable: kind=%s error=%s", cal.kind, exc.code)
            # A key problem is the owner's to fix, not a passing outage: say so.
            key = exc.code == SecretKeyError.code
            out.unavailable.append(f"{cal.name} (its stored credentials do not open with this server's key)" if key
                                   else cal.name)  # fmt: skip
    out.events += [followed_event(r) for r in await following_store.agenda(db, account_id, start, end)]
    out.events.sort(key=lambda ev: (ev.start, ev.title))
    return out


FOLLOWED = "followed"


def followed_event(row: Any) -> Event:
    """A followed source's event (``core.following``) in the agenda: read-only, never busy time."""
    title = row["title"] + (" (cancelled, the source says)" if row["status"] == "cancelled" else "")
    return Event(
        ref=f"{FOLLOWED}:{row['id']}", calendar=f"Followed: {row['source']}", kind=FOLLOWED, title=title,
        start=row["starts_at"], end=row["ends_at"], all_day=row["all_day"], location=row["location"],
        read_only=True, busy=False, extra={"follow": row["follow_id"]},
    )  # fmt: skip


# --- Finding one event to change ----------------------------------------------------------------


@dataclass
class Target:
    """One event (or occurrence) found by its ref, with what a change needs."""

    cal: CalendarRow
    key: str
    original: datetime | None  # the occurrence's original start, when the ref names one
    title: str
    start: datetime
    end: datetime
    attendees: tuple[Attendee, ...]
    organizer: str | None
    recurring: bool
    detail: dict[str, Any] = field(default_factory=dict)

    def others(self, mine: set[str]) -> list[str]:
        """Attendees (and an organizer) who are not the person."""
        found = [a.email for a in self.attendees if a.email not in mine]
        if self.organizer and self.organizer not in mine and self.organizer not in found:
            found.append(self.organizer)
        return found


async def find_event(db: Queries, connectors: Connectors, account_id: UUID, ref: str) -> Target:
    """The event a ref from ``list_events`` names; ``InvalidInput`` when there is none."""
    try:
        cal_ref, key, original = split_ref(ref)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    if cal_ref == FOLLOWED:
        raise InvalidInput("that event comes from a source the person follows and is read-only here")
    cal = next((c for c in await calendars(db, account_id) if c.ref == cal_ref), None)
    if cal is None:
        raise InvalidInput(f"no calendar for ref {ref!r}; list the events again")
    if cal.read_only:
        raise InvalidInput(f"{cal.name} is a read-only calendar")
    if cal.kind == "pepper":
        row = await own_event(db, account_id, key)
        if row is None or row["status"] != "confirmed":
            raise InvalidInput(f"no event {ref!r}; list the events again")
        start, end = row["starts_at"], row["ends_at"]
        if original is not None and row["rrule"] is not None:
            start, end = original, original + (end - start)
        atts = tuple(Attendee(a["email"], a.get("name", ""), a.get("status", "")) for a in _json(row["attendees"]))
        return Target(
            cal, key, original if row["rrule"] else None, row["title"], start, end, atts, None,
            row["rrule"] is not None or row["series_id"] is not None, {"row": row},
        )  # fmt: skip
    if cal.kind == "caldav":
        client = await caldav_client(db, connectors, cal)
        res = await client.by_uid(key)
        if res is None:
            raise InvalidInput(f"no event {ref!r}; list the events again")
        doc = ical.parse_calendar(res.data)
        master = next(c for c in doc.walk("VEVENT") if c.get("RECURRENCE-ID") is None)
        start = ical._instant(master.decoded("DTSTART"), ZoneInfo("UTC"))[0]
        end = ical._instant(master.decoded("DTEND"), ZoneInfo("UTC"))[0] if master.get("DTEND") else start
        if original is not None:
            start, end = original, original + (end - start)
        organizer = master.get("ORGANIZER")
        return Target(
            cal, key, original, str(master.get("SUMMARY", "")), start, end, ical.attendees_of(master),
            ical._address(organizer) if organizer else None, master.get("RRULE") is not None,
            {"client": client, "res": res, "doc": doc, "master": master},
        )  # fmt: skip
    if cal.kind == "google":
        google = GoogleClient(db, connectors, cal.connection_id)  # type: ignore[arg-type]
        try:
            item = await google.call("GET", google_path(cal, key))
        except GoogleError as exc:
            if exc.status == 404:
                raise InvalidInput(f"no event {ref!r}; list the events again") from exc
            raise CalendarUnavailable(f"Google Calendar could not be read ({exc.message})") from exc
        ev = google_event(item, cal, ZoneInfo("UTC"))
        return Target(
            cal, key, None, ev.title, ev.start, ev.end, ev.attendees, ev.organizer, ev.recurring,
            {"client": google, "item": item},
        )  # fmt: skip
    raise InvalidInput(f"{cal.name} cannot be changed by Pepper")


def _json(value: Any) -> list[dict[str, Any]]:
    import json

    return json.loads(value) if isinstance(value, str) else list(value or [])


# --- Changing own events (inside the runner's transaction) ---------------------------------------


async def shift_own(
    conn: Queries, account_id: UUID, event_id: UUID, new_start: datetime, new_end: datetime, original: datetime | None
) -> None:
    row = await conn.fetchrow(
        "SELECT * FROM calendar_events WHERE id = $1 AND account_id = $2 FOR UPDATE", event_id, account_id
    )
    if row is None:
        raise InvalidInput("the event is gone")
    if row["rrule"] is not None and original is not None:
        await conn.execute(
            "UPDATE calendar_events SET exdates = array_append(exdates, $2), updated_at = now() WHERE id = $1",
            event_id,
            original,
        )
        await insert_event(
            conn, account_id, row["calendar_id"], title=row["title"], start=new_start, end=new_end, tzid=row["tzid"],
            location=row["location"], description=row["description"], attendees=_json(row["attendees"]),
            uid=row["uid"], series_id=event_id, recurrence_of=original,
        )  # fmt: skip
        return
    until = series_end(new_start, new_end, row["tzid"], row["rrule"]) if row["rrule"] else None
    await conn.execute(
        """
        UPDATE calendar_events SET starts_at = $2, ends_at = $3, series_until = $4, sequence = sequence + 1,
            updated_at = now()
        WHERE id = $1
        """,
        event_id,
        new_start,
        new_end,
        until,
    )


async def cancel_own(conn: Queries, account_id: UUID, event_id: UUID, original: datetime | None) -> None:
    row = await conn.fetchrow(
        "SELECT rrule FROM calendar_events WHERE id = $1 AND account_id = $2 FOR UPDATE", event_id, account_id
    )
    if row is None:
        raise InvalidInput("the event is gone")
    if row["rrule"] is not None and original is not None:
        await conn.execute(
            "UPDATE calendar_events SET exdates = array_append(exdates, $2), updated_at = now() WHERE id = $1",
            event_id,
            original,
        )
        return
    await conn.execute(
        "UPDATE calendar_events SET status = 'cancelled', sequence = sequence + 1, updated_at = now()"
        " WHERE id = $1 OR series_id = $1",
        event_id,
    )


# --- Changing CalDAV events ----------------------------------------------------------------------


def caldav_shift(doc: icalendar.Calendar, original: datetime | None, new_start: datetime, new_end: datetime) -> bytes:
    master = next(c for c in doc.walk("VEVENT") if c.get("RECURRENCE-ID") is None)
    tz = master.decoded("DTSTART").tzinfo or ZoneInfo("UTC")
    seq = int(master.get("SEQUENCE", 0)) + 1
    if original is not None and master.get("RRULE") is not None:
        override = icalendar.Event()
        for name in ("UID", "SUMMARY", "LOCATION", "DESCRIPTION", "ORGANIZER", "ATTENDEE"):
            if master.get(name) is not None:
                override[name] = master[name]
        override.add("RECURRENCE-ID", original.astimezone(tz))
        override.add("DTSTART", new_start.astimezone(tz))
        override.add("DTEND", new_end.astimezone(tz))
        override.add("DTSTAMP", datetime.now(ZoneInfo("UTC")))
        override.add("SEQUENCE", seq)
        doc.subcomponents = [
            c for c in doc.subcomponents
            if not (c.name == "VEVENT" and c.get("RECURRENCE-ID") is not None
                    and ical._instant(c.decoded("RECURRENCE-ID"), ZoneInfo("UTC"))[0] == original)
        ]  # fmt: skip
        doc.add_component(override)
        return doc.to_ical()
    for name, value in (("DTSTART", new_start), ("DTEND", new_end)):
        del master[name]
        master.add(name, value.astimezone(tz))
    if "DURATION" in master:
        del master["DURATION"]
    del master["SEQUENCE"]
    master.add("SEQUENCE", seq)
    return doc.to_ical()


def caldav_cancel_occurrence(doc: icalendar.Calendar, original: datetime) -> bytes:
    master = next(c for c in doc.walk("VEVENT") if c.get("RECURRENCE-ID") is None)
    tz = master.decoded("DTSTART").tzinfo or ZoneInfo("UTC")
    master.add("EXDATE", original.astimezone(tz))
    doc.subcomponents = [
        c for c in doc.subcomponents
        if not (c.name == "VEVENT" and c.get("RECURRENCE-ID") is not None
                and ical._instant(c.decoded("RECURRENCE-ID"), ZoneInfo("UTC"))[0] == original)
    ]  # fmt: skip
    return doc.to_ical()
