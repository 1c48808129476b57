"""The answering profile: the only tools a forwarded caller's session has, and the gate check that
refuses everything else (defence in depth: the tools are also the only ones shown).

* ``take_message``: structured (name, callback number confirmed aloud, reason, urgency), saved at
  once (a message must survive a hang-up); one message per call, a repeat updates it.
* ``check_availability``: free start times only. The session learns that 15:00 is taken, never
  what is there or with whom: it reads ``free_busy`` intervals, never events.
* ``book_appointment``: the owner's rules in code; a hold on the slot at once (so a second caller
  racing for it is told it is taken), the booking itself staged until the caller has heard the
  confirming sentence. The booking key makes a repeated call book once.
* ``end_call``: the call session's own control.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any
from uuid import UUID

from answering_service.rules import Rules, day_window, free_starts, overlaps, rule_problem, spoken
from core import identity
from core.errors import InvalidInput
from core.store.pool import transaction
from core.tools.areas.calendar import Busy, CalendarUnavailable, SlotTaken, book, free_busy
from core.tools.areas.calendar.model import Attendee, parse_when
from core.tools.connectors import Connectors
from core.tools.context import SessionContext
from core.tools.gate import Policy, Verdict
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import quoted

log = logging.getLogger(__name__)

AREA = "answering"
CHANNEL = "answering"
PROFILE: frozenset[str] = frozenset({"take_message", "check_availability", "book_appointment", "end_call"})
HOLD_TTL = timedelta(minutes=10)
MAX_FREE_LISTED = 8


# --- The gate: an answering session may use its profile and nothing else ------------------------


def is_answering(session: SessionContext) -> bool:
    return session.trust == "third_party" and session.channel == CHANNEL


def _profile_hides(tool: Tool, session: SessionContext) -> bool:
    if is_answering(session):
        return tool.area != AREA or tool.name not in PROFILE
    # The answering tools act for a caller; no other session has any use for them.
    return tool.area == AREA


def _profile_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    if _profile_hides(tool, session):
        if is_answering(session):
            return Verdict.deny("a caller to the answering service can only leave a message or book a time")
        return Verdict.deny("answering-service tools only run in an answering call")
    return Verdict.allow()


ANSWERING_POLICY = Policy("answering-profile", _profile_check, _profile_hides)


# --- The call the tools act for -------------------------------------------------------------------


@dataclass
class CallerCall:
    """What the tools know about the call: set by the session, never by the model."""

    call_sid: str
    account_id: UUID
    caller: str | None  # caller ID, E.164, when Twilio gave a valid one
    line_number: str | None
    rules: Rules
    vip: bool = False
    text_regions: tuple[str, ...] = ()  # regions a confirmation text may go to (the owner's setting)


Notify = Callable[[str], Awaitable[None]]  # (call_sid) -> the owner is told about the call's message now


def booking_title(kind: str, caller_name: str) -> str:
    """The event's title in the owner's calendar: the caller's name quoted and labelled, because the
    owner's own assistant reads these titles (a "name" may be an instruction in disguise)."""
    return f"{kind.capitalize()} booked by phone (name as the caller gave it: {quoted(caller_name)})"


def booking_key(call_sid: str, start: datetime, kind: str) -> str:
    raw = f"{call_sid}|{start.isoformat()}|{kind.lower()}"
    return "answering:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


async def busy_for_caller(
    db: Any, call: CallerCall, start: datetime, end: datetime, connectors: Connectors | None
) -> list[Busy]:
    """Busy time as a caller may see it: intervals only (no titles, no people), plus slots other
    calls hold while their callers hear them confirmed."""
    busy = await free_busy(db, call.account_id, start, end, connectors=connectors)
    rows = await db.fetch(
        """
        SELECT starts_at, ends_at FROM answering_holds
        WHERE account_id = $1 AND call_sid <> $2 AND expires_at > now() AND starts_at < $4 AND ends_at > $3
        """,
        call.account_id,
        call.call_sid,
        start,
        end,
    )
    return busy + [Busy(r["starts_at"], r["ends_at"]) for r in rows]


def _phone(raw: str | None, fallback: str | None) -> str | None:
    if raw is None or not raw.strip():
        return fallback
    try:
        return identity.normalize_phone(raw)
    except InvalidInput:
        return None


def confirmation_text(rules: Rules, kind: str, start: datetime) -> str:
    owner = rules.owner_name or "us"
    return (
        f"Your {kind} with {owner} is booked for {spoken(start, rules.zone)} ({rules.timezone})."
        " Reply CANCEL BOOKING to cancel it, or MOVE to pick another time."
    )


async def texts_this_hour(db: Any, line: str) -> int:
    """Texts recorded for callers from ``line`` in the last hour (the per-line cap counts these)."""
    return await db.fetchval(
        "SELECT count(*) FROM answering_deliveries WHERE kind = 'caller_text' AND from_number = $1"
        " AND created_at > now() - interval '1 hour'",
        line,
    )


async def confirmation_number(db: Any, call: CallerCall) -> str | None:
    """Where this call's booking confirmation may be texted: the caller ID, only when it is in an
    allowed country and the line is under its hourly cap of texts to callers; otherwise nowhere."""
    if call.caller is None or call.line_number is None:
        return None
    if identity.phone_region(call.caller) not in call.text_regions:
        return None
    if await texts_this_hour(db, call.line_number) >= call.rules.max_texts_per_hour:
        return None
    return call.caller


async def record_owner_notice(conn: Any, account_id: UUID, call_sid: str, *, now: bool) -> None:
    """The owner's notice about this call, recorded for the turn workers to send: due now (a VIP's
    message), else when the call ends (``AnsweringSession._finish`` makes it due), at the latest in
    an hour if the call's end was never recorded."""
    await conn.execute(
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


def make_tools(
    call: CallerCall,
    *,
    end_call: Tool,
    connectors: Connectors | None = None,
    notify_now: Notify | None = None,
) -> tuple[Tool, ...]:
    rules = call.rules
    zone = rules.zone
    type_names = [t.name for t in rules.appointment_types]

    # --- take_message -------------------------------------------------------------------------

    async def take_message(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        number = _phone(args.get("callback_number"), call.caller)
        if number is None:
            return ToolOutcome.failed("that callback number is not a valid phone number; ask for it again")
        if not args.get("number_confirmed"):
            return ToolOutcome.failed(
                f"not saved yet. Read the callback number {' '.join(number.removeprefix('+'))} back to the caller"
                " and ask if it is right, then call take_message again with number_confirmed true."
            )
        payload = {
            "call_sid": call.call_sid,
            "caller_name": args["caller_name"].strip(),
            "callback_number": number,
            "reason": args["reason"].strip(),
            "urgency": args.get("urgency", "normal"),
            "vip": call.vip,
        }
        return ToolOutcome.planned(payload, "message saved for the owner")

    async def apply_message(conn: Any, account_id: UUID, payload: dict[str, Any]) -> None:
        await conn.execute(
            """
            INSERT INTO answering_messages (call_sid, account_id, caller_name, callback_number, reason, urgency, vip)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            ON CONFLICT (call_sid) DO UPDATE SET caller_name = $3, callback_number = $4, reason = $5, urgency = $6,
                notified_at = CASE WHEN answering_messages.reason = $5 AND answering_messages.urgency = $6
                                   THEN answering_messages.notified_at END
            """,
            payload["call_sid"], account_id, payload["caller_name"], payload["callback_number"], payload["reason"],
            payload["urgency"], payload["vip"],
        )  # fmt: skip
        await record_owner_notice(conn, account_id, payload["call_sid"], now=bool(payload["vip"]))

    message_schema = {
        "type": "object",
        "properties": {
            "caller_name": {"type": "string", "minLength": 1, "maxLength": 120},
            "callback_number": {"type": "string", "maxLength": 40,
                                "description": "Leave out to use the number they are calling from."},
            "number_confirmed": {"type": "boolean",
                                 "description": "True only after you read the number back and the caller agreed."},
            "reason": {"type": "string", "minLength": 1, "maxLength": 1000},
            "urgency": {"type": "string", "enum": ["normal", "urgent"]},
        },
        "required": ["caller_name", "reason", "urgency", "number_confirmed"],
        "additionalProperties": False,
    }  # fmt: skip

    tools: list[Tool] = [
        Tool("take_message", "Save the caller's message for the owner: their name, a callback number (read it back"
             " first), the reason and how urgent it is.", message_schema, take_message, area=AREA, writes=True,
             apply=apply_message),
        end_call,
    ]  # fmt: skip
    if not rules.booking_enabled:
        return tuple(tools)

    # --- check_availability -------------------------------------------------------------------

    async def check_availability(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            kind = rules.appointment(args["appointment_type"])
            day = date.fromisoformat(args["date"].strip())
        except ValueError:
            return ToolOutcome.failed("the date must look like 2025-06-03")
        except InvalidInput as exc:
            return ToolOutcome.failed(str(exc))
        start, end = day_window(rules, day)
        try:
            busy = await busy_for_caller(ctx.db, call, start, end, connectors)
        except CalendarUnavailable:
            return ToolOutcome.failed(
                "the calendar cannot be read right now, so no time can be offered; take a message"
            )
        starts = free_starts(rules, day, kind.minutes, busy, ctx.now)
        label = f"{day:%A %d %B}"
        wanted = args.get("time")
        if wanted:
            try:
                at = parse_when(f"{day.isoformat()}T{wanted.strip()}", zone)
            except InvalidInput:
                return ToolOutcome.failed("the time must look like 15:00")
            problem = rule_problem(rules, at, at + timedelta(minutes=kind.minutes), ctx.now)
            if problem is not None:
                return ToolOutcome.ok(f"{label} at {at:%H:%M} cannot be booked: {problem}.")
            if at in starts:
                return ToolOutcome.ok(f"{label} at {at:%H:%M} is free for a {kind.name} ({kind.minutes} minutes).")
            taken = f"{label} at {at:%H:%M} is taken."
            return ToolOutcome.ok(
                taken + (" Free that day: " + _list(starts) if starts else " Nothing else is free that day.")
            )
        if not starts:
            return ToolOutcome.empty(f"free times for a {kind.name} on {label}")
        return ToolOutcome.ok(
            f"Free start times for a {kind.name} ({kind.minutes} minutes) on {label}: {_list(starts)}."
        )

    def _list(starts: list[datetime]) -> str:
        shown = ", ".join(f"{s:%H:%M}" for s in starts[:MAX_FREE_LISTED])
        return shown + (f" and {len(starts) - MAX_FREE_LISTED} later times" if len(starts) > MAX_FREE_LISTED else "")

    # --- book_appointment ---------------------------------------------------------------------

    async def book_appointment(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            kind = rules.appointment(args["appointment_type"])
            start = parse_when(args["start"], zone)
        except InvalidInput as exc:
            return ToolOutcome.failed(str(exc))
        end = start + timedelta(minutes=kind.minutes)
        problem = rule_problem(rules, start, end, ctx.now)
        if problem is not None:
            return ToolOutcome.failed(f"not booked: {problem}")
        number = call.caller  # caller ID: a number the caller says is never texted (SMS pumping)
        if number is None:
            return ToolOutcome.failed(
                "not booked: this caller's number is withheld, and a booking needs the number they are calling"
                " from; offer to take a message instead"
            )
        confirm_to = await confirmation_number(ctx.db, call)
        try:
            remote = await free_busy(ctx.db, call.account_id, start - rules.buffer, end + rules.buffer,
                                     connectors=connectors) if connectors is not None else []  # fmt: skip
        except CalendarUnavailable:
            return ToolOutcome.failed("the calendar cannot be read right now, so nothing can be booked; take a message")
        email = None
        if rules.send_invitations and (args.get("email") or "").strip():
            try:
                email = identity.normalize_email(args["email"])
            except InvalidInput:
                return ToolOutcome.failed("that email address is not valid; ask for it again or book without it")
        key = booking_key(call.call_sid, start, kind.name)
        problem = await _hold(ctx.db, call, key, start, end, remote)
        if problem == ONE_PER_CALL:
            return ToolOutcome.failed(f"not booked: {problem}; the caller can move it by text afterwards")
        if problem is not None:
            return ToolOutcome.failed(f"{spoken(start, zone)} was just taken; offer another time")
        payload = {
            "booking_key": key, "call_sid": call.call_sid, "type": kind.name, "start": start.isoformat(),
            "end": end.isoformat(), "caller_name": args["caller_name"].strip(), "caller_number": number,
            "line_number": call.line_number, "email": email,
            "buffer_minutes": rules.buffer_minutes, "timezone": rules.timezone,
            "confirm_to": confirm_to, "max_texts_per_hour": rules.max_texts_per_hour,
            "confirmation": confirmation_text(rules, kind.name, start) if confirm_to else None,
        }  # fmt: skip
        summary = f"{kind.name} booked for {payload['caller_name']} on {spoken(start, zone)}"
        if confirm_to is None:
            summary += " (no confirmation text can be sent to this caller: tell them the day and time clearly)"
        return ToolOutcome.planned(payload, summary)

    book_schema = {
        "type": "object",
        "properties": {
            "appointment_type": {"type": "string", "enum": type_names},
            "start": {"type": "string", "maxLength": 40, "description": "Local date and time, e.g. 2025-06-03T15:00"},
            "caller_name": {"type": "string", "minLength": 1, "maxLength": 120},
        },
        "required": ["appointment_type", "start", "caller_name"],
        "additionalProperties": False,
    }  # fmt: skip
    if rules.send_invitations:  # without invitations there is no reason to ask for an address
        book_schema["properties"]["email"] = {  # type: ignore[index]
            "type": "string", "maxLength": 200,
            "description": "The caller's email for a calendar invitation, if they want one (spell it back first).",
        }  # fmt: skip
    availability_schema = {
        "type": "object",
        "properties": {
            "date": {"type": "string", "maxLength": 10, "description": "e.g. 2025-06-03"},
            "appointment_type": {"type": "string", "enum": type_names},
            "time": {"type": "string", "maxLength": 5, "description": "Optional: one time to check, e.g. 15:00"},
        },
        "required": ["date", "appointment_type"],
        "additionalProperties": False,
    }  # fmt: skip
    tools += [
        Tool("check_availability", "Free start times on one day (or whether one time is free). Says only free or"
             " taken.", availability_schema, check_availability, area=AREA),
        Tool("book_appointment", "Book a time for the caller. Check availability first.", book_schema,
             book_appointment, area=AREA, writes=True, staged=True, apply=apply_booking),
    ]  # fmt: skip
    return tuple(tools)


async def _lock(conn: Any, account_id: UUID) -> None:
    # The calendar's own booking lock: holds, bookings and the calendar's ``book`` serialise on it.
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('calendar-book:' || $1::uuid::text, 0))", account_id
    )


ONE_PER_CALL = "this call already booked or is booking another time, and a call books one appointment"


async def _other_booking(conn: Any, call_sid: str, key: str) -> bool:
    """The call already booked, or holds while it is being confirmed, a different time."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM answering_bookings WHERE call_sid = $1 AND booking_key <> $2"
            " AND status = 'booked') OR EXISTS (SELECT 1 FROM answering_holds WHERE call_sid = $1"
            " AND booking_key <> $2 AND expires_at > now())",
            call_sid,
            key,
        )
    )


async def _hold(db: Any, call: CallerCall, key: str, start: datetime, end: datetime, remote: list[Busy]) -> str | None:
    """Hold [start, end) for this call if it is free (buffers included); why not, when it is not."""
    pad = call.rules.buffer
    async with transaction(db) as conn:
        await _lock(conn, call.account_id)
        if await conn.fetchval("SELECT 1 FROM answering_bookings WHERE booking_key = $1", key):
            return None  # already booked by this call: the staged repeat applies as a no-op
        if await _other_booking(conn, call.call_sid, key):
            # One caller must not fill the owner's calendar: one appointment per call.
            return ONE_PER_CALL
        own = await conn.fetchval("SELECT 1 FROM answering_holds WHERE booking_key = $1 AND expires_at > now()", key)
        if own is None:
            busy = list(remote)
            busy += await free_busy(conn, call.account_id, start - pad, end + pad)
            rows = await conn.fetch(
                "SELECT starts_at, ends_at FROM answering_holds WHERE account_id = $1 AND call_sid <> $2"
                " AND expires_at > now() AND starts_at < $4 AND ends_at > $3",
                call.account_id, call.call_sid, start - pad, end + pad,
            )  # fmt: skip
            busy += [Busy(r["starts_at"], r["ends_at"]) for r in rows]
            if overlaps(busy, start, end, pad):
                return "taken"
        await conn.execute(
            """
            INSERT INTO answering_holds (booking_key, account_id, call_sid, starts_at, ends_at, expires_at)
            VALUES ($1, $2, $3, $4, $5, now() + $6::interval)
            ON CONFLICT (booking_key) DO UPDATE SET expires_at = excluded.expires_at
            """,
            key, call.account_id, call.call_sid, start, end, HOLD_TTL,
        )  # fmt: skip
    return None


async def apply_booking(conn: Any, account_id: UUID, payload: dict[str, Any]) -> None:
    """Commit a staged booking (inside the staging transaction). Idempotent on the booking key;
    raises ``SlotTaken`` if the time (with its buffers) is no longer free."""
    key = payload["booking_key"]
    await _lock(conn, account_id)
    if await conn.fetchval("SELECT 1 FROM answering_bookings WHERE booking_key = $1", key):
        return  # the model asked twice: booked once
    if await _other_booking(conn, payload["call_sid"], key):
        raise SlotTaken(ONE_PER_CALL)
    start, end = datetime.fromisoformat(payload["start"]), datetime.fromisoformat(payload["end"])
    pad = timedelta(minutes=int(payload.get("buffer_minutes", 0)))
    if overlaps(await free_busy(conn, account_id, start - pad, end + pad), start, end, pad):
        raise SlotTaken("that time is not free")
    attendees = [Attendee(payload["email"], payload["caller_name"])] if payload.get("email") else None
    title = booking_title(payload["type"], payload["caller_name"])
    booking = await book(conn, account_id, start, end, title, booking_key=key, attendees=attendees,
                         description=f"Booked by the answering service. Caller: {payload['caller_number']}.",
                         tzid=payload.get("timezone"))  # fmt: skip
    await conn.execute(
        """
        INSERT INTO answering_bookings (account_id, call_sid, booking_key, event_id, line_number, caller_number,
            caller_name, appointment_type, starts_at, ends_at, caller_email)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (booking_key) DO NOTHING
        """,
        account_id, payload["call_sid"], key, booking.event_id, payload.get("line_number"), payload["caller_number"],
        payload["caller_name"], payload["type"], start, end, payload.get("email"),
    )  # fmt: skip
    await conn.execute("DELETE FROM answering_holds WHERE booking_key = $1", key)
    await _record_confirmation(conn, account_id, payload)
    await record_owner_notice(conn, account_id, payload["call_sid"], now=False)


async def _record_confirmation(conn: Any, account_id: UUID, payload: dict[str, Any]) -> None:
    """The caller's confirmation text, in the booking's own transaction (under the calendar's
    booking lock, so the line's hourly cap is counted one booking at a time)."""
    to, line = payload.get("confirm_to"), payload.get("line_number")
    if not to or not line or not payload.get("confirmation"):
        return
    if await texts_this_hour(conn, line) >= int(payload.get("max_texts_per_hour", 0)):
        log.warning("a booking confirmation was not texted: the line reached its hourly cap")
        return
    await conn.execute(
        "INSERT INTO answering_deliveries (account_id, call_sid, kind, to_number, from_number, body)"
        " VALUES ($1, $2, 'caller_text', $3, $4, $5)",
        account_id, payload["call_sid"], to, line, payload["confirmation"],
    )  # fmt: skip
    await conn.execute(
        "UPDATE answering_bookings SET confirmation_sent_at = now() WHERE booking_key = $1", payload["booking_key"]
    )


def payload_of(row: Any) -> dict[str, Any]:
    raw = row["payload"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw)
