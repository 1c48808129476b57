"""Bookings callers made through the answering service (``answering_bookings``) and the holds on
a slot while its caller hears it confirmed (``answering_holds``).

A booking's event is in the owner's calendar (``core.tools.areas.calendar``); these rows say who
booked it, from which call and line, and what the caller and the owner were sent about it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from core.store.queries import Queries

# --- Bookings -------------------------------------------------------------------------------------


async def bookings_of(db: Queries, call_sid: str) -> list[Any]:
    return await db.fetch("SELECT * FROM answering_bookings WHERE call_sid = $1", call_sid)


async def is_booked(db: Queries, booking_key: str) -> bool:
    return bool(await db.fetchval("SELECT 1 FROM answering_bookings WHERE booking_key = $1", booking_key))


async def other_booking(db: Queries, call_sid: str, booking_key: str) -> bool:
    """The call already booked, or holds while it is being confirmed, a time other than ``booking_key``'s."""
    return bool(
        await db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM answering_bookings WHERE call_sid = $1 AND booking_key <> $2"
            " AND status = 'booked') OR EXISTS (SELECT 1 FROM answering_holds WHERE call_sid = $1"
            " AND booking_key <> $2 AND expires_at > now())",
            call_sid,
            booking_key,
        )
    )


async def record_booking(
    db: Queries,
    account_id: UUID,
    call_sid: str,
    booking_key: str,
    event_id: UUID,
    *,
    line_number: str | None,
    caller_number: str,
    caller_name: str,
    appointment_type: str,
    starts_at: datetime,
    ends_at: datetime,
    caller_email: str | None,
) -> None:
    """A booking a call made; the same key twice records it once."""
    await db.execute(
        """
        INSERT INTO answering_bookings (account_id, call_sid, booking_key, event_id, line_number, caller_number,
            caller_name, appointment_type, starts_at, ends_at, caller_email)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (booking_key) DO NOTHING
        """,
        account_id, call_sid, booking_key, event_id, line_number, caller_number, caller_name, appointment_type,
        starts_at, ends_at, caller_email,
    )  # fmt: skip


async def record_moved_booking(
    db: Queries, old: Any, booking_key: str, event_id: UUID, starts_at: datetime, ends_at: datetime
) -> None:
    """The booking ``old`` (its row) moved to a new time by its caller: a new booking of the same call,
    line, caller and type, confirmed and announced already (the caller asked for it by text)."""
    await db.execute(
        """
        INSERT INTO answering_bookings (account_id, call_sid, booking_key, event_id, line_number, caller_number,
            caller_name, appointment_type, starts_at, ends_at, confirmation_sent_at, owner_notified_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), now())
        """,
        old["account_id"], old["call_sid"], booking_key, event_id, old["line_number"], old["caller_number"],
        old["caller_name"], old["appointment_type"], starts_at, ends_at,
    )  # fmt: skip


async def confirmation_recorded(db: Queries, booking_key: str) -> None:
    await db.execute("UPDATE answering_bookings SET confirmation_sent_at = now() WHERE booking_key = $1", booking_key)


async def upcoming_booking(db: Queries, number: str, line: str) -> Any:
    """The next booking ``number`` made with the owner of ``line`` (the number that was texted):
    another owner's bookings are not this line's to touch."""
    return await db.fetchrow(
        "SELECT b.* FROM answering_bookings b JOIN phone_lines l ON l.account_id = b.account_id"
        " WHERE l.number = $2 AND b.caller_number = $1 AND b.status = 'booked' AND b.starts_at > now()"
        " ORDER BY b.starts_at LIMIT 1",
        number,
        line,
    )


async def lock_booked(db: Queries, booking_id: int, *, offered: bool = False) -> Any:
    """The booking, locked for the rest of the transaction, while it is still booked (and, with
    ``offered``, has times offered to move to); None otherwise."""
    if offered:
        return await db.fetchrow(
            "SELECT * FROM answering_bookings WHERE id = $1 AND status = 'booked' AND offered IS NOT NULL FOR UPDATE",
            booking_id,
        )
    return await db.fetchrow(
        "SELECT * FROM answering_bookings WHERE id = $1 AND status = 'booked' FOR UPDATE", booking_id
    )


async def close_booking(db: Queries, booking_id: int, status: str) -> None:
    """The booking is ``cancelled`` or ``moved``; its offered times go with it."""
    await db.execute("UPDATE answering_bookings SET status = $2, offered = NULL WHERE id = $1", booking_id, status)


async def offer_times(db: Queries, booking_id: int, offered: str) -> None:
    """The times (a JSON list of ISO datetimes) offered to the caller to move the booking to."""
    await db.execute("UPDATE answering_bookings SET offered = $2::jsonb WHERE id = $1", booking_id, offered)


async def claim_owner_notices(db: Queries, call_sid: str) -> list[Any]:
    """The call's bookings the owner was not told about yet, marked told."""
    return await db.fetch(
        """
        UPDATE answering_bookings b SET owner_notified_at = now()
        WHERE b.call_sid = $1 AND b.owner_notified_at IS NULL AND b.status = 'booked'
        RETURNING b.account_id, b.caller_name, b.appointment_type, b.starts_at, b.caller_number
        """,
        call_sid,
    )


async def claim_invitations(db: Queries, call_sid: str) -> list[Any]:
    """The call's bookings whose caller gave an address and was not invited yet, marked invited,
    with their calendar event's ``uid``."""
    return await db.fetch(
        """
        UPDATE answering_bookings b SET invited_at = now()
        FROM calendar_events e
        WHERE b.call_sid = $1 AND b.invited_at IS NULL AND b.caller_email IS NOT NULL AND b.status = 'booked'
          AND e.id = b.event_id
        RETURNING b.id, b.caller_email, b.appointment_type, b.starts_at, b.ends_at, e.uid
        """,
        call_sid,
    )


async def invitation_failed(db: Queries, booking_id: int, error: str) -> None:
    await db.execute("UPDATE answering_bookings SET invite_error = $2 WHERE id = $1", booking_id, error)


# --- Holds ----------------------------------------------------------------------------------------


async def held_by_others(db: Queries, account_id: UUID, call_sid: str, start: datetime, end: datetime) -> list[Any]:
    """Slots (``starts_at``, ``ends_at``) overlapping [start, end) that other calls hold now."""
    return await db.fetch(
        """
        SELECT starts_at, ends_at FROM answering_holds
        WHERE account_id = $1 AND call_sid <> $2 AND expires_at > now() AND starts_at < $4 AND ends_at > $3
        """,
        account_id,
        call_sid,
        start,
        end,
    )


async def holds(db: Queries, booking_key: str) -> bool:
    """Whether the hold for ``booking_key`` is still in force."""
    return bool(
        await db.fetchval("SELECT 1 FROM answering_holds WHERE booking_key = $1 AND expires_at > now()", booking_key)
    )


async def hold(
    db: Queries, booking_key: str, account_id: UUID, call_sid: str, start: datetime, end: datetime, ttl: timedelta
) -> None:
    """Hold [start, end) for the call for ``ttl``; holding it again renews the hold."""
    await db.execute(
        """
        INSERT INTO answering_holds (booking_key, account_id, call_sid, starts_at, ends_at, expires_at)
        VALUES ($1, $2, $3, $4, $5, now() + $6::interval)
        ON CONFLICT (booking_key) DO UPDATE SET expires_at = excluded.expires_at
        """,
        booking_key, account_id, call_sid, start, end, ttl,
    )  # fmt: skip


async def release_hold(db: Queries, booking_key: str) -> None:
    await db.execute("DELETE FROM answering_holds WHERE booking_key = $1", booking_key)
