"""Occurrences in the store (``task_runs``): materialize the due ones, claim them with leases, leave
receipts; and each run's keyed deliveries (``task_deliveries``).

Every process runs the same statements against one Postgres; the database coordinates them:

* ``materialize`` turns each active task's due occurrences into ``task_runs`` rows, under
  ``FOR UPDATE SKIP LOCKED`` on the task; ``UNIQUE (task_id, occurrence_at)`` makes a second
  insert of the same occurrence a no-op, so no occurrence is ever doubled;
* ``claim`` takes due rows with ``FOR UPDATE SKIP LOCKED`` and sets a lease (owner, expiry);
  a row whose lease expired (its process died) is claimable again. ``ready_at`` is when a row
  can next be claimed (its due time, then its lease's expiry), so claims scan only ready rows;
* ``extend_lease`` is the heartbeat; ``finish`` and ``release`` only touch a row whose lease the
  caller still holds (a fence against a process that lost its lease while paused).

Times come from the caller's clock (``now``), so tests can move it, and all processes must keep
their clocks in step (NTP), as any lease scheme needs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from core.metrics import metrics
from core.scheduling.schedule import Place, Schedule, ScheduleError
from core.store.pool import transaction
from core.store.queries import Queries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """One claimed occurrence with what running it needs."""

    run_id: int
    task_id: int
    account_id: UUID
    kind: str
    title: str
    prompt: str
    deliver_to: tuple[str, ...]
    timezone: str
    occurrence_at: datetime
    attempts: int
    task_status: str


def _schedule(row: Any) -> Schedule:
    record = row["schedule"]
    return Schedule.from_record(json.loads(record) if isinstance(record, str) else record)


async def materialize(
    db: Queries, now: datetime, *, window: timedelta, batch: int = 200, missed_limit: int = 200
) -> int:
    """Record the occurrences of active tasks that are due by ``now``; returns how many tasks moved.

    Per task, of the occurrences between its ``next_run_at`` and ``now``: the newest one within
    the catch-up ``window`` becomes due (it runs once); the others get a ``missed`` receipt,
    saying whether a later run superseded them or they were older than the window. The task's
    ``next_run_at`` moves past ``now`` (a one-shot task is marked done).
    """
    moved = 0
    added: dict[str, int] = {"due": 0, "missed": 0, "failed": 0}
    async with transaction(db) as conn:
        rows = await conn.fetch(
            """
            SELECT t.*, coalesce(t.timezone, a.timezone) AS zone, p.latitude, p.longitude
            FROM scheduled_tasks t
            JOIN accounts a ON a.id = t.account_id
            LEFT JOIN account_places p ON p.account_id = t.account_id
            WHERE t.status = 'active' AND t.next_run_at <= $1
            ORDER BY t.next_run_at
            LIMIT $2
            FOR UPDATE OF t SKIP LOCKED
            """,
            now,
            batch,
        )
        for row in rows:
            moved += 1
            await _materialize_task(conn, row, now, window, missed_limit, added)
    counted = metrics()  # once committed: a rolled-back batch made nothing due
    if added["due"]:
        counted.scheduled_due.inc(added["due"])
    for status in ("missed", "failed"):
        if added[status]:
            counted.scheduled_runs.labels(status).inc(added[status])
    return moved


async def _materialize_task(
    conn: Queries, row: Any, now: datetime, window: timedelta, missed_limit: int, added: dict[str, int]
) -> None:
    task_id, zone = row["id"], row["zone"]
    place = Place(row["latitude"], row["longitude"]) if row["latitude"] is not None else None
    first = row["next_run_at"]
    try:
        schedule = _schedule(row)
        occurrences = [first, *schedule.occurrences(first, now, zone, place, limit=missed_limit)]
        following = schedule.next_after(max(now, occurrences[-1]), zone, place)
    except (ScheduleError, KeyError, ValueError) as exc:
        log.warning("task schedule cannot be computed; pausing it: task=%s error=%s", task_id, type(exc).__name__)
        await _insert_run(
            conn, task_id, first, first, "failed", f"the schedule could not be computed: {exc}", now, added
        )
        await conn.execute("UPDATE scheduled_tasks SET next_run_at = NULL WHERE id = $1", task_id)
        return
    if len(occurrences) > missed_limit and following is not None and following <= now:
        # A very long outage of a frequent task: the receipts above say what was missed; skip ahead.
        following = schedule.next_after(now, zone, place)
    fresh = [o for o in occurrences if o >= now - window]
    runs = fresh[-1:]
    for occ in occurrences:
        if occ in runs:
            due = occ + timedelta(seconds=row["offset_seconds"])
            await _insert_run(conn, task_id, occ, due, "due", None, now, added)
        elif occ >= now - window:
            await _insert_run(
                conn, task_id, occ, occ, "missed", f"superseded by the run for {runs[0].isoformat()}", now, added
            )
        else:
            await _insert_run(
                conn, task_id, occ, occ, "missed", "Pepper was not running within the catch-up window", now, added
            )
    if following is None:
        await conn.execute("UPDATE scheduled_tasks SET next_run_at = NULL, status = 'done' WHERE id = $1", task_id)
    else:
        await conn.execute("UPDATE scheduled_tasks SET next_run_at = $2 WHERE id = $1", task_id, following)


async def _insert_run(
    conn: Queries, task_id: int, occurrence: datetime, due: datetime, status: str, reason: str | None, now: datetime,
    added: dict[str, int],
) -> None:  # fmt: skip
    finished = now if status in ("missed", "failed") else None
    result = await conn.execute(
        """
        INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at, status, reason, finished_at)
        VALUES ($1, $2, $3, $3, $4, $5, $6)
        ON CONFLICT (task_id, occurrence_at) DO NOTHING
        """,
        task_id,
        occurrence,
        due,
        status,
        reason,
        finished,
    )
    if result.endswith(" 1"):
        added[status] += 1


async def expire_stale(db: Queries, now: datetime, *, window: timedelta) -> int:
    """Occurrences that never started and are now older than the catch-up window become missed."""
    result = await db.execute(
        """
        UPDATE task_runs SET status = 'missed', finished_at = $1,
            reason = 'not started within the catch-up window'
        WHERE status = 'due' AND attempts = 0 AND due_at < $1::timestamptz - $2::interval
        """,
        now,
        window,
    )
    expired = int(result.split()[-1])
    if expired:
        metrics().scheduled_runs.labels("missed").inc(expired)
    return expired


async def claim(db: Queries, owner: str, now: datetime, *, lease: timedelta, limit: int) -> list[Claim]:
    """Claim up to ``limit`` due occurrences for ``owner`` with a lease until ``now + lease``."""
    if limit <= 0:
        return []
    rows = await db.fetch(
        """
        WITH picked AS (
            SELECT id FROM task_runs
            WHERE status IN ('due', 'running') AND ready_at <= $2
            ORDER BY ready_at, id
            LIMIT $4
            FOR UPDATE SKIP LOCKED
        ), taken AS (
            UPDATE task_runs r
            SET status = 'running', lease_owner = $1, lease_expires_at = $2::timestamptz + $3::interval,
                ready_at = $2::timestamptz + $3::interval, heartbeat_at = $2, attempts = r.attempts + 1,
                started_at = coalesce(r.started_at, $2)
            FROM picked WHERE r.id = picked.id
            RETURNING r.id, r.task_id, r.occurrence_at, r.attempts
        )
        SELECT taken.*, t.account_id, t.kind, t.title, t.prompt, t.deliver_to,
               coalesce(t.timezone, a.timezone) AS zone, t.status AS task_status
        FROM taken
        JOIN scheduled_tasks t ON t.id = taken.task_id
        JOIN accounts a ON a.id = t.account_id
        """,
        owner,
        now,
        lease,
        limit,
    )
    if rows:
        metrics().scheduled_claimed.inc(len(rows))
    return [
        Claim(
            run_id=r["id"],
            task_id=r["task_id"],
            account_id=r["account_id"],
            kind=r["kind"],
            title=r["title"],
            prompt=r["prompt"],
            deliver_to=tuple(r["deliver_to"] or ()),
            timezone=r["zone"],
            occurrence_at=r["occurrence_at"],
            attempts=r["attempts"],
            task_status=r["task_status"],
        )
        for r in rows
    ]


async def extend_lease(db: Queries, run_id: int, owner: str, now: datetime, *, lease: timedelta) -> bool:
    """The heartbeat. False when the lease is no longer ours (it expired and another took it)."""
    result = await db.execute(
        """
        UPDATE task_runs
        SET lease_expires_at = $3::timestamptz + $4::interval, ready_at = $3::timestamptz + $4::interval,
            heartbeat_at = $3
        WHERE id = $1 AND lease_owner = $2 AND status = 'running'
        """,
        run_id,
        owner,
        now,
        lease,
    )
    return result.endswith(" 1")


async def set_turn(db: Queries, run_id: int, owner: str, turn_id: UUID) -> None:
    await db.execute("UPDATE task_runs SET turn_id = $3 WHERE id = $1 AND lease_owner = $2", run_id, owner, turn_id)


async def finish(
    db: Queries,
    run_id: int,
    owner: str,
    now: datetime,
    *,
    status: str,
    reason: str | None = None,
    evidence: dict[str, Any] | None = None,
    turn_id: UUID | None = None,
) -> bool:
    """Leave the receipt; False when the lease was lost (another process owns the run now)."""
    result = await db.execute(
        """
        UPDATE task_runs
        SET status = $3, reason = $4, evidence = $5::jsonb, turn_id = coalesce($6, turn_id), finished_at = $7,
            lease_owner = NULL, lease_expires_at = NULL
        WHERE id = $1 AND lease_owner = $2 AND status = 'running'
        """,
        run_id,
        owner,
        status,
        reason,
        json.dumps(evidence) if evidence is not None else None,
        turn_id,
        now,
    )
    finished = result.endswith(" 1")
    if finished:
        metrics().scheduled_runs.labels(status).inc()
    return finished


async def release(
    db: Queries, run_id: int, owner: str, *, due_at: datetime, reason: str | None, count_attempt: bool = True
) -> bool:
    """Give a claimed run back: due again at ``due_at`` (a retry, or now after a graceful stop)."""
    result = await db.execute(
        """
        UPDATE task_runs
        SET status = 'due', due_at = $3, ready_at = $3, reason = $4, lease_owner = NULL, lease_expires_at = NULL,
            attempts = attempts - CASE WHEN $5 THEN 0 ELSE 1 END
        WHERE id = $1 AND lease_owner = $2 AND status = 'running'
        """,
        run_id,
        owner,
        due_at,
        reason,
        count_attempt,
    )
    return result.endswith(" 1")


async def run_now(db: Queries, task_id: int, account_id: UUID, now: datetime) -> int | None:
    """An extra occurrence of the account's active task, due now (the web app's "run now"); its
    run id, or None when there is no such task or one of its runs is already due or running
    (a second press runs nothing twice). The scheduler claims it like any other."""
    run_id = await db.fetchval(
        """
        INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at, status, reason)
        SELECT t.id, $3::timestamptz, $3, $3, 'due', 'run now'
        FROM scheduled_tasks t
        WHERE t.id = $1 AND t.account_id = $2 AND t.status = 'active'
          AND NOT EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = t.id AND r.status IN ('due', 'running')
                          AND r.ready_at <= $3::timestamptz + interval '1 minute')
        ON CONFLICT (task_id, occurrence_at) DO NOTHING
        RETURNING id
        """,
        task_id,
        account_id,
        now,
    )
    if run_id is not None:
        metrics().scheduled_due.inc()
    return run_id


async def recent_receipts(db: Queries, task_id: int, limit: int = 5) -> list[Any]:
    return await db.fetch(
        """
        SELECT id, occurrence_at, status, reason, evidence, attempts, finished_at FROM task_runs
        WHERE task_id = $1 ORDER BY occurrence_at DESC LIMIT $2
        """,
        task_id,
        limit,
    )


async def delivered_earlier(db: Queries, run_id: int) -> bool:
    """Whether an earlier attempt of the run delivered (or queued) its result on some channel."""
    rows = await db.fetch(
        "SELECT channel FROM task_deliveries WHERE run_id = $1 AND status IN ('delivered', 'queued')", run_id
    )
    return bool(rows)


async def claim_delivery(db: Queries, key: str, run_id: int, channel: str, attempt: int) -> bool:
    """Take the delivery ``key`` for this attempt: False when it is already handled (delivered, queued,
    or being sent by this or a later attempt), so it is not sent again."""
    row = await db.fetchrow(
        """
        INSERT INTO task_deliveries (key, run_id, channel, status, attempt) VALUES ($1, $2, $3, 'sending', $4)
        ON CONFLICT (key) DO UPDATE SET status = 'sending', attempt = excluded.attempt, updated_at = now()
        WHERE task_deliveries.status IN ('sending', 'failed', 'unavailable')
          AND task_deliveries.attempt < excluded.attempt
        RETURNING key
        """,
        key,
        run_id,
        channel,
        attempt,
    )
    return row is not None


async def delivery_status(db: Queries, key: str) -> Any:
    """The delivery's status (``delivered``, ``queued``, ``sending``...), None for an unknown key."""
    return await db.fetchval("SELECT status FROM task_deliveries WHERE key = $1", key)


async def record_delivery(
    db: Queries, key: str, status: str, detail: str | None, provider_message_id: str | None
) -> None:
    await db.execute(
        """
        UPDATE task_deliveries SET status = $2, detail = $3, provider_message_id = $4, updated_at = now()
        WHERE key = $1
        """,
        key,
        status,
        detail,
        provider_message_id,
    )
