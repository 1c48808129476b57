"""The records of phone calls (``calls``, ``answering_calls``, ``answering_holds``,
``answering_deliveries``): plain functions over a :class:`~core.store.queries.Queries`."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from core.store.queries import Queries

# --- The voice webhook --------------------------------------------------------------------------


async def record_call(
    db: Queries,
    call_sid: str,
    *,
    account_id: UUID | None,
    line_number: str | None,
    caller: str | None,
    handle_id: UUID | None,
    route: str,
    attested: bool,
) -> bool:
    """A new call, ``ringing`` on the owner's route, else ``refused``; False when it was recorded
    already (a retried webhook)."""
    inserted = await db.fetchval(
        """
        INSERT INTO calls (call_sid, account_id, line_number, caller, handle_id, route, status, attested)
        VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 = 'owner' THEN 'ringing' ELSE 'refused' END, $7)
        ON CONFLICT (call_sid) DO NOTHING RETURNING true
        """,
        call_sid,
        account_id,
        line_number,
        caller,
        handle_id,
        route,
        attested,
    )
    return bool(inserted)


async def call_state(db: Queries, call_sid: str) -> Any:
    """The call's ``route``, ``status`` and ``ended_at``, or None."""
    return await db.fetchrow("SELECT route, status, ended_at FROM calls WHERE call_sid = $1", call_sid)


async def end_reason(db: Queries, call_sid: str) -> str | None:
    return await db.fetchval("SELECT end_reason FROM calls WHERE call_sid = $1", call_sid)


# --- The media socket ---------------------------------------------------------------------------


async def call_for_stream(db: Queries, call_sid: str) -> Any:
    """What admitting a media stream needs of its call, or None."""
    return await db.fetchrow(
        "SELECT account_id, handle_id, caller, line_number, route, attested, status, ended_at FROM calls"
        " WHERE call_sid = $1",
        call_sid,
    )


async def line_engine(db: Queries, line_number: str) -> str | None:
    """The voice engine a phone line names, or None for the default one."""
    return await db.fetchval("SELECT voice_engine FROM phone_lines WHERE number = $1", line_number)


# --- A call under way ---------------------------------------------------------------------------


async def account_timezone(db: Queries, account_id: UUID) -> str:
    return await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id)


async def call_started(db: Queries, call_sid: str, turn_id: UUID, holder: int | None) -> None:
    await db.execute(
        "UPDATE calls SET status = 'in-progress', turn_id = $2, held_by = $3 WHERE call_sid = $1",
        call_sid,
        turn_id,
        holder,
    )


async def store_end_reason(db: Queries, call_sid: str, reason: str | None) -> None:
    await db.execute("UPDATE calls SET end_reason = $2 WHERE call_sid = $1", call_sid, reason)


async def call_completed(
    db: Queries, call_sid: str, *, reason: str | None, summary: str, verified_by: str | None, stats: dict[str, Any]
) -> None:
    await db.execute(
        """
        UPDATE calls SET status = 'completed', ended_at = now(), end_reason = $2, summary = $3,
                         verified_by = $4, stats = $5::jsonb
        WHERE call_sid = $1
        """,
        call_sid,
        reason,
        summary,
        verified_by,
        json.dumps(stats),
    )


async def call_message_ids(db: Queries, conversation_id: UUID, turn_id: UUID | None, call_sid: str) -> list[Any]:
    """The messages of this call in the person's conversation: its turn's, and the caller's lines."""
    rows = await db.fetch(
        "SELECT id FROM messages WHERE conversation_id = $1 AND (turn_id = $2 OR provider_message_id LIKE $3)",
        conversation_id,
        turn_id,
        f"{call_sid}:%",
    )
    return [r["id"] for r in rows]


# --- Answering calls ----------------------------------------------------------------------------


async def lock_answering_screen(conn: Queries, account_id: UUID) -> None:
    """One screening at a time per owner, until the transaction ends."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('answering-screen:' || $1::uuid::text, 0))", account_id
    )


async def recent_answering_calls(conn: Queries, account_id: UUID, caller: str | None) -> int:
    """Answering calls from this caller ID (None: every withheld one) in the last hour."""
    return await conn.fetchval(
        "SELECT count(*) FROM answering_calls WHERE account_id = $1 AND caller IS NOT DISTINCT FROM $2"
        " AND started_at > now() - interval '1 hour'",
        account_id,
        caller,
    )


async def recent_line_answering_calls(conn: Queries, account_id: UUID, line: str | None) -> int:
    """Answering calls on this line in the last hour."""
    return await conn.fetchval(
        "SELECT count(*) FROM calls WHERE account_id = $1 AND line_number IS NOT DISTINCT FROM $2"
        " AND route = 'answering' AND started_at > now() - interval '1 hour'",
        account_id,
        line,
    )


async def record_answering_call(
    conn: Queries,
    call_sid: str,
    *,
    account_id: UUID,
    line_number: str | None,
    verdict: str,
    caller: str | None,
    forwarded_from: str | None,
    vip: bool,
) -> bool:
    """A screened call: ``ringing`` when answered, else ``refused`` on route ``verdict``, with its
    ``answering_calls`` row when answered; False when it was recorded already."""
    inserted = await conn.fetchval(
        """
        INSERT INTO calls (call_sid, account_id, line_number, route, status)
        VALUES ($1, $2, $3, $4, CASE WHEN $4 = 'answering' THEN 'ringing' ELSE 'refused' END)
        ON CONFLICT (call_sid) DO NOTHING RETURNING true
        """,
        call_sid,
        account_id,
        line_number,
        verdict,
    )
    if inserted and verdict == "answering":
        await conn.execute(
            """
            INSERT INTO answering_calls (call_sid, account_id, caller, forwarded_from, vip)
            VALUES ($1, $2, $3, $4, $5) ON CONFLICT (call_sid) DO NOTHING
            """,
            call_sid,
            account_id,
            caller,
            forwarded_from,
            vip,
        )
    return bool(inserted)


async def answering_caller(db: Queries, call_sid: str) -> Any:
    """The ``caller`` and ``vip`` of an answering call, or None."""
    return await db.fetchrow("SELECT caller, vip FROM answering_calls WHERE call_sid = $1", call_sid)


async def append_answering_transcript(db: Queries, call_sid: str, line: dict[str, Any]) -> None:
    await db.execute(
        "UPDATE answering_calls SET transcript = transcript || $2::jsonb WHERE call_sid = $1",
        call_sid,
        json.dumps([line]),
    )


async def release_unbooked_holds(db: Queries, call_sid: str) -> None:
    """The call's holds on slots no booking took."""
    await db.execute(
        "DELETE FROM answering_holds h WHERE h.call_sid = $1"
        " AND NOT EXISTS (SELECT 1 FROM answering_bookings b WHERE b.booking_key = h.booking_key)",
        call_sid,
    )


async def answering_call_ended(db: Queries, call_sid: str, *, reason: str | None, summary: str) -> None:
    """The call's holds released, its end recorded, and its owner's notice due now."""
    await db.execute("DELETE FROM answering_holds WHERE call_sid = $1", call_sid)
    await db.execute(
        "UPDATE answering_calls SET ended_at = now(), end_reason = $2, summary = $3 WHERE call_sid = $1",
        call_sid,
        reason,
        summary,
    )
    await db.execute(
        "UPDATE answering_deliveries SET due_at = now() WHERE call_sid = $1 AND kind = 'owner_notice'"
        " AND status = 'pending' AND due_at > now()",
        call_sid,
    )
