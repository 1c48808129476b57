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
from core.records import answering
from core.records import answering_bookings as bookings
from core.store.pool import transaction
from core.store.queries import Queries
from core.tools.areas.calendar import Busy, CalendarUnavailable, SlotTaken, book, free_busy, lock_bookings
from core.tools.areas.calendar.model import Attendee, parse_when
from core.tools.connectors import Connectors
from core.tools.context import SessionContext
from core.tools.gate import Policy, Verdict
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import quoted

log = logging.getLogger(__name__)

AREA = "answering"
CHANNEL = "answering"
PROFILE: frozenset[str] = frozenset(
    {"take_message", "check_availability", "book_appointment", "end_call", "transfer_to_owner"}
)
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
    db: Queries, call: CallerCall, start: datetime, end: datetime, connectors: Connectors | None
) -> list[Busy]:
    """Busy time as a caller may see it: intervals only (no titles, no people), plus slots other
    calls hold while their callers hear them confirmed."""
    busy = await free_busy(db, call.account_id, start, end, connectors=connectors)
    rows = await bookings.held_by_others(db, call.account_id, call.call_sid, start, end)
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


async def confirmation_number(db: Queries, call: CallerCall) -> str | None:
    """Where this call's booking confirmation may be texted: the caller ID, only when it is in an
    allowed country and the line is under its hourly cap of texts to callers; otherwise nowhere."""
    if call.caller is None or call.line_number is None:
        return None
    if identity.phone_region(call.caller) not in call.text_regions:
        return None
    if await answering.texts_this_hour(db, call.line_number) >= call.rules.max_texts_per_hour:
        return None
    return call.caller


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
            "call_back": bool(args.get("call_back")),
        }
        promised = "; the owner has a todo to call them back" if payload["call_back"] else ""
        return ToolOutcome.planned(payload, f"message saved for the owner{promised}")

    async def apply_message(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
        await answering.save_message(
            conn, payload["call_sid"], account_id, caller_name=payload["caller_name"],
            callback_number=payload["callback_number"], reason=payload["reason"], urgency=payload["urgency"],
            vip=payload["vip"],
        )  # fmt: skip
        # Due now for a VIP's message, else when the call ends (``AnsweringSession._finish`` makes it
        # due), at the latest in an hour if the call's end was never recorded.
        if payload.get("call_back"):
            await answering.promise_callback(conn, account_id, payload["call_sid"], payload["callback_number"])
        await answering.record_owner_notice(conn, account_id, payload["call_sid"], now=bool(payload["vip"]))

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
            "call_back": {"type": "boolean",
                          "description": "True when you offered 'I'll have them call you back' and the caller agreed:"
                                         " the owner gets a todo to call back."},
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


ONE_PER_CALL = "this call already booked or is booking another time, and a call books one appointment"


async def _hold(
    db: Queries, call: CallerCall, key: str, start: datetime, end: datetime, remote: list[Busy]
) -> str | None:
    """Hold [start, end) for this call if it is free (buffers included); why not, when it is not."""
    pad = call.rules.buffer
    async with transaction(db) as conn:
        await lock_bookings(conn, call.account_id)
        if await bookings.is_booked(conn, key):
            return None  # already booked by this call: the staged repeat applies as a no-op
        if await bookings.other_booking(conn, call.call_sid, key):
            # One caller must not fill the owner's calendar: one appointment per call.
            return ONE_PER_CALL
        if not await bookings.holds(conn, key):
            busy = list(remote)
            busy += await free_busy(conn, call.account_id, start - pad, end + pad)
            rows = await bookings.held_by_others(conn, call.account_id, call.call_sid, start - pad, end + pad)
            busy += [Busy(r["starts_at"], r["ends_at"]) for r in rows]
            if overlaps(busy, start, end, pad):
                return "taken"
        await bookings.hold(conn, key, call.account_id, call.call_sid, start, end, HOLD_TTL)
    return None


async def apply_booking(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    """Commit a staged booking (inside the staging transaction). Idempotent on the booking key;
    raises ``SlotTaken`` if the time (with its buffers) is no longer free."""
    key = payload["booking_key"]
    await lock_bookings(conn, account_id)
    if await bookings.is_booked(conn, key):
        return  # the model asked twice: booked once
    if await bookings.other_booking(conn, payload["call_sid"], key):
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
    await bookings.record_booking(
        conn, account_id, payload["call_sid"], key, booking.event_id, line_number=payload.get("line_number"),
        caller_number=payload["caller_number"], caller_name=payload["caller_name"], appointment_type=payload["type"],
        starts_at=start, ends_at=end, caller_email=payload.get("email"),
    )  # fmt: skip
    await bookings.release_hold(conn, key)
    await _record_confirmation(conn, account_id, payload)
    await answering.record_owner_notice(conn, account_id, payload["call_sid"], now=False)


async def _record_confirmation(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    """The caller's confirmation text, in the booking's own transaction (under the calendar's
    booking lock, so the line's hourly cap is counted one booking at a time)."""
    to, line = payload.get("confirm_to"), payload.get("line_number")
    if not to or not line or not payload.get("confirmation"):
        return
    if await answering.texts_this_hour(conn, line) >= int(payload.get("max_texts_per_hour", 0)):
        log.warning("a booking confirmation was not texted: the line reached its hourly cap")
        return
    await answering.record_caller_text(conn, account_id, payload["call_sid"], to=to, line=line,
                                       body=payload["confirmation"])  # fmt: skip
    await bookings.confirmation_recorded(conn, payload["booking_key"])


def payload_of(row: Any) -> dict[str, Any]:
    raw = row["payload"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw)
