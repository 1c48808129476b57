"""A source that opted in (``write_to_calendar``) has its events copied into the person's own
calendar: the one named for it (``write_calendar_id``), else the primary connected one (Google's
primary calendar, else the first CalDAV calendar), else Pepper's own calendar as the fallback.

Every check ends with :func:`sync` (after the source's events are stored): a copy is written for
each active event, rewritten when the event moved or changed, deleted when the event is hidden or
cancelled, the source stops writing, or the copies go to another calendar. Remote ids are chosen
by Pepper (``core.tools.areas.calendar.copies.copy_id``) and mapped in ``follow_copies`` before
the remote call, so a re-run (after a lost answer too) never makes a second copy. A remote
failure stops that calendar's writes for this check and is returned, to be recorded with the
check and shown by ``pepper follow list``; the next check retries what is left.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, PepperError
from core.following import store
from core.following.store import Follow
from core.store.pool import transaction
from core.store.queries import Queries
from core.tools.areas.calendar.copies import WRITABLE, Copy, copy_id, delete_copy, put_copy
from core.tools.areas.calendar.sources import CalendarRow, calendars, find_calendar

log = logging.getLogger(__name__)


@dataclass
class Synced:
    calendar: str | None = None
    written: int = 0
    updated: int = 0
    removed: int = 0
    error: str | None = None

    def words(self) -> str:
        parts = [f"{n} {w}" for n, w in ((self.written, "written"), (self.updated, "updated"),
                                         (self.removed, "removed")) if n]  # fmt: skip
        return f"calendar copies: {', '.join(parts)}" if parts else ""


async def choose_calendar(db: Queries, account_id: UUID, name: str) -> CalendarRow:
    """The calendar a person named for a source's copies; a read-only feed is refused."""
    cal = await find_calendar(db, account_id, name)
    if cal.read_only or cal.kind not in (*WRITABLE, "pepper"):
        raise InvalidInput(f"{cal.name} is a read-only calendar; copies go to Google, CalDAV or Pepper's calendar")
    return cal


async def target(db: Queries, follow: Follow) -> CalendarRow | None:
    """Where the follow's copies go now; None when it does not write."""
    if not follow.write_to_calendar:
        return None
    rows = await calendars(db, follow.account_id)  # Pepper's own first
    named = next((r for r in rows if r.id == follow.write_calendar_id), None)
    if named is not None and not named.read_only:
        return named
    remote = [r for r in rows if r.kind in WRITABLE and not r.read_only]
    primary = [r for r in remote if r.kind == "google" and r.remote == "primary"]
    return (primary or remote or rows)[0]


def _written(row: Any) -> str:
    return json.dumps([row["title"], row["starts_at"].isoformat(), row["ends_at"].isoformat(), row["all_day"],
                       row["location"]])  # fmt: skip


async def sync(db: Queries, connectors: Any, follow: Follow) -> Synced:
    """Bring the follow's copies in step with its events (see the module's docstring)."""
    cal = await target(db, follow)
    if cal is None and not await _leftovers(db, follow):  # most checks: one read, nothing to do
        return Synced()
    if cal is not None and cal.kind == "pepper":  # Pepper's own calendar: the fallback, in the database
        async with transaction(db) as conn:
            await store.mirror(conn, follow)
    else:
        await store.unmirror(db, follow)
    remote = cal if cal is not None and cal.kind in WRITABLE else None
    done = Synced(remote.name if remote else None)
    copies = await db.fetch(
        "SELECT id, event_id, calendar_id, remote_id, written FROM follow_copies WHERE follow_id = $1 ORDER BY id",
        follow.id,
    )
    if remote is None and not copies:
        return done
    if connectors is None:
        done.error = "the calendar cannot be reached from here (no connection settings)"
        return done
    events = await db.fetch(
        "SELECT id, title, starts_at, ends_at, all_day, location FROM followed_events"
        " WHERE follow_id = $1 AND status = 'active' ORDER BY starts_at, id",
        follow.id,
    )
    wanted = {e["id"]: e for e in events} if remote is not None else {}
    stale = [c for c in copies if remote is None or c["calendar_id"] != remote.id or c["event_id"] not in wanted]
    removed, error = await _remove(db, connectors, follow.account_id, stale)
    done.removed, done.error = removed, error
    if remote is None:
        return done
    mine = {c["event_id"]: c for c in copies if c["calendar_id"] == remote.id and c["event_id"] in wanted}
    tz = await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", follow.account_id) or "UTC"
    for event_id, ev in wanted.items():
        written = _written(ev)
        row = mine.get(event_id)
        if row is not None and row["written"] == written:
            continue
        if row is None:  # mapped before the remote call: a retry finds the same id
            remote_id = copy_id(remote.id, f"{follow.id}:{event_id}")
            copy_row = await db.fetchval(
                """
                INSERT INTO follow_copies (account_id, follow_id, event_id, calendar_id, remote_id)
                VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (calendar_id, remote_id) DO UPDATE SET event_id = EXCLUDED.event_id RETURNING id
                """,
                follow.account_id, follow.id, event_id, remote.id, remote_id,
            )  # fmt: skip
        else:
            remote_id, copy_row = row["remote_id"], row["id"]
        note = f"Followed: {follow.title} (copied by Pepper; no invitations)"
        copy = Copy(ev["title"], ev["starts_at"], ev["ends_at"], ev["all_day"], ev["location"], note, tz,
                    f"{follow.id}:{event_id}")  # fmt: skip
        try:
            await put_copy(db, connectors, remote, remote_id, copy)
        except PepperError as exc:
            log.warning("follow copy not written: follow=%s calendar=%s error=%s", follow.id, remote.kind, exc.code)
            done.error = f"{remote.name}: {exc.message}"
            break  # the calendar is failing: the rest waits for the next check
        await db.execute("UPDATE follow_copies SET written = $2, updated_at = now() WHERE id = $1", copy_row, written)
        if row is None or row["written"] is None:
            done.written += 1
        else:
            done.updated += 1
    return done


async def _leftovers(db: Queries, follow: Follow) -> bool:
    """Copies of a source that does not write (any more): in Pepper's calendar or a connected one."""
    return await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM follow_copies WHERE follow_id = $1) OR EXISTS (SELECT 1 FROM calendar_events"
        " WHERE account_id = $2 AND booking_key LIKE $3 AND status <> 'cancelled')",
        follow.id, follow.account_id, f"follow:{follow.id}:%",
    )  # fmt: skip


async def _remove(db: Queries, connectors: Any, account_id: UUID, rows: list[Any]) -> tuple[int, str | None]:
    """Delete these copies from their calendars (and their rows once deleted there)."""
    if not rows:
        return 0, None
    cals = {c.id: c for c in await calendars(db, account_id)}
    removed, error = 0, None
    failing: set[UUID] = set()
    for row in rows:
        cal = cals.get(row["calendar_id"])
        if cal is None or row["calendar_id"] in failing:
            continue
        try:
            await delete_copy(db, connectors, cal, row["remote_id"])
        except PepperError as exc:
            log.warning("follow copy not deleted: calendar=%s error=%s", cal.kind, exc.code)
            error, failing = f"{cal.name}: {exc.message}", failing | {row["calendar_id"]}
            continue
        await db.execute("DELETE FROM follow_copies WHERE id = $1", row["id"])
        removed += 1
    return removed, error


async def sweep(
    db: Queries, connectors: Any, account_id: UUID | None = None, limit: int = 50
) -> tuple[int, str | None]:
    """Delete the copies of follows that were removed (the rows stay until their calendar agrees)."""
    rows = await db.fetch(
        "SELECT id, account_id, event_id, calendar_id, remote_id FROM follow_copies"
        " WHERE (follow_id IS NULL OR event_id IS NULL) AND ($1::uuid IS NULL OR account_id = $1) ORDER BY id LIMIT $2",
        account_id, limit,
    )  # fmt: skip
    if not rows or connectors is None:
        return 0, None
    removed, error = 0, None
    for account in {r["account_id"] for r in rows}:
        n, err = await _remove(db, connectors, account, [r for r in rows if r["account_id"] == account])
        removed, error = removed + n, error or err
    return removed, error


async def orphans(db: Queries, account_id: UUID) -> int:
    """Copies of removed follows still waiting to be deleted from their calendars."""
    return await db.fetchval(
        "SELECT count(*) FROM follow_copies WHERE account_id = $1 AND (follow_id IS NULL OR event_id IS NULL)",
        account_id,
    )
