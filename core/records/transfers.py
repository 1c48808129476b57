"""Callers handed to the owner (``call_transfers``, migration 0210; ``voice.transfer``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def request(
    db: Queries, call_sid: str, account_id: UUID, *, to_number: str, caller_id: str, caller_name: str, reason: str
) -> bool:
    """Record that the call is to be handed on; False when it already was (once per call)."""
    inserted = await db.fetchval(
        """
        INSERT INTO call_transfers (call_sid, account_id, to_number, caller_id, caller_name, reason)
        VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (call_sid) DO NOTHING RETURNING true
        """,
        call_sid,
        account_id,
        to_number,
        caller_id,
        caller_name,
        reason,
    )
    return bool(inserted)


async def take_pending(db: Queries, call_sid: str) -> Any:
    """The call's transfer, now dialling; None when there is none waiting (once only)."""
    return await db.fetchrow(
        "UPDATE call_transfers SET status = 'dialing', updated_at = now() WHERE call_sid = $1 AND status = 'pending'"
        " RETURNING *",
        call_sid,
    )


async def get(db: Queries, call_sid: str) -> Any:
    return await db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", call_sid)


async def dialled(db: Queries, call_sid: str, *, status: str, dial_status: str) -> Any:
    """The ``<Dial>`` ended (``connected`` or ``returned``); None unless it was dialling (a retry)."""
    return await db.fetchrow(
        "UPDATE call_transfers SET status = $2, dial_status = $3, updated_at = now()"
        " WHERE call_sid = $1 AND status = 'dialing' RETURNING *",
        call_sid,
        status,
        dial_status,
    )


async def first_leg_recorded(db: Queries, call_sid: str) -> bool:
    """Whether the call engine has written the end of the call's stream so far (its summary)."""
    return bool(await db.fetchval("SELECT summary IS NOT NULL FROM calls WHERE call_sid = $1", call_sid))


async def reopen_call(db: Queries, call_sid: str) -> None:
    """The caller comes back to Pepper on the same call: its records take a second stream (the
    minutes of the first were counted when it ended; ``started_at`` moves so they are not again)."""
    await db.execute(
        "UPDATE calls SET status = 'ringing', ended_at = NULL, summary = NULL, end_reason = NULL, held_by = NULL,"
        " started_at = now() WHERE call_sid = $1",
        call_sid,
    )
    await db.execute("UPDATE answering_calls SET ended_at = NULL, summary = NULL WHERE call_sid = $1", call_sid)


async def transfer_enabled(db: Queries, account_id: UUID) -> bool:
    """Whether the owner lets callers who ask be put through (``pepper answering set --transfer``)."""
    return bool(await db.fetchval("SELECT transfer_enabled FROM answering_settings WHERE account_id = $1", account_id))


async def whisper_context(db: Queries, call_sid: str) -> Any:
    """The handed-on call's ``route`` and, for a call Pepper placed, its task's ``title`` (what the
    whisper tells the owner); None for an unknown call."""
    return await db.fetchrow(
        """
        SELECT c.route, t.title FROM calls c
        LEFT JOIN outbound_calls o ON o.call_sid = c.call_sid
        LEFT JOIN scheduled_tasks t ON t.id = o.task_id
        WHERE c.call_sid = $1
        """,
        call_sid,
    )


async def referred(db: Queries, call_sid: str) -> Any:
    """The call's transfer, handed on by a SIP REFER (SIP direct); None when none was waiting."""
    return await db.fetchrow(
        "UPDATE call_transfers SET status = 'referred', dial_status = 'refer', updated_at = now()"
        " WHERE call_sid = $1 AND status = 'pending' RETURNING *",
        call_sid,
    )


async def refer_failed(db: Queries, call_sid: str) -> None:
    """The REFER for the call was refused or never reached OpenAI: the call was hung up instead."""
    await db.execute(
        "UPDATE call_transfers SET dial_status = 'refer-failed', updated_at = now() WHERE call_sid = $1", call_sid
    )
