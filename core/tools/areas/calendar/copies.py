"""Copies of outside events (a followed source's, ``core.following.copies``) in one of the
person's own remote calendars: Google Calendar or CalDAV.

A copy never carries attendees or an organizer and never sends an invitation (Google:
``sendUpdates=none``; CalDAV: no iTIP mail is ever built for it). It is transparent (not busy
time), as followed events are. The caller chooses the remote id (:func:`copy_id`), so writing the
same copy twice finds the event already there (Google answers 409 to an insert of a taken id;
a CalDAV PUT to the same resource replaces it) and never makes a second one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.store.queries import Queries
from core.tools.areas.calendar import ical
from core.tools.areas.calendar.model import CalendarUnavailable
from core.tools.areas.calendar.sources import CalendarRow, caldav_client, google_path
from core.tools.connectors import Connectors
from core.tools.google_api import GoogleClient, GoogleError

WRITABLE = ("google", "caldav")


@dataclass(frozen=True)
class Copy:
    title: str
    start: datetime
    end: datetime
    all_day: bool
    location: str | None
    description: str
    tzid: str
    mark: str  # who the copy is (Pepper's own key for it), kept on the remote event


def copy_id(calendar_id: UUID, key: str) -> str:
    """A remote id for one copy in one calendar: hex digits only, which Google's event ids allow
    (base32hex, 5 to 1024 characters) and which are safe in a CalDAV resource name."""
    return "pf" + hashlib.sha256(f"{calendar_id}:{key}".encode()).hexdigest()[:30]


def _google_body(c: Copy) -> dict[str, Any]:
    if c.all_day:
        zone = ZoneInfo(c.tzid)
        first = c.start.astimezone(zone).date()
        last = max(c.end.astimezone(zone).date(), first + timedelta(days=1))
        times: dict[str, Any] = {"start": {"date": first.isoformat()}, "end": {"date": last.isoformat()}}
    else:
        times = {"start": {"dateTime": c.start.isoformat(), "timeZone": c.tzid},
                 "end": {"dateTime": c.end.isoformat(), "timeZone": c.tzid}}  # fmt: skip
    return {
        "summary": c.title, "location": c.location or "", "description": c.description, **times,
        "status": "confirmed", "transparency": "transparent", "guestsCanInviteOthers": False,
        "extendedProperties": {"private": {"pepperCopy": c.mark}},
    }  # fmt: skip


def _vcalendar(uid: str, c: Copy) -> bytes:
    event = ical.build_vevent(uid=uid, title=c.title, start=c.start, end=c.end, tzid=c.tzid, location=c.location,
                              description=c.description)  # fmt: skip
    if c.all_day:
        zone = ZoneInfo(c.tzid)
        first = c.start.astimezone(zone).date()
        for name, value in (("DTSTART", first), ("DTEND", max(c.end.astimezone(zone).date(), first + timedelta(1)))):
            del event[name]
            event.add(name, value)
    event.add("TRANSP", "TRANSPARENT")
    event.add("X-PEPPER-COPY", c.mark)
    return ical.wrap(event)


async def put_copy(db: Queries, connectors: Connectors, cal: CalendarRow, remote_id: str, c: Copy) -> None:
    """Write (insert or replace) the copy; raises ``CalendarUnavailable`` when the calendar refuses."""
    if cal.kind == "google":
        client = GoogleClient(db, connectors, cal.connection_id)  # type: ignore[arg-type]
        body = _google_body(c)
        quiet = {"sendUpdates": "none"}
        # A patch merges nested fields: clear the other form of the times (an event can turn all-day).
        clear = {"date": None} if not c.all_day else {"dateTime": None, "timeZone": None}
        patch = {**body, "start": {**body["start"], **clear}, "end": {**body["end"], **clear}}
        try:
            try:
                await client.call("PATCH", google_path(cal, remote_id), params=quiet, body=patch)
            except GoogleError as exc:
                if exc.status not in (404, 410):
                    raise
                await client.call("POST", google_path(cal), params=quiet, body={"id": remote_id, **body})
        except GoogleError as exc:
            raise CalendarUnavailable(f"Google Calendar did not take the copy ({exc.message})",
                                      code=exc.code) from exc  # fmt: skip
        return
    if cal.kind == "caldav":
        client_ = await caldav_client(db, connectors, cal)
        # Pepper's own resource: replaced whole (the followed source is what it copies).
        await client_.put(client_.resource_url(remote_id, new=True), _vcalendar(f"{remote_id}@pepper", c))
        return
    raise CalendarUnavailable(f"{cal.name} cannot take copies", retryable=False)


async def delete_copy(db: Queries, connectors: Connectors, cal: CalendarRow, remote_id: str) -> None:
    """Delete the copy; one already gone counts as deleted."""
    if cal.kind == "google":
        client = GoogleClient(db, connectors, cal.connection_id)  # type: ignore[arg-type]
        try:
            await client.call("DELETE", google_path(cal, remote_id), params={"sendUpdates": "none"})
        except GoogleError as exc:
            if exc.status in (404, 410):
                return
            raise CalendarUnavailable(f"Google Calendar did not delete the copy ({exc.message})",
                                      code=exc.code) from exc  # fmt: skip
        return
    if cal.kind == "caldav":
        client_ = await caldav_client(db, connectors, cal)
        await client_.delete(client_.resource_url(remote_id, new=True), missing_ok=True)
        return
    raise CalendarUnavailable(f"{cal.name} cannot take copies", retryable=False)


__all__ = ["WRITABLE", "Copy", "copy_id", "delete_copy", "put_copy"]
