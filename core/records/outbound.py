"""Calls Pepper places, as recorded (``outbound_calls``, migration 0210): one row per attempt, with
its receipt; the status callbacks already acted on (``outbound_call_events``); and the strangers
who texted STOP to a line (``line_opt_outs``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def add_attempt(
    db: Queries,
    *,
    account_id: UUID,
    task_id: int | None,
    run_id: int | None,
    delivery_key: str | None,
    purpose: str,
    attempt: int,
    to_number: str,
    from_number: str,
    owner_number: bool,
    brief: str,
    dial_at: datetime,
) -> int | None:
    """A new attempt, due at ``dial_at``; None when this delivery already has that attempt."""
    return await db.fetchval(
        """
        INSERT INTO outbound_calls (account_id, task_id, run_id, delivery_key, purpose, attempt, to_number,
                                    from_number, owner_number, brief, dial_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
        ON CONFLICT (delivery_key, attempt) DO NOTHING RETURNING id
        """,
        account_id,
        task_id,
        run_id,
        delivery_key,
        purpose,
        attempt,
        to_number,
        from_number,
        owner_number,
        brief,
        dial_at,
    )


async def claim_due(db: Queries, now: datetime, limit: int) -> list[Any]:
    """Take attempts due by ``now`` (status ``dialing``), each by one process only."""
    return await db.fetch(
        """
        WITH picked AS (
            SELECT id FROM outbound_calls WHERE status = 'due' AND dial_at <= $1
            ORDER BY dial_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
        )
        UPDATE outbound_calls o SET status = 'dialing', updated_at = now()
        FROM picked WHERE o.id = picked.id RETURNING o.*
        """,
        now,
        limit,
    )


async def claim_one(db: Queries, attempt_id: int) -> Any:
    """Take one due attempt (dialled at once, as it was made); None when another process took it."""
    return await db.fetchrow(
        "UPDATE outbound_calls SET status = 'dialing', updated_at = now() WHERE id = $1 AND status = 'due' RETURNING *",
        attempt_id,
    )


async def placed(db: Queries, attempt_id: int, call_sid: str, requested_at: datetime) -> None:
    await db.execute(
        "UPDATE outbound_calls SET status = 'placed', call_sid = $2, requested_at = $3, updated_at = now()"
        " WHERE id = $1",
        attempt_id,
        call_sid,
        requested_at,
    )


async def settle(db: Queries, attempt_id: int, *, status: str, outcome: str, receipt: str) -> None:
    await db.execute(
        "UPDATE outbound_calls SET status = $2, outcome = $3, receipt = $4, updated_at = now() WHERE id = $1",
        attempt_id,
        status,
        outcome,
        receipt,
    )


async def settle_answered(db: Queries, attempt_id: int, *, outcome: str, receipt: str) -> bool:
    """Settle an attempt a person answered, unless its call's own end settled it meanwhile (that
    one knows more: whether the brief was given). True when this settled it."""
    settled = await db.fetchval(
        "UPDATE outbound_calls SET status = 'done', outcome = $2, receipt = $3, updated_at = now()"
        " WHERE id = $1 AND status = 'answered' RETURNING true",
        attempt_id,
        outcome,
        receipt,
    )
    return bool(settled)


async def answered(db: Queries, call_sid: str, answered_by: str, outcome: str, receipt: str) -> None:
    await db.execute(
        "UPDATE outbound_calls SET status = 'answered', answered_by = $2, outcome = $3, receipt = $4,"
        " updated_at = now() WHERE call_sid = $1",
        call_sid,
        answered_by,
        outcome,
        receipt,
    )


async def by_sid(db: Queries, call_sid: str) -> Any:
    return await db.fetchrow("SELECT * FROM outbound_calls WHERE call_sid = $1", call_sid)


async def first_event(db: Queries, call_sid: str, event: str) -> bool:
    """Record a status callback; False when it was acted on already (a retry)."""
    inserted = await db.fetchval(
        "INSERT INTO outbound_call_events (call_sid, event) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING true",
        call_sid,
        event,
    )
    return bool(inserted)


async def approved_number(db: Queries, task_id: int, account_id: UUID) -> str | None:
    return await db.fetchval(
        "SELECT call_number FROM scheduled_tasks WHERE id = $1 AND account_id = $2", task_id, account_id
    )


async def set_call_number(db: Queries, task_id: int, number: str | None, *, approved: bool) -> None:
    """The number the task calls; ``approved`` only when the owner set it (never a scheduled run)."""
    await db.execute(
        "UPDATE scheduled_tasks SET call_number = $2, call_approved = $3 WHERE id = $1", task_id, number, approved
    )


async def attempts_of_task(db: Queries, task_id: int, limit: int = 10) -> list[Any]:
    return await db.fetch(
        "SELECT * FROM outbound_calls WHERE task_id = $1 ORDER BY created_at DESC, attempt DESC LIMIT $2",
        task_id,
        limit,
    )


async def recent(db: Queries, account_id: UUID | None, limit: int = 20) -> list[Any]:
    """Recent calls, inbound and placed, newest first: the ``calls`` rows with any attempt's receipt."""
    return await db.fetch(
        """
        SELECT c.call_sid, c.route, c.status, c.caller, c.line_number, c.started_at, c.ended_at, c.end_reason,
               c.verified_by, o.to_number, o.outcome, o.receipt, o.attempt, o.task_id
        FROM calls c LEFT JOIN outbound_calls o ON o.call_sid = c.call_sid
        WHERE $1::uuid IS NULL OR c.account_id = $1
        UNION ALL
        SELECT o.call_sid, 'outbound', o.status, NULL, o.from_number, o.created_at, NULL, NULL, NULL,
               o.to_number, o.outcome, o.receipt, o.attempt, o.task_id
        FROM outbound_calls o
        WHERE ($1::uuid IS NULL OR o.account_id = $1)
          AND (o.call_sid IS NULL OR NOT EXISTS (SELECT 1 FROM calls c WHERE c.call_sid = o.call_sid))
        ORDER BY started_at DESC LIMIT $2
        """,
        account_id,
        limit,
    )


async def line_opted_out(db: Queries, line_number: str, number: str) -> bool:
    found = await db.fetchval("SELECT 1 FROM line_opt_outs WHERE line_number = $1 AND number = $2", line_number, number)
    return bool(found)


async def set_line_opt_out(db: Queries, line_number: str, number: str, *, opted_out: bool) -> None:
    if opted_out:
        await db.execute(
            "INSERT INTO line_opt_outs (line_number, number) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            line_number,
            number,
        )
    else:
        await db.execute("DELETE FROM line_opt_outs WHERE line_number = $1 AND number = $2", line_number, number)


async def task_call_target(db: Queries, task_id: int, account_id: UUID) -> Any:
    """The task's ``call_number`` and whether the owner approved it, or None for no such task."""
    return await db.fetchrow(
        "SELECT call_number, call_approved FROM scheduled_tasks WHERE id = $1 AND account_id = $2",
        task_id,
        account_id,
    )


async def attempt_of(db: Queries, delivery_key: str | None, attempt: int) -> Any:
    return await db.fetchrow(
        "SELECT * FROM outbound_calls WHERE delivery_key = $1 AND attempt = $2", delivery_key, attempt
    )


async def attempts_like(db: Queries, row: Any) -> list[Any]:
    """Every attempt of the delivery ``row`` (an ``outbound_calls`` row) belongs to, in order."""
    if row["delivery_key"] is None:
        return [row]
    return await db.fetch("SELECT * FROM outbound_calls WHERE delivery_key = $1 ORDER BY attempt", row["delivery_key"])


async def run_of(db: Queries, task_id: int, occurrence_at: datetime) -> int | None:
    return await db.fetchval(
        "SELECT id FROM task_runs WHERE task_id = $1 AND occurrence_at = $2", task_id, occurrence_at
    )


async def call_row(db: Queries, call_sid: str) -> Any:
    return await db.fetchrow("SELECT * FROM calls WHERE call_sid = $1", call_sid)


async def attempts_of_run(db: Queries, run_id: int) -> list[Any]:
    """The call attempts of one scheduled run, in order (its receipts)."""
    return await db.fetch("SELECT * FROM outbound_calls WHERE run_id = $1 ORDER BY attempt", run_id)


async def task_digits(db: Queries, task_id: int) -> str | None:
    """Keys Twilio presses once the task's call connects (``SendDigits``: a menu, an extension)."""
    return await db.fetchval("SELECT call_digits FROM scheduled_tasks WHERE id = $1", task_id)


async def set_call_digits(db: Queries, task_id: int, digits: str | None) -> None:
    await db.execute("UPDATE scheduled_tasks SET call_digits = $2 WHERE id = $1", task_id, digits)
