"""What is followed, each check of it, and the events it gives, in Postgres (migration 0171).

Checks are leased like the scheduler's runs: ``claim_due`` takes due rows ``FOR UPDATE SKIP
LOCKED`` and sets a lease; ``finish`` only touches a row whose lease the caller still holds, so a
process that lost its lease while paused cannot overwrite a newer check.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from core.following.match import Stored, pair
from core.following.model import SourceEvent
from core.store.queries import Queries

KINDS = ("page", "calendar", "feed", "team", "show")
KEEP_CHECKS = 50


@dataclass(frozen=True)
class Follow:
    id: int
    account_id: UUID
    kind: str
    target: str
    title: str
    write_to_calendar: bool
    calendar_id: UUID | None
    feed_id: int | None
    etag: str | None
    modified: str | None
    fingerprint: str | None
    versions: int
    failures: int
    write_calendar_id: UUID | None = None  # the calendar named for its copies (None: the primary connected one)
    copy_failures: int = 0


_FOLLOW = ("id, account_id, kind, target, title, write_to_calendar, calendar_id, feed_id, etag, modified, fingerprint,"
           " versions, failures, write_calendar_id, copy_failures")  # fmt: skip


def _follow(row: Any) -> Follow:
    return Follow(**{k: row[k] for k in Follow.__dataclass_fields__})


async def add(
    db: Queries, account_id: UUID, kind: str, target: str, title: str, *, write_to_calendar: bool = False,
    calendar_id: UUID | None = None, feed_id: int | None = None, write_calendar_id: UUID | None = None,
) -> tuple[Follow, bool]:  # fmt: skip
    """The follow, and whether it is new: the same source twice is one follow (its settings kept)."""
    row = await db.fetchrow(
        f"""
        INSERT INTO follows (account_id, kind, target, title, write_to_calendar, calendar_id, feed_id,
                             write_calendar_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        ON CONFLICT (account_id, kind, target) DO UPDATE SET title = follows.title
        RETURNING {_FOLLOW}, (xmax = 0) AS created
        """,
        account_id, kind, target, title[:200], write_to_calendar or write_calendar_id is not None, calendar_id,
        feed_id, write_calendar_id,
    )  # fmt: skip
    return _follow(row), bool(row["created"])


async def find(db: Queries, account_id: UUID, kind: str, target: str) -> Follow | None:
    row = await db.fetchrow(
        f"SELECT {_FOLLOW} FROM follows WHERE account_id = $1 AND kind = $2 AND target = $3", account_id, kind, target
    )
    return None if row is None else _follow(row)


async def set_writing(
    db: Queries, account_id: UUID, follow_id: int, write: bool, calendar_id: UUID | None = None
) -> Follow | None:
    """Opt a source in (into ``calendar_id``, or the primary connected calendar) or out; due now,
    so the next check writes or removes its copies."""
    row = await db.fetchrow(
        f"""
        UPDATE follows SET write_to_calendar = $3, write_calendar_id = $4, next_check_at = now()
        WHERE id = $1 AND account_id = $2 RETURNING {_FOLLOW}
        """,
        follow_id, account_id, write, calendar_id if write else None,
    )  # fmt: skip
    return None if row is None else _follow(row)


async def get(db: Queries, follow_id: int) -> Follow | None:
    row = await db.fetchrow(f"SELECT {_FOLLOW} FROM follows WHERE id = $1", follow_id)
    return None if row is None else _follow(row)


async def listing(db: Queries, account_id: UUID) -> list[Any]:
    """Each follow with its last check and its shown events; failures in a row counted."""
    return list(
        await db.fetch(
            """
            SELECT f.id, f.kind, f.target, f.title, f.write_to_calendar, f.last_checked_at, f.last_status,
                   f.last_detail, f.failures, f.next_check_at, f.copy_failures, f.copy_error,
                   (SELECT c.name FROM calendars c WHERE c.id = f.write_calendar_id) AS write_calendar,
                   (SELECT count(*) FROM follow_copies k WHERE k.follow_id = f.id AND k.written IS NOT NULL) AS copied,
                   (SELECT string_agg(DISTINCT c.name, ', ') FROM follow_copies k JOIN calendars c
                     ON c.id = k.calendar_id WHERE k.follow_id = f.id AND k.written IS NOT NULL) AS copied_to,
                   (SELECT count(*) FROM followed_events e WHERE e.follow_id = f.id AND e.status <> 'hidden') AS shown,
                   (SELECT count(*) FROM followed_events e WHERE e.follow_id = f.id AND e.status = 'hidden') AS hidden
            FROM follows f WHERE f.account_id = $1 ORDER BY f.id
            """,
            account_id,
        )
    )


async def remove(db: Queries, account_id: UUID, follow_id: int) -> str | None:
    """Stop following (its events and checks go with it; a calendar feed's calendar too). Its
    copies in a connected calendar keep their rows, unmapped, until ``copies.sweep`` deletes them there."""
    row = await db.fetchrow(
        "DELETE FROM follows WHERE id = $1 AND account_id = $2 RETURNING title, calendar_id, feed_id",
        follow_id,
        account_id,
    )
    if row is None:
        return None
    if row["calendar_id"] is not None:
        await db.execute("DELETE FROM calendars WHERE id = $1 AND kind = 'ical'", row["calendar_id"])
    if row["feed_id"] is not None:
        await db.execute("DELETE FROM feeds WHERE id = $1 AND account_id = $2", row["feed_id"], account_id)
    await db.execute(
        "DELETE FROM calendar_events WHERE account_id = $1 AND booking_key LIKE $2", account_id, f"follow:{follow_id}:%"
    )
    return str(row["title"])


async def add_calendar_feed(db: Queries, account_id: UUID, url: str, name: str) -> UUID:
    """The read-only iCalendar calendar a followed feed shows as (the calendar area lists it)."""
    return await db.fetchval(
        """
        INSERT INTO calendars (account_id, kind, name, remote, read_only, counts_busy)
        VALUES ($1, 'ical', $2, $3, true, false)
        ON CONFLICT (account_id, kind, remote) WHERE remote IS NOT NULL DO UPDATE SET name = calendars.name
        RETURNING id
        """,
        account_id,
        name[:200],
        url,
    )


async def add_news_feed(db: Queries, account_id: UUID, url: str, title: str) -> int:
    """The feeds area's row for a followed RSS or Atom feed (``read_feeds`` reads its items)."""
    return await db.fetchval(
        """
        INSERT INTO feeds (account_id, url, title) VALUES ($1, $2, $3)
        ON CONFLICT (account_id, url) DO UPDATE SET title = feeds.title RETURNING id
        """,
        account_id,
        url,
        title[:200],
    )


# --- checks, leased -------------------------------------------------------------------------


async def claim_due(db: Queries, owner: str, now: datetime, *, lease: timedelta, limit: int) -> list[Follow]:
    rows = await db.fetch(
        f"""
        UPDATE follows SET lease_owner = $1, lease_expires_at = $2::timestamptz + $3::interval
        WHERE id IN (
            SELECT id FROM follows
            WHERE next_check_at <= $2 AND (lease_expires_at IS NULL OR lease_expires_at <= $2)
            ORDER BY next_check_at, id LIMIT $4 FOR UPDATE SKIP LOCKED
        )
        RETURNING {_FOLLOW}
        """,
        owner, now, lease, limit,
    )  # fmt: skip
    return [_follow(r) for r in rows]


async def claim_now(
    db: Queries, owner: str, now: datetime, account_id: UUID, follow_id: int | None, *, lease: timedelta
) -> list[Follow]:
    """Claim one person's follows (or one of them) to check now, due or not; a follow another
    process is checking (its lease still held) is left to it."""
    rows = await db.fetch(
        f"""
        UPDATE follows SET lease_owner = $1, lease_expires_at = $2::timestamptz + $3::interval
        WHERE id IN (
            SELECT id FROM follows
            WHERE account_id = $4 AND ($5::bigint IS NULL OR id = $5)
              AND (lease_expires_at IS NULL OR lease_expires_at <= $2)
            ORDER BY id FOR UPDATE SKIP LOCKED
        )
        RETURNING {_FOLLOW}
        """,
        owner, now, lease, account_id, follow_id,
    )  # fmt: skip
    return sorted((_follow(r) for r in rows), key=lambda f: f.id)


@dataclass
class Outcome:
    """One check's result: ``changed`` / ``unchanged`` (304) / ``fingerprint-equal`` / ``failed``."""

    status: str
    detail: str = ""
    events: int | None = None
    model_calls: int = 0
    etag: str | None = None
    modified: str | None = None
    fingerprint: str | None = None
    calendar_error: str | None = None  # the copies into the person's calendar failed: why


async def finish(db: Queries, follow: Follow, owner: str, now: datetime, outcome: Outcome, next_at: datetime) -> bool:
    """Record the check and release the lease; False when the lease was no longer ours."""
    failed = outcome.status == "failed"
    kept = await db.fetchval(
        """
        UPDATE follows SET lease_owner = NULL, lease_expires_at = NULL, next_check_at = $4,
            last_checked_at = $3, last_status = $5, last_detail = $6,
            failures = CASE WHEN $7 THEN failures + 1 ELSE 0 END,
            etag = CASE WHEN $7 THEN etag ELSE coalesce($8, etag) END,
            modified = CASE WHEN $7 THEN modified ELSE coalesce($9, modified) END,
            fingerprint = coalesce($10, fingerprint),
            versions = versions + CASE WHEN $5 = 'changed' THEN 1 ELSE 0 END,
            copy_failures = CASE WHEN $11::text IS NULL THEN 0 ELSE copy_failures + 1 END, copy_error = $11
        WHERE id = $1 AND lease_owner = $2
        RETURNING id
        """,
        follow.id, owner, now, next_at, outcome.status, outcome.detail[:500], failed,
        outcome.etag, outcome.modified, outcome.fingerprint, _cut(outcome.calendar_error),
    )  # fmt: skip
    if kept is None:
        return False
    await db.execute(
        "INSERT INTO follow_checks (follow_id, checked_at, status, events, model_calls, detail, calendar_error)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        follow.id, now, outcome.status, outcome.events, outcome.model_calls, outcome.detail[:500],
        _cut(outcome.calendar_error),
    )  # fmt: skip
    await db.execute(  # the last KEEP_CHECKS per follow are enough to say how it has been going
        "DELETE FROM follow_checks WHERE follow_id = $1 AND id < (SELECT min(id) FROM"
        " (SELECT id FROM follow_checks WHERE follow_id = $1 ORDER BY id DESC LIMIT $2) kept)",
        follow.id, KEEP_CHECKS,
    )  # fmt: skip
    return True


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:500]


async def recent_checks(db: Queries, follow_id: int, limit: int = 5) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT checked_at, status, events, model_calls, detail, calendar_error FROM follow_checks"
            " WHERE follow_id = $1"
            " ORDER BY id DESC LIMIT $2",
            follow_id,
            limit,
        )
    )


# --- events -----------------------------------------------------------------------------------


@dataclass
class Applied:
    added: int = 0
    updated: int = 0
    cancelled: int = 0
    missed: int = 0
    hidden: int = 0

    def words(self) -> str:
        parts = [f"{n} {w}" for n, w in ((self.added, "new"), (self.updated, "updated"), (self.cancelled, "cancelled"),
                                         (self.missed, "left out"), (self.hidden, "hidden")) if n]  # fmt: skip
        return ", ".join(parts) or "no change to the events"


async def apply_events(conn: Queries, follow: Follow, events: list[SourceEvent], *, hide_after: int = 2) -> Applied:
    """Bring the stored events in step with a changed version of the source.

    Events pair by the source's own id when it has one, else by title and nearest date
    (:func:`core.following.match.pair`). A stored event this version leaves out counts a miss; at
    ``hide_after`` misses in a row it is hidden. Nothing is deleted; a hidden event that comes
    back is shown again. Cancelled only when the source says so.
    """
    rows = await conn.fetch(
        "SELECT id, source_key, title, starts_at, ends_at, location, quote, status, missed FROM followed_events"
        " WHERE follow_id = $1 ORDER BY starts_at, id FOR UPDATE",
        follow.id,
    )
    by_id = {r["id"]: r for r in rows}
    done = Applied()
    keyed = {r["source_key"]: r for r in rows if r["source_key"]}
    pairs: list[tuple[SourceEvent, Any]] = []
    fresh: list[SourceEvent] = []
    loose: list[SourceEvent] = []
    for ev in events:
        if ev.key is not None:
            (pairs.append((ev, keyed[ev.key])) if ev.key in keyed else fresh.append(ev))
        else:
            loose.append(ev)
    unkeyed = [Stored(r["id"], r["title"], r["starts_at"]) for r in rows if not r["source_key"]]
    paired = pair([(ev.title, ev.start) for ev in loose], unkeyed)
    pairs += [(loose[i], by_id[s.id]) for i, s in paired.pairs]
    fresh += [loose[i] for i in paired.new]
    seen = {row["id"] for _, row in pairs}
    for ev, row in pairs:
        status = "cancelled" if ev.cancelled else "active"
        changed = (row["title"], row["starts_at"], row["ends_at"], row["location"], row["status"], row["quote"]) != (
            ev.title, ev.start, ev.end, ev.location, status, ev.quote)  # fmt: skip
        if changed:
            done.updated += status != "cancelled" or row["status"] == "cancelled"
            done.cancelled += status == "cancelled" and row["status"] != "cancelled"
        await conn.execute(
            """
            UPDATE followed_events SET title = $2, starts_at = $3, ends_at = $4, all_day = $5, location = $6,
                quote = $7, status = $8, missed = 0, updated_at = CASE WHEN $9 THEN now() ELSE updated_at END
            WHERE id = $1
            """,
            row["id"], ev.title, ev.start, ev.end, ev.all_day, ev.location, ev.quote, status, changed,
        )  # fmt: skip
    for ev in fresh:
        await conn.execute(
            """
            INSERT INTO followed_events (follow_id, account_id, source_key, title, starts_at, ends_at, all_day,
                                         location, quote, status)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            """,
            follow.id, follow.account_id, ev.key, ev.title, ev.start, ev.end, ev.all_day, ev.location, ev.quote,
            "cancelled" if ev.cancelled else "active",
        )  # fmt: skip
        done.added += 1
    for row in rows:
        if row["id"] in seen or row["status"] == "hidden":
            continue
        if row["source_key"]:
            continue  # a structured source lists what is coming: a past fixture leaving its list is not a miss
        hide = row["missed"] + 1 >= hide_after
        await conn.execute(
            "UPDATE followed_events SET missed = missed + 1, status = CASE WHEN $2 THEN 'hidden' ELSE status END,"
            " updated_at = now() WHERE id = $1",
            row["id"], hide,
        )  # fmt: skip
        done.hidden += hide
        done.missed += not hide
    return done


async def mirror(conn: Queries, follow: Follow) -> None:
    """The source opted in and no Google or CalDAV calendar takes its copies
    (``core.following.copies``): its events as events of Pepper's own calendar, without attendees
    (so no invitation ever goes out); a hidden or cancelled one is cancelled there."""
    calendar_id = await conn.fetchval("SELECT id FROM calendars WHERE account_id = $1 AND kind = 'pepper'",
                                      follow.account_id)  # fmt: skip
    if calendar_id is None:
        calendar_id = await conn.fetchval(
            "INSERT INTO calendars (account_id, kind, name) VALUES ($1, 'pepper', 'Pepper')"
            " ON CONFLICT (account_id) WHERE kind = 'pepper' DO UPDATE SET name = calendars.name RETURNING id",
            follow.account_id,
        )
    tz = await conn.fetchval("SELECT timezone FROM accounts WHERE id = $1", follow.account_id) or "UTC"
    await conn.execute(
        """
        INSERT INTO calendar_events (account_id, calendar_id, uid, title, location, description, starts_at, ends_at,
                                     tzid, attendees, busy, booking_key)
        SELECT e.account_id, $2, 'follow-' || e.id || '@pepper', e.title, e.location, $4, e.starts_at, e.ends_at,
               $3, '[]'::jsonb, false, 'follow:' || e.follow_id || ':' || e.id
        FROM followed_events e WHERE e.follow_id = $1 AND e.status = 'active'
        ON CONFLICT (account_id, booking_key) WHERE booking_key IS NOT NULL DO UPDATE
            SET title = EXCLUDED.title, location = EXCLUDED.location, starts_at = EXCLUDED.starts_at,
                ends_at = EXCLUDED.ends_at, status = 'confirmed', updated_at = now()
        """,
        follow.id, calendar_id, tz, f"Followed: {follow.title}",
    )  # fmt: skip
    await conn.execute(
        """
        UPDATE calendar_events c SET status = 'cancelled', updated_at = now()
        FROM followed_events e
        WHERE c.account_id = $2 AND c.booking_key = 'follow:' || e.follow_id || ':' || e.id
          AND e.follow_id = $1 AND e.status <> 'active' AND c.status <> 'cancelled'
        """,
        follow.id, follow.account_id,
    )  # fmt: skip


async def unmirror(conn: Queries, follow: Follow) -> None:
    """The source's copies in Pepper's own calendar cancelled: it stopped writing, or its copies go
    to a connected calendar now."""
    await conn.execute(
        "UPDATE calendar_events SET status = 'cancelled', updated_at = now()"
        " WHERE account_id = $1 AND booking_key LIKE $2 AND status <> 'cancelled'",
        follow.account_id, f"follow:{follow.id}:%",
    )  # fmt: skip


async def agenda(db: Queries, account_id: UUID, start: datetime, end: datetime) -> list[Any]:
    """Followed events shown in the agenda in [start, end): not hidden, and not those with a copy
    in one of the person's calendars (they show from there, once)."""
    return list(
        await db.fetch(
            """
            SELECT e.id, e.title, e.starts_at, e.ends_at, e.all_day, e.location, e.status, f.id AS follow_id,
                   f.title AS source
            FROM followed_events e JOIN follows f ON f.id = e.follow_id
            WHERE e.account_id = $1 AND e.status <> 'hidden' AND e.starts_at < $3 AND e.ends_at > $2
              AND NOT EXISTS (SELECT 1 FROM calendar_events c WHERE c.account_id = e.account_id
                              AND c.booking_key = 'follow:' || e.follow_id || ':' || e.id AND c.status = 'confirmed')
              AND NOT EXISTS (SELECT 1 FROM follow_copies k WHERE k.event_id = e.id AND k.written IS NOT NULL)
            ORDER BY e.starts_at, e.id
            """,
            account_id,
            start,
            end,
        )
    )
