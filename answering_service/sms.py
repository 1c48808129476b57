"""Texts from a caller who booked through the answering service (a number with no account).

Handled here with fixed rules, never by the owner's agent and never by a model:

* ``CANCEL BOOKING`` (or ``CANCEL APPOINTMENT``): the caller's next booking is cancelled;
* ``MOVE``: up to three free times for the same appointment type are offered, numbered;
* ``1``, ``2`` or ``3`` after an offer: the booking moves there (if that time is still free);
* anything else: how to cancel or move.

Only bookings made from that number with the owner of the line that was texted can be touched,
and each reply changes state once (a retried webhook finds the offer used or the booking already
cancelled).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from answering_service.notify import OwnerNotifier
from answering_service.rules import free_starts, load_rules, overlaps, rule_problem, spoken
from answering_service.tools import booking_title
from core.errors import PepperError
from core.records import answering_bookings as bookings
from core.store import Database
from core.store.queries import Queries
from core.tools.areas.calendar import book, free_busy, lock_bookings
from core.tools.areas.calendar.service import cancel_own
from core.untrusted import quoted

log = logging.getLogger(__name__)

CANCEL_WORDS = frozenset({"CANCEL BOOKING", "CANCEL APPOINTMENT", "CANCEL MY BOOKING", "CANCEL MY APPOINTMENT"})
MOVE_WORDS = frozenset({"MOVE", "MOVE BOOKING", "MOVE APPOINTMENT", "RESCHEDULE", "CHANGE"})
OFFER_DAYS = 14
HELP = "Reply CANCEL BOOKING to cancel your appointment, or MOVE to pick another time."


async def handle_caller_text(
    db: Database, number: str, body: str, *, line: str, notifier: OwnerNotifier | None = None
) -> str | None:
    """The reply to a text from ``number`` to ``line`` (both E.164), or None when the number has
    no upcoming booking with that line's owner (the text is not for the answering service)."""
    booking = await bookings.upcoming_booking(db, number, line)
    if booking is None:
        return None
    text = " ".join(body.upper().replace(".", " ").replace("!", " ").split())
    rules = await load_rules(db, booking["account_id"])
    if text in CANCEL_WORDS:
        return await _cancel(db, booking, rules, notifier)
    if text in MOVE_WORDS:
        return await _offer(db, booking, rules)
    if text in ("1", "2", "3"):
        return await _move(db, booking, rules, int(text), notifier)
    return HELP


async def _cancel(db: Database, booking: Any, rules: Any, notifier: OwnerNotifier | None) -> str:
    async with db.transaction() as conn:
        row = await bookings.lock_booked(conn, booking["id"])
        if row is None:
            return "That appointment is already cancelled."
        if row["event_id"] is not None:
            await cancel_own(conn, row["account_id"], row["event_id"], None)
        await bookings.close_booking(conn, row["id"], "cancelled")
    when = spoken(row["starts_at"], rules.zone)
    if notifier is not None:
        await notifier.text(row["account_id"], f"Cancelled: {when}",
                            f"Pepper answering service: the caller {quoted(row['caller_name'])} cancelled their"
                            f" {row['appointment_type']} on {when} by text.")  # fmt: skip
    return f"Your appointment on {when} is cancelled."


async def _offer(db: Queries, booking: Any, rules: Any) -> str:
    minutes = int((booking["ends_at"] - booking["starts_at"]).total_seconds() // 60)
    now = datetime.now(rules.zone)
    found: list[datetime] = []
    day = now.date()
    for _ in range(min(OFFER_DAYS, rules.horizon_days + 1)):
        start = datetime.combine(day, datetime.min.time(), rules.zone)
        busy = await free_busy(
            db, booking["account_id"], start - rules.buffer, start + timedelta(days=1) + rules.buffer
        )
        found += [s for s in free_starts(rules, day, minutes, busy, now) if s != booking["starts_at"]]
        if len(found) >= 3:
            break
        day += timedelta(days=1)
    found = found[:3]
    if not found:
        return "Sorry, there are no other free times in the next two weeks. Reply CANCEL BOOKING to cancel."
    await bookings.offer_times(db, booking["id"], json.dumps([s.isoformat() for s in found]))
    lines = [f"{i}) {spoken(s, rules.zone)}" for i, s in enumerate(found, 1)]
    return "Reply with a number to move your appointment: " + "; ".join(lines) + "."


async def _move(db: Database, booking: Any, rules: Any, pick: int, notifier: OwnerNotifier | None) -> str:
    offered = json.loads(booking["offered"]) if isinstance(booking["offered"], str) else booking["offered"]
    if not offered or pick > len(offered):
        return HELP
    start = datetime.fromisoformat(offered[pick - 1])
    end = start + (booking["ends_at"] - booking["starts_at"])
    if rule_problem(rules, start, end, datetime.now(rules.zone)) is not None:
        return "Sorry, that time can no longer be booked. Reply MOVE for new times."
    key = f"{booking['booking_key']}:moved:{start.isoformat()}"
    try:
        async with db.transaction() as conn:
            row = await bookings.lock_booked(conn, booking["id"], offered=True)
            if row is None:
                return "That appointment was already changed."
            await lock_bookings(conn, row["account_id"])
            if row["event_id"] is not None:
                await cancel_own(conn, row["account_id"], row["event_id"], None)
            busy = await free_busy(conn, row["account_id"], start - rules.buffer, end + rules.buffer)
            if overlaps(busy, start, end, rules.buffer):
                raise _Taken()
            title = booking_title(row["appointment_type"], row["caller_name"])
            new = await book(conn, row["account_id"], start, end, title, booking_key=key, tzid=rules.timezone,
                             description=f"Moved by the caller by text. Caller: {row['caller_number']}.")  # fmt: skip
            await bookings.close_booking(conn, row["id"], "moved")
            await bookings.record_moved_booking(conn, row, key, new.event_id, start, end)
    except (_Taken, PepperError):
        return "Sorry, that time was just taken. Reply MOVE for new times."
    when = spoken(start, rules.zone)
    if notifier is not None:
        await notifier.text(booking["account_id"], f"Moved: {when}",
                            f"Pepper answering service: the caller {quoted(booking['caller_name'])} moved their"
                            f" {booking['appointment_type']} from {spoken(booking['starts_at'], rules.zone)} to {when}"
                            " by text.")  # fmt: skip
    return f"Done: your appointment is moved to {when}. {HELP}"


class _Taken(Exception):
    pass
