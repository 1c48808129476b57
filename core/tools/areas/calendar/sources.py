"""Every calendar of a person behind one small interface: read events, and (where writable)
create, move and cancel. Pepper's own calendar is in Postgres; the others are remote."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import httpx

from core.errors import InvalidInput, PepperError
from core.store.queries import Queries
from core.tools.areas.calendar import ical
from core.tools.areas.calendar.caldav import CalDAVClient
from core.tools.areas.calendar.model import Attendee, CalendarUnavailable, Event
from core.tools.areas.calendar.store import ensure_pepper_calendar, short
from core.tools.connectors import CALENDAR_EVENTS, Connectors, opened_secret, seal
from core.tools.google_api import GoogleClient, GoogleError
from core.vault import SecretKeyError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalendarRow:
    id: UUID
    kind: str
    name: str
    remote: str | None
    read_only: bool
    counts_busy: bool
    connection_id: UUID | None

    @property
    def ref(self) -> str:
        return short(self.id)


async def calendars(db: Queries, account_id: UUID) -> list[CalendarRow]:
    """The person's calendars, Pepper's own first; adds the Google primary calendar the first
    time a Google connection with the events scope is seen."""
    await ensure_pepper_calendar(db, account_id)
    await db.execute(
        """
        INSERT INTO calendars (account_id, kind, name, connection_id, remote)
        SELECT c.account_id, 'google', 'Google', c.id, 'primary' FROM connections c
        WHERE c.account_id = $1 AND c.provider = 'google' AND $2 = ANY(c.scopes)
        ON CONFLICT DO NOTHING
        """,
        account_id,
        CALENDAR_EVENTS,
    )
    rows = await db.fetch(
        """
        SELECT id, kind, name, remote, read_only, counts_busy, connection_id FROM calendars
        WHERE account_id = $1 ORDER BY kind <> 'pepper', created_at, id
        """,
        account_id,
    )
    return [CalendarRow(**dict(r)) for r in rows]


async def find_calendar(db: Queries, account_id: UUID, ref_or_name: str | None) -> CalendarRow:
    rows = await calendars(db, account_id)
    if not ref_or_name:
        return rows[0]
    wanted = ref_or_name.strip().lower()
    for row in rows:
        if row.ref == wanted or row.name.lower() == wanted or row.kind == wanted:
            return row
    names = ", ".join(f"{r.name} ({r.ref})" for r in rows)
    raise InvalidInput(f"no calendar {ref_or_name!r}; the calendars are: {names}")


async def caldav_client(db: Queries, connectors: Connectors, cal: CalendarRow) -> CalDAVClient:
    # One read for the address and the secret: this runs on every remote calendar read in a turn.
    row = await db.fetchrow("SELECT config, secret, sealed FROM connections WHERE id = $1", cal.connection_id)
    try:
        secret = None if row is None else await opened_secret(db, connectors, cal.connection_id, row)  # type: ignore[arg-type]
    except SecretKeyError as exc:
        log.error("caldav connection secret does not open with the configured key")
        raise CalendarUnavailable(exc.message, code=exc.code, retryable=False) from exc
    if row is None or row["config"] is None or secret is None:
        raise CalendarUnavailable("the calendar's connection is gone", retryable=False)
    config = json.loads(row["config"]) if isinstance(row["config"], str) else dict(row["config"])
    return CalDAVClient(connectors, cal.remote or config["url"], config.get("username"), secret.get("password"))


async def connect_caldav(
    db: Queries, connectors: Connectors, account_id: UUID, url: str, username: str | None, password: str | None
) -> UUID:
    """Check the collection answers as a calendar with these credentials, then store the
    connection (the password sealed); returns the calendar id. Nothing is stored on a refusal."""
    client = CalDAVClient(connectors, url, username, password)
    name = await client.check()
    connection_id = await db.fetchval(
        """
        INSERT INTO connections (account_id, provider, label, config, sealed)
        VALUES ($1, 'caldav', $2, $3::jsonb, $4)
        ON CONFLICT (account_id, provider, label) DO UPDATE SET config = EXCLUDED.config, sealed = EXCLUDED.sealed,
            secret = '{}', updated_at = now()
        RETURNING id
        """,
        account_id,
        client.url,
        json.dumps({"url": client.url, "username": username}),
        seal(connectors, {"password": password} if password else {}),
    )
    return await db.fetchval(
        """
        INSERT INTO calendars (account_id, kind, name, connection_id, remote) VALUES ($1, 'caldav', $2, $3, $4)
        ON CONFLICT (account_id, kind, remote) WHERE remote IS NOT NULL DO UPDATE SET name = EXCLUDED.name
        RETURNING id
        """,
        account_id,
        name,
        connection_id,
        client.url,
    )


async def add_ical_feed(db: Queries, connectors: Connectors, account_id: UUID, url: str, name: str) -> UUID:
    """Follow a read-only iCalendar feed; it shows in the agenda but does not block free/busy."""
    url = await connectors.check_public_url(url)
    await fetch_feed(connectors, url)  # refuse what is not a calendar now, not at the next listing
    return await db.fetchval(
        """
        INSERT INTO calendars (account_id, kind, name, remote, read_only, counts_busy)
        VALUES ($1, 'ical', $2, $3, true, false)
        ON CONFLICT (account_id, kind, remote) WHERE remote IS NOT NULL DO UPDATE SET name = EXCLUDED.name
        RETURNING id
        """,
        account_id,
        name,
        url,
    )


async def fetch_feed(connectors: Connectors, url: str) -> Any:
    try:
        async with connectors.http(follow_redirects=True) as http:
            response = await http.get(url)
    except httpx.HTTPError as exc:
        raise CalendarUnavailable("the calendar feed did not answer") from exc
    if response.status_code != 200:
        raise CalendarUnavailable(f"the calendar feed answered {response.status_code}")
    try:
        return ical.parse_calendar(response.content)
    except InvalidInput as exc:
        raise CalendarUnavailable("the feed is not an iCalendar calendar", retryable=False) from exc


# --- Reading ------------------------------------------------------------------------------------


async def remote_events(
    db: Queries, connectors: Connectors, cal: CalendarRow, start: datetime, end: datetime, tz: ZoneInfo
) -> list[Event]:
    """Events of one remote calendar; raises ``CalendarUnavailable`` when it cannot be read."""
    if cal.kind == "ical":
        feed = await fetch_feed(connectors, cal.remote or "")
        return ical.events_between(
            [(feed, "")], start, end, tz=tz, calendar_ref=cal.ref, calendar_name=cal.name, kind="ical", read_only=True
        )
    if cal.kind == "caldav":
        client = await caldav_client(db, connectors, cal)
        found = await client.query(start, end)
        docs = []
        for res in found:
            try:
                docs.append((ical.parse_calendar(res.data), ""))
            except InvalidInput:
                log.warning("caldav resource is not iCalendar; skipped")
        return ical.events_between(
            docs, start, end, tz=tz, calendar_ref=cal.ref, calendar_name=cal.name, kind="caldav", read_only=False
        )
    if cal.kind == "google":
        return await google_events(db, connectors, cal, start, end, tz)
    raise CalendarUnavailable(f"unknown calendar kind {cal.kind}", retryable=False)


def _google_time(value: dict[str, Any], tz: ZoneInfo) -> tuple[datetime, bool]:
    if "dateTime" in value:
        return datetime.fromisoformat(value["dateTime"].replace("Z", "+00:00")).astimezone(UTC), False
    day = datetime.fromisoformat(value["date"]).replace(tzinfo=tz)
    return day.astimezone(UTC), True


def google_event(item: dict[str, Any], cal: CalendarRow, tz: ZoneInfo) -> Event:
    start, all_day = _google_time(item["start"], tz)
    end, _ = _google_time(item["end"], tz)
    attendees = tuple(
        Attendee(a["email"].lower(), a.get("displayName", ""), a.get("responseStatus", "needsAction").lower())
        for a in item.get("attendees", ())
        if not a.get("self")
    )
    organizer = item.get("organizer", {})
    me = next((a for a in item.get("attendees", ()) if a.get("self")), None)
    return Event(
        ref=f"{cal.ref}:{item['id']}",
        calendar=cal.name,
        kind="google",
        title=item.get("summary", "(no title)"),
        start=start,
        end=end,
        all_day=all_day,
        location=item.get("location"),
        attendees=attendees,
        recurring="recurringEventId" in item or "recurrence" in item,
        busy=item.get("transparency", "opaque") != "transparent",
        organizer=None if organizer.get("self") else organizer.get("email"),
        extra={
            "id": item["id"],
            "recurringEventId": item.get("recurringEventId"),
            # The person's own answer (their attendee entry is left out of ``attendees``).
            "self_status": str(me.get("responseStatus", "")).lower() if me else None,
        },
    )


def google_path(cal: CalendarRow, event_id: str | None = None) -> str:
    base = f"/calendar/v3/calendars/{httpx.URL(cal.remote or 'primary').raw_path.decode()}/events"
    return base if event_id is None else f"{base}/{event_id}"


async def google_events(
    db: Queries, connectors: Connectors, cal: CalendarRow, start: datetime, end: datetime, tz: ZoneInfo
) -> list[Event]:
    client = GoogleClient(db, connectors, cal.connection_id)  # type: ignore[arg-type]
    events: list[Event] = []
    page: str | None = None
    try:
        for _ in range(20):
            params = {
                "timeMin": start.astimezone(UTC).isoformat(),
                "timeMax": end.astimezone(UTC).isoformat(),
                "singleEvents": "true",
                "orderBy": "startTime",
                "maxResults": "2500",
            }
            if page:
                params["pageToken"] = page
            body = await client.call("GET", google_path(cal), params=params)
            events += [google_event(i, cal, tz) for i in body.get("items", ()) if i.get("status") != "cancelled"]
            page = body.get("nextPageToken")
            if not page:
                break
    except GoogleError as exc:
        raise CalendarUnavailable(f"Google Calendar could not be read ({exc.message})", code=exc.code) from exc
    return events


def new_uid() -> str:
    return f"{uuid4()}@pepper"


def one_hour() -> timedelta:
    return timedelta(hours=1)


__all__ = ["CalendarRow", "PepperError"]
