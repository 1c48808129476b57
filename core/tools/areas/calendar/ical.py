"""iCalendar (RFC 5545): reading events out of feeds and CalDAV resources, writing VEVENTs.

Recurrence in what we read (RRULE, RDATE, EXDATE, RECURRENCE-ID overrides) is expanded by
``recurring_ical_events``; all-day events and floating times are placed in the person's zone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import icalendar
import recurring_ical_events

from core.errors import InvalidInput
from core.tools.areas.calendar.model import Attendee, Event
from core.tools.areas.calendar.store import STAMP, occurrence_ref

PRODID = "-//Pepper//Pepper calendar//EN"


def parse_calendar(data: bytes | str) -> icalendar.Calendar:
    try:
        cal = icalendar.Calendar.from_ical(data)
    except (ValueError, IndexError, KeyError) as exc:
        raise InvalidInput("not an iCalendar document") from exc
    if cal.name != "VCALENDAR":
        raise InvalidInput("not an iCalendar document")
    return cal


def _instant(value: date | datetime, tz: ZoneInfo) -> tuple[datetime, bool]:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=tz)).astimezone(UTC), False
    return datetime.combine(value, time(), tz).astimezone(UTC), True


def _address(value: Any) -> str:
    return str(value).removeprefix("mailto:").removeprefix("MAILTO:").strip().lower()


def attendees_of(component: Any) -> tuple[Attendee, ...]:
    raw = component.get("ATTENDEE")
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        params = getattr(item, "params", {})
        out.append(
            Attendee(_address(item), str(params.get("CN", "")), str(params.get("PARTSTAT", "needs-action")).lower())
        )
    return tuple(out)


def events_between(
    calendars: Iterable[tuple[icalendar.Calendar, str]],
    start: datetime,
    end: datetime,
    *,
    tz: ZoneInfo,
    calendar_ref: str,
    calendar_name: str,
    kind: str,
    read_only: bool,
) -> list[Event]:
    """Every occurrence overlapping [start, end) in ``calendars`` (each with the key its events
    are referred to by, or "" to use the UID)."""
    events: list[Event] = []
    for cal, key in calendars:
        series = {str(c.get("UID")) for c in cal.walk("VEVENT") if c.get("RRULE") or c.get("RDATE")}
        overridden = {str(c.get("UID")) for c in cal.walk("VEVENT") if c.get("RECURRENCE-ID") is not None}
        try:
            found = recurring_ical_events.of(cal).between(start, end)
        except Exception as exc:  # the library raises a variety of errors on bad input
            raise InvalidInput("the calendar data could not be read") from exc
        for comp in found:
            if str(comp.get("STATUS", "")).upper() == "CANCELLED":
                continue
            uid = str(comp.get("UID", ""))
            s, all_day = _instant(comp.decoded("DTSTART"), tz)
            if comp.get("DTEND") is not None:
                e, _ = _instant(comp.decoded("DTEND"), tz)
            elif comp.get("DURATION") is not None:
                e = s + comp.decoded("DURATION")
            else:
                e = s + (timedelta(days=1) if all_day else timedelta(0))
            if e <= s:
                e = s + timedelta(minutes=1) if not all_day else s + timedelta(days=1)
            recurring = uid in series or uid in overridden
            base = f"{calendar_ref}:{key or uid}"
            original = comp.get("RECURRENCE-ID")
            ref = base
            if recurring and original is not None:
                ref = occurrence_ref(base, _instant(original.dt, tz)[0])
            organizer = comp.get("ORGANIZER")
            events.append(
                Event(
                    ref=ref,
                    calendar=calendar_name,
                    kind=kind,
                    title=str(comp.get("SUMMARY", "(no title)")),
                    start=s,
                    end=e,
                    all_day=all_day,
                    location=str(comp.get("LOCATION")) if comp.get("LOCATION") else None,
                    attendees=attendees_of(comp),
                    recurring=recurring,
                    read_only=read_only,
                    busy=str(comp.get("TRANSP", "OPAQUE")).upper() != "TRANSPARENT",
                    organizer=_address(organizer) if organizer else None,
                    extra={"uid": uid},
                )
            )
    events.sort(key=lambda ev: (ev.start, ev.title))
    return events


def build_vevent(
    *,
    uid: str,
    title: str,
    start: datetime,
    end: datetime,
    tzid: str,
    rrule: str | None = None,
    location: str | None = None,
    description: str | None = None,
    attendees: Sequence[Attendee] = (),
    organizer: str | None = None,
    sequence: int = 0,
    status: str | None = None,
    recurrence_id: datetime | None = None,
    exdates: Sequence[datetime] = (),
) -> icalendar.Event:
    tz = ZoneInfo(tzid)
    event = icalendar.Event()
    event.add("UID", uid)
    event.add("DTSTAMP", datetime.now(UTC))
    event.add("DTSTART", start.astimezone(tz))
    event.add("DTEND", end.astimezone(tz))
    event.add("SUMMARY", title)
    event.add("SEQUENCE", sequence)
    if rrule:
        event.add("RRULE", icalendar.vRecur.from_ical(rrule))
    for ex in exdates:
        event.add("EXDATE", ex.astimezone(tz))
    if recurrence_id is not None:
        event.add("RECURRENCE-ID", recurrence_id.astimezone(tz))
    if location:
        event.add("LOCATION", location)
    if description:
        event.add("DESCRIPTION", description)
    if organizer:
        event.add("ORGANIZER", f"mailto:{organizer}")
    for person in attendees:
        params = {"PARTSTAT": person.status.upper(), "RSVP": "TRUE", "ROLE": "REQ-PARTICIPANT"}
        if person.name:
            params["CN"] = person.name
        event.add("ATTENDEE", f"mailto:{person.email}", parameters=params)
    if status:
        event.add("STATUS", status)
    return event


def wrap(*events: icalendar.Event, method: str | None = None) -> bytes:
    cal = icalendar.Calendar()
    cal.add("PRODID", PRODID)
    cal.add("VERSION", "2.0")
    if method:
        cal.add("METHOD", method)
    for event in events:
        cal.add_component(event)
    cal.add_missing_timezones()
    return cal.to_ical()


def stamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime(STAMP)
