"""The answering service's records about a call and its owner: the owner's settings
(``answering_settings``), the calls (``answering_calls``), the message a caller left
(``answering_messages``) and what is to be sent for them (``answering_deliveries``).

Bookings and the holds taken while a booking is confirmed are in ``core.records.answering_bookings``.
"""

from __future__ import annotations

import enum
import json
from datetime import timedelta
from typing import Any
from uuid import UUID

from core.records import calls
from core.store.queries import Queries

# --- The owner's settings -------------------------------------------------------------------------


async def owner(db: Queries, account_id: UUID) -> Any:
    """The account's ``name`` and ``timezone``; None for an unknown account."""
    return await db.fetchrow("SELECT name, timezone FROM accounts WHERE id = $1", account_id)


async def settings(db: Queries, account_id: UUID) -> Any:
    """The owner's ``answering_settings`` row; None when they never set any."""
    return await db.fetchrow("SELECT * FROM answering_settings WHERE account_id = $1", account_id)


async def save_settings(
    db: Queries,
    account_id: UUID,
    *,
    greeting: str,
    caller_info: str,
    booking_enabled: bool,
    appointment_types: str,
    working_hours: str,
    buffer_minutes: int,
    min_notice_minutes: int,
    horizon_days: int,
    vip_numbers: list[str],
    blocked_numbers: list[str],
    notify_channel: str,
    send_invitations: bool,
    max_calls_per_hour: int,
    max_line_calls_per_hour: int,
    max_texts_per_hour: int,
    sms_countries: list[str],
) -> None:
    """Insert or replace the owner's settings; ``appointment_types`` and ``working_hours`` are JSON."""
    await db.execute(
        """
        INSERT INTO answering_settings (account_id, greeting, caller_info, booking_enabled, appointment_types,
            working_hours, buffer_minutes, min_notice_minutes, horizon_days, vip_numbers, blocked_numbers,
            notify_channel, send_invitations, max_calls_per_hour, max_line_calls_per_hour, max_texts_per_hour,
            sms_countries)
        VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
        ON CONFLICT (account_id) DO UPDATE SET greeting = $2, caller_info = $3, booking_enabled = $4,
            appointment_types = $5::jsonb, working_hours = $6::jsonb, buffer_minutes = $7, min_notice_minutes = $8,
            horizon_days = $9, vip_numbers = $10, blocked_numbers = $11, notify_channel = $12,
            send_invitations = $13, max_calls_per_hour = $14, max_line_calls_per_hour = $15,
            max_texts_per_hour = $16, sms_countries = $17, updated_at = now()
        """,
        account_id,
        greeting,
        caller_info,
        booking_enabled,
        appointment_types,
        working_hours,
        buffer_minutes,
        min_notice_minutes,
        horizon_days,
        vip_numbers,
        blocked_numbers,
        notify_channel,
        send_invitations,
        max_calls_per_hour,
        max_line_calls_per_hour,
        max_texts_per_hour,
        sms_countries,
    )


async def notify_channel(db: Queries, account_id: UUID) -> str | None:
    """Where the owner wants to hear about callers; None when they never chose."""
    return await db.fetchval("SELECT notify_channel FROM answering_settings WHERE account_id = $1", account_id)


# --- Calls ----------------------------------------------------------------------------------------


async def recent_calls(db: Queries, account_id: UUID, limit: int = 20) -> list[Any]:
    """The account's latest answering calls, newest first."""
    return await db.fetch(
        "SELECT * FROM answering_calls WHERE account_id = $1 ORDER BY started_at DESC LIMIT $2", account_id, limit
    )


async def call_of(db: Queries, call_sid: str, account_id: UUID) -> Any:
    """The answering call, only when it is the account's; None otherwise."""
    return await db.fetchrow(
        "SELECT * FROM answering_calls WHERE call_sid = $1 AND account_id = $2", call_sid, account_id
    )


async def call_transcript(db: Queries, call_sid: str) -> Any:
    """The call's ``transcript`` (JSON lines) and ``summary``; None for an unknown call."""
    return await db.fetchrow("SELECT transcript, summary FROM answering_calls WHERE call_sid = $1", call_sid)


# --- The message a caller left --------------------------------------------------------------------


async def save_message(
    db: Queries, call_sid: str, account_id: UUID, *, caller_name: str, callback_number: str, reason: str,
    urgency: str, vip: bool,
) -> None:  # fmt: skip
    """The call's message; a repeat replaces it (announced again only when what it says changed)."""
    await db.execute(
        """
        INSERT INTO answering_messages (call_sid, account_id, caller_name, callback_number, reason, urgency, vip)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (call_sid) DO UPDATE SET caller_name = $3, callback_number = $4, reason = $5, urgency = $6,
            notified_at = CASE WHEN answering_messages.reason = $5 AND answering_messages.urgency = $6
                               THEN answering_messages.notified_at END
        """,
        call_sid, account_id, caller_name, callback_number, reason, urgency, vip,
    )  # fmt: skip


async def message_of(db: Queries, call_sid: str) -> Any:
    """The message left on the call, None when there is none."""
    return await db.fetchrow("SELECT * FROM answering_messages WHERE call_sid = $1", call_sid)


async def claim_message_notice(db: Queries, call_sid: str) -> Any:
    """Mark the call's message announced, if it was not: the message, or None when there is none
    to announce (no message, or announced already)."""
    return await db.fetchrow(
        """
        UPDATE answering_messages SET notified_at = now() WHERE call_sid = $1 AND notified_at IS NULL
        RETURNING id, account_id, caller_name, callback_number, reason, urgency, vip, callback_promised
        """,
        call_sid,
    )


async def notice_trying(db: Queries, message_id: int, channel: str) -> None:
    """The channel the owner's notice of a message is about to be tried on."""
    await db.execute("UPDATE answering_messages SET notify_channel = $2 WHERE id = $1", message_id, channel)


async def notice_result(db: Queries, message_id: int, channel: str, error: str | None) -> None:
    """The channel the owner's notice of a message went by, and what failed on the way (None: nothing)."""
    await db.execute(
        "UPDATE answering_messages SET notify_channel = $2, notify_error = $3 WHERE id = $1",
        message_id,
        channel,
        error,
    )


# --- Deliveries: texts to callers and the owner's notices ----------------------------------------


async def claim_due_deliveries(db: Queries, *, stale: timedelta, limit: int) -> list[Any]:
    """Take up to ``limit`` deliveries due now (and those left ``sending`` longer than ``stale``),
    each by one claimer (``FOR UPDATE SKIP LOCKED``), counting the attempt."""
    return await db.fetch(
        """
        UPDATE answering_deliveries SET status = 'sending', claimed_at = now(), attempts = attempts + 1
        WHERE id IN (
            SELECT id FROM answering_deliveries
            WHERE (status = 'pending' AND due_at <= now()) OR (status = 'sending' AND claimed_at < now() - $1::interval)
            ORDER BY due_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
        RETURNING *
        """,
        stale,
        limit,
    )


async def delivery_failed(db: Queries, delivery_id: int, *, final: bool, error: str, retry_after: timedelta) -> None:
    """A failed attempt: given up (``failed``) when ``final``, else due again after ``retry_after``."""
    await db.execute(
        "UPDATE answering_deliveries SET status = $2, error = $3, due_at = now() + $4::interval WHERE id = $1",
        delivery_id,
        "failed" if final else "pending",
        error,
        retry_after,
    )


async def delivery_sent(db: Queries, delivery_id: int) -> None:
    await db.execute("UPDATE answering_deliveries SET status = 'sent', sent_at = now() WHERE id = $1", delivery_id)


async def texts_this_hour(db: Queries, line: str) -> int:
    """Texts recorded for callers from ``line`` in the last hour (the per-line cap counts these)."""
    return await db.fetchval(
        "SELECT count(*) FROM answering_deliveries WHERE kind = 'caller_text' AND from_number = $1"
        " AND created_at > now() - interval '1 hour'",
        line,
    )


async def record_owner_notice(db: Queries, account_id: UUID, call_sid: str, *, now: bool) -> None:
    """The owner's notice about this call, recorded for the turn workers to send: due now (a VIP's
    message), else when the call ends (``AnsweringProfile.finish`` makes it due), at the latest in
    an hour if the call's end was never recorded; a notice already pending keeps the earlier time."""
    await db.execute(
        """
        INSERT INTO answering_deliveries (account_id, call_sid, kind, due_at)
        VALUES ($1, $2, 'owner_notice', CASE WHEN $3 THEN now() ELSE now() + interval '1 hour' END)
        ON CONFLICT (call_sid) WHERE kind = 'owner_notice' AND status = 'pending'
        DO UPDATE SET due_at = least(answering_deliveries.due_at, excluded.due_at)
        """,
        account_id,
        call_sid,
        now,
    )


async def record_caller_text(db: Queries, account_id: UUID, call_sid: str, *, to: str, line: str, body: str) -> None:
    """A text to a caller, from ``line``, for the turn workers to send now."""
    await db.execute(
        "INSERT INTO answering_deliveries (account_id, call_sid, kind, to_number, from_number, body)"
        " VALUES ($1, $2, 'caller_text', $3, $4, $5)",
        account_id, call_sid, to, line, body,
    )  # fmt: skip


# --- Answering calls ----------------------------------------------------------------------------


class Unset(enum.Enum):
    """An argument left out (None is a value here: a withheld caller ID, a call with no line)."""

    UNSET = "unset"


UNSET = Unset.UNSET


async def lock_answering_screen(conn: Queries, account_id: UUID) -> None:
    """One screening at a time per owner, until the transaction ends."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('answering-screen:' || $1::uuid::text, 0))", account_id
    )


async def recent_answering_calls(
    conn: Queries, account_id: UUID, *, caller: str | Unset | None = UNSET, line: str | Unset | None = UNSET
) -> int:
    """Answering calls in the last hour: from this caller ID (None: every withheld one), on this
    line, or both; an argument left out does not narrow the count."""
    return await conn.fetchval(
        "SELECT count(*) FROM calls c JOIN answering_calls a USING (call_sid)"
        " WHERE c.account_id = $1 AND c.route = 'answering' AND c.started_at > now() - interval '1 hour'"
        " AND ($2 OR a.caller IS NOT DISTINCT FROM $3) AND ($4 OR c.line_number IS NOT DISTINCT FROM $5)",
        account_id,
        isinstance(caller, Unset),
        None if isinstance(caller, Unset) else caller,
        isinstance(line, Unset),
        None if isinstance(line, Unset) else line,
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
    inserted = await calls.record_call(
        conn,
        call_sid,
        account_id=account_id,
        line_number=line_number,
        caller=None,  # the caller ID is kept on the answering_calls row
        handle_id=None,
        route=verdict,
        attested=False,
        answered_route="answering",
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


async def set_transfer_enabled(db: Queries, account_id: UUID, enabled: bool) -> None:
    """Whether callers may be put through to the owner (the settings row exists: ``save_settings``)."""
    await db.execute("UPDATE answering_settings SET transfer_enabled = $2 WHERE account_id = $1", account_id, enabled)


async def caller_signals(db: Queries, call_sid: str) -> Any:
    """The call's caller ID and what Twilio Lookup said of it (``line_type``, ``caller_name_lookup``)."""
    return await db.fetchrow(
        "SELECT caller, line_type, caller_name_lookup FROM answering_calls WHERE call_sid = $1", call_sid
    )


async def store_lookup(db: Queries, call_sid: str, line_type: str | None, caller_name: str | None) -> None:
    await db.execute(
        "UPDATE answering_calls SET line_type = coalesce($2, ''), caller_name_lookup = $3 WHERE call_sid = $1",
        call_sid,
        line_type,
        caller_name,
    )


async def mark_screened(db: Queries, call_sid: str, pattern: str) -> None:
    """A robocall pattern ended the call (logged; never a message to the owner)."""
    await db.execute("UPDATE answering_calls SET screened = $2 WHERE call_sid = $1", call_sid, pattern)


async def promise_callback(db: Queries, account_id: UUID, call_sid: str, number: str) -> None:
    """The caller was told the owner will call back: a todo for the owner (once per call). Its
    title is fixed words and the checked number only: nothing the caller said reaches the owner's
    todos, which the owner's own sessions read as theirs."""
    title = f"Call back {number} (answering call {call_sid[-6:]}): Pepper told them you would"
    await db.execute("UPDATE answering_messages SET callback_promised = true WHERE call_sid = $1", call_sid)
    await db.execute(
        "INSERT INTO todos (account_id, title) SELECT $1, $2"
        " WHERE NOT EXISTS (SELECT 1 FROM todos WHERE account_id = $1 AND title = $2)",
        account_id,
        title,
    )
