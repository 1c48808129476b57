"""Pepper's own calendar, in Postgres: events, series and their exceptions, free/busy and booking."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from core.store.queries import Queries
from core.tools.areas.calendar.model import Attendee, Busy, Event
from core.tools.areas.calendar.recurrence import occurrences, series_end

STAMP = "%Y%m%dT%H%M%SZ"
_STAMP_RE = re.compile(r"\d{8}T\d{6}Z")


def short(calendar_id: UUID) -> str:
    return calendar_id.hex[:8]


def occurrence_ref(base: str, original: datetime) -> str:
    return f"{base}@{original.astimezone(UTC):{STAMP}}"


def split_ref(ref: str) -> tuple[str, str, datetime | None]:
    """(calendar short id, event key, original occurrence start or None)."""
    text = ref.strip()
    head, sep, occ = text.rpartition("@")
    when = None
    if sep and _STAMP_RE.fullmatch(occ):
        when = datetime.strptime(occ, STAMP).replace(tzinfo=UTC)
    else:
        head = text
    cal, _, key = head.partition(":")
    if not cal or not key:
        raise ValueError("an event ref looks like 1a2b3c4d:KEY (from list_events)")
    return cal, key, when


async def ensure_pepper_calendar(db: Queries, account_id: UUID) -> UUID:
    found = await db.fetchval("SELECT id FROM calendars WHERE account_id = $1 AND kind = 'pepper'", account_id)
    if found is not None:
        return found
    return await db.fetchval(
        """
        INSERT INTO calendars (account_id, kind, name) VALUES ($1, 'pepper', 'Pepper')
        ON CONFLICT (account_id) WHERE kind = 'pepper' DO UPDATE SET name = calendars.name
        RETURNING id
        """,
        account_id,
    )


def _attendees(raw: Any) -> tuple[Attendee, ...]:
    items = json.loads(raw) if isinstance(raw, str) else (raw or [])
    return tuple(Attendee(a["email"], a.get("name", ""), a.get("status", "needs-action")) for a in items)


_COLUMNS = (
    "id, calendar_id, uid, title, location, starts_at, ends_at, tzid, rrule, exdates, series_id, recurrence_of,"
    " attendees, busy, sequence"
)


def _event(row: Any, start: datetime, end: datetime, name: str, original: datetime | None = None) -> Event:
    base = f"{short(row['calendar_id'])}:{row['id'].hex}"
    ref = occurrence_ref(base, original) if original is not None else base
    return Event(
        ref=ref,
        calendar=name,
        kind="pepper",
        title=row["title"],
        start=start,
        end=end,
        location=row["location"],
        attendees=_attendees(row["attendees"]),
        recurring=row["rrule"] is not None or row["series_id"] is not None,
        busy=row["busy"],
        extra={"id": row["id"], "uid": row["uid"], "sequence": row["sequence"], "original": original},
    )


async def own_rows(db: Queries, account_id: UUID, start: datetime, end: datetime) -> tuple[list[Any], list[Any]]:
    """(single events overlapping the window, series that may), confirmed only."""
    singles = await db.fetch(
        f"""
        SELECT {_COLUMNS} FROM calendar_events
        WHERE account_id = $1 AND rrule IS NULL AND status = 'confirmed'
          AND tstzrange(starts_at, ends_at) && tstzrange($2, $3)
        ORDER BY starts_at
        """,
        account_id,
        start,
        end,
    )
    series = await db.fetch(
        f"""
        SELECT {_COLUMNS} FROM calendar_events
        WHERE account_id = $1 AND rrule IS NOT NULL AND status = 'confirmed'
          AND starts_at < $3 AND (series_until IS NULL OR series_until > $2)
        """,
        account_id,
        start,
        end,
    )
    return list(singles), list(series)


async def own_events(
    db: Queries, account_id: UUID, start: datetime, end: datetime, name: str = "Pepper"
) -> list[Event]:
    singles, series = await own_rows(db, account_id, start, end)
    events = [_event(r, r["starts_at"], r["ends_at"], name, r["recurrence_of"]) for r in singles]
    for row in series:
        for s, e in occurrences(
            row["starts_at"], row["ends_at"], row["tzid"], row["rrule"], start, end, row["exdates"]
        ):
            events.append(_event(row, s, e, name, s))
    events.sort(key=lambda ev: (ev.start, ev.title))
    return events


async def own_busy(db: Queries, account_id: UUID, start: datetime, end: datetime) -> list[Busy]:
    singles, series = await own_rows(db, account_id, start, end)
    out = [Busy(r["starts_at"], r["ends_at"]) for r in singles if r["busy"]]
    for row in series:
        if row["busy"]:
            out.extend(
                Busy(s, e)
                for s, e in occurrences(
                    row["starts_at"], row["ends_at"], row["tzid"], row["rrule"], start, end, row["exdates"]
                )
            )
    return out


async def own_event(db: Queries, account_id: UUID, key: str) -> Any:
    try:
        event_id = UUID(hex=key)
    except ValueError:
        return None
    return await db.fetchrow(
        f"SELECT {_COLUMNS}, status FROM calendar_events WHERE id = $1 AND account_id = $2", event_id, account_id
    )


async def insert_event(
    conn: Queries,
    account_id: UUID,
    calendar_id: UUID,
    *,
    title: str,
    start: datetime,
    end: datetime,
    tzid: str,
    rrule: str | None = None,
    location: str | None = None,
    description: str | None = None,
    attendees: list[dict[str, str]] | None = None,
    uid: str | None = None,
    series_id: UUID | None = None,
    recurrence_of: datetime | None = None,
    booking_key: str | None = None,
) -> UUID:
    until = series_end(start, end, tzid, rrule) if rrule else None
    return await conn.fetchval(
        """
        INSERT INTO calendar_events (account_id, calendar_id, uid, title, location, description, starts_at, ends_at,
                                     tzid, rrule, series_until, attendees, series_id, recurrence_of, booking_key)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15)
        RETURNING id
        """,
        account_id,
        calendar_id,
        uid or f"{uuid4()}@pepper",
        title,
        location,
        description,
        start,
        end,
        tzid,
        rrule,
        until,
        json.dumps(attendees or []),
        series_id,
        recurrence_of,
        booking_key,
    )
