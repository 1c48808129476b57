"""The answering service end to end: forwarded calls from anyone, through the loopback Twilio
caller and the loopback Realtime peer, on a real server and a fresh database."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, time, timedelta

from phone_support import ANSWERING_LINE, LINE, OWNER, PIN, STRANGER, speech, until, workday

from answering_service.rules import load_rules, parse_hours, save_rules
from answering_service.tools import ANSWERING_POLICY, PROFILE
from core.models.types import ToolCall
from core.tools.context import SessionContext
from core.tools.gate import default_gate
from core.tools.registry import ToolContext
from core.tools.runner import run_call
from core.tools.starter import starter_registry
from voice.testing.realtime_peer import ScriptedResponse, call_tool, speak

OTHER = "+14155558888"
BOB_LINE = "+14155550102"
BOOKING_TOOLS = {"take_message", "check_availability", "book_appointment", "end_call"}


DAY = workday()


async def _rules(phone, **changes):
    import dataclasses

    rules = await load_rules(phone.db, phone.account_id)
    rules = dataclasses.replace(rules, **changes)
    await save_rules(phone.db, rules)
    return rules


async def _booking_on(phone, **changes):
    return await _rules(
        phone, booking_enabled=True, greeting="Hi, you've reached Ada's assistant.", min_notice_minutes=60,
        buffer_minutes=15, working_hours=parse_hours("mon-fri=09:00-17:00"), **changes,
    )  # fmt: skip


async def _forwarded(phone, from_=STRANGER):
    answer = await phone.caller.dial(from_=from_, to=LINE, ForwardedFrom=OWNER)
    assert answer.connected, answer.twiml
    return answer


async def _ended(phone, call_sid):
    return await until(
        lambda: phone.db.fetchrow(
            "SELECT * FROM answering_calls WHERE call_sid = $1 AND summary IS NOT NULL", call_sid
        ),
        what="the answering call to be recorded",
    )


async def _booked_call(phone, *script):
    """A forwarded call that books as scripted, waits for the caller's confirmation text and hangs up."""
    phone.model.script(*script)
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await phone.model.respond(0)
        await phone.twilio.wait_for_sent(1, within=15)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    return answer


def _book(at: str = "10:00", **extra):
    return call_tool("book_appointment", {"appointment_type": "meeting", "start": f"{DAY.isoformat()}T{at}",
                                          "caller_name": "Grace Hopper", **extra})  # fmt: skip


async def test_a_forwarded_call_takes_a_message_and_the_owner_gets_it_by_sms(phone):
    await _rules(phone, greeting="Hi, you've reached Ada's assistant.")
    phone.twilio.response_delay = 1.0  # Twilio slow to answer, as under load: the text is out before Pepper hears
    phone.model.script(
        call_tool("take_message", {"caller_name": "Grace Hopper", "reason": "About the compiler talk",
                                   "urgency": "normal", "number_confirmed": True}),
        speak("Thanks, I'll pass that on."),
    )  # fmt: skip
    phone.model.hear("this is grace, please tell ada about the compiler talk")
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "Ada's assistant" in session.response_creates[0]["instructions"]
        assert set(session.tool_names()) == {"take_message", "end_call"}  # booking is off
        call.say(speech("hello"))
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "message is saved" in session.tool_outputs[0]["output"]
        await call.wait(lambda: call.heard_ms >= 600, what="the thanks")
        await call.hang_up()
    hung_up = asyncio.get_running_loop().time()
    [sms] = await phone.twilio.wait_for_sent(1, within=10)
    assert asyncio.get_running_loop().time() - hung_up < 5
    assert sms.to == OWNER and sms.from_ == LINE
    assert '"Grace Hopper"' in sms.body and '"About the compiler talk"' in sms.body
    assert f"Call back: {STRANGER}" in sms.body  # caller ID by default
    assert f"https://pepper.example.org/answering/calls/{answer.call_sid}" in sms.body
    assert "not instructions" in sms.body
    row = await _ended(phone, answer.call_sid)
    assert row["caller"] == STRANGER and json.loads(row["transcript"])
    # A caller's words never become the owner's memory.
    assert await phone.db.fetchval("SELECT count(*) FROM messages WHERE channel = 'voice'") == 0
    # The channel is on record before the notice leaves on it: no waiting for the row.
    message = await phone.db.fetchrow("SELECT * FROM answering_messages")
    assert message["notify_channel"] == "sms" and message["notified_at"] is not None
    turn = await phone.db.fetchrow("SELECT trust FROM turns")
    assert turn["trust"] == "third_party"


async def test_the_callback_number_must_be_read_back_before_it_is_saved(phone):
    phone.model.script(
        call_tool("take_message", {"caller_name": "Grace", "reason": "hi", "urgency": "normal",
                                   "callback_number": "(415) 555-7777", "number_confirmed": False}),
        speak("Is that 4 1 5 5 5 5 7 7 7 7?"),
    )  # fmt: skip
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "not saved yet. Read the callback number 1 4 1 5 5 5 5 7 7 7 7 back" in session.tool_outputs[0]["output"]
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM answering_messages") == 0


async def test_a_vip_hears_right_away_and_the_owner_is_told_before_the_call_ends(phone):
    await _rules(phone, vip_numbers=(STRANGER,), notify_channel="web")
    phone.model.script(call_tool("take_message", {"caller_name": "Mum", "reason": "Call me back",
                                                  "urgency": "normal", "number_confirmed": True}),
                       speak("I'll let them know right away."))  # fmt: skip
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "VIP" in session.config["instructions"]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "I'll let them know right away" in session.tool_outputs[0]["output"]
        body = await until(lambda: phone.db.fetchval("SELECT body FROM messages WHERE channel = 'answering'"),
                            what="the urgent notice in the owner's chat")  # fmt: skip
        assert body.startswith("Pepper answering service: URGENT") and '"Mum"' in body
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    await asyncio.sleep(0.2)
    assert await phone.db.fetchval("SELECT count(*) FROM messages WHERE channel = 'answering'") == 1  # once


async def test_a_booking_commits_when_the_confirmation_played_and_the_caller_gets_a_text(phone):
    await _booking_on(phone)
    phone.model.script(_book(), speak("You're booked for ten o'clock.", ms=600))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert set(session.tool_names()) == BOOKING_TOOLS
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "once the caller has heard you confirm it" in session.tool_outputs[0]["output"]
        assert await phone.db.fetchval("SELECT count(*) FROM calendar_events") == 0  # not before the mark
        [sms] = await phone.twilio.wait_for_sent(1, within=10)
        assert sms.to == STRANGER and sms.from_ == LINE
        assert "booked for" in sms.body and "CANCEL BOOKING" in sms.body and "MOVE" in sms.body
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    event = await phone.db.fetchrow("SELECT * FROM calendar_events")
    assert event["starts_at"] == datetime.combine(DAY, time(10), UTC) and event["status"] == "confirmed"
    assert event["attendees"] in ("[]", [])  # no invitation: the owner did not turn them on
    # The owner sees it in their own calendar, the caller's name quoted.
    owner = SessionContext(kind="live", trust="owner_verified", channel="sms", account_id=phone.account_id)
    ctx = ToolContext(owner, phone.db, datetime.now(UTC))
    listing = await run_call(starter_registry(), default_gate(), ctx,
                             ToolCall("c1", "list_events", {"start": DAY.isoformat(), "days": 1}))  # fmt: skip
    assert 'Meeting booked by phone (name as the caller gave it: "Grace Hopper")' in listing.content
    assert await phone.db.fetchval("SELECT count(*) FROM answering_holds") == 0
    # The owner hears about the booking too.
    sent = await phone.twilio.wait_for_sent(2, within=10)
    assert sent[1].to == OWNER and "booked a meeting" in sent[1].body

    # The caller cancels by text: fixed rules, not the owner's agent.
    status, twiml = await phone.caller.post(
        "/twilio/sms", {"MessageSid": "SM" + "c" * 32, "From": STRANGER, "To": LINE, "Body": "cancel booking"}
    )
    assert status == 200 and "is cancelled" in twiml
    assert await phone.db.fetchval("SELECT status FROM calendar_events") == "cancelled"
    assert await phone.db.fetchval("SELECT count(*) FROM turns WHERE kind = 'live'") == 0


async def test_a_caller_moves_a_booking_by_text(phone):
    await _booking_on(phone)
    await _booked_call(phone, _book(), speak("Booked.", ms=600))
    form = {"MessageSid": "SM" + "m" * 32, "From": STRANGER, "To": LINE, "Body": "MOVE"}
    _, offer = await phone.caller.post("/twilio/sms", form)
    assert "1)" in offer and "Reply with a number" in offer
    _, moved = await phone.caller.post("/twilio/sms", form | {"MessageSid": "SM" + "n" * 32, "Body": "1"})
    assert "moved to" in moved
    rows = await phone.db.fetch("SELECT status FROM calendar_events ORDER BY created_at")
    assert [r["status"] for r in rows] == ["cancelled", "confirmed"]
    # A stranger with no booking still gets nothing from anyone.
    _, other = await phone.caller.post("/twilio/sms", form | {"MessageSid": "SM" + "o" * 32, "From": OTHER})
    assert "moved" not in other and "1)" not in other


async def test_a_text_to_another_owners_line_cannot_cancel_or_move_a_booking(phone):
    from core import identity

    await _booking_on(phone)
    bob = await identity.create_account(phone.db, "Bob")
    await identity.assign_line(phone.db, BOB_LINE, "answering", bob.id)
    await _booked_call(phone, _book(), speak("Booked.", ms=600))
    form = {"MessageSid": "SM" + "b" * 32, "From": STRANGER, "To": BOB_LINE, "Body": "CANCEL BOOKING"}
    _, reply = await phone.caller.post("/twilio/sms", form)
    assert "cancelled" not in reply
    _, offer = await phone.caller.post("/twilio/sms", form | {"MessageSid": "SM" + "d" * 32, "Body": "MOVE"})
    assert "1)" not in offer
    assert await phone.db.fetchval("SELECT status FROM answering_bookings") == "booked"
    assert await phone.db.fetchval("SELECT offered FROM answering_bookings") is None
    assert await phone.db.fetchval("SELECT status FROM calendar_events") == "confirmed"
    # On Ada's own line the same text does cancel it.
    _, mine = await phone.caller.post("/twilio/sms", form | {"MessageSid": "SM" + "e" * 32, "To": LINE})
    assert "is cancelled" in mine


async def test_booking_respects_the_owners_rules(phone):
    await _booking_on(phone)
    await phone.db.execute(
        "INSERT INTO calendars (account_id, kind, name) VALUES ($1, 'pepper', 'Pepper')", phone.account_id
    )
    cal = await phone.db.fetchval("SELECT id FROM calendars")
    await phone.db.execute(
        "INSERT INTO calendar_events (account_id, calendar_id, uid, title, starts_at, ends_at, tzid)"
        " VALUES ($1, $2, 'x', 'Dentist', $3, $4, 'UTC')",
        phone.account_id, cal, datetime.combine(DAY, time(11), UTC), datetime.combine(DAY, time(12), UTC),
    )  # fmt: skip
    too_soon = (datetime.now(UTC) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
    far = (DAY + timedelta(days=60)).isoformat()
    attempts = [
        ("18:00", "outside the hours"),  # after working hours
        ("12:05", "was just taken"),  # inside the 15-minute buffer after 11:00-12:00
        ("10:50", "was just taken"),  # its buffer overlaps 11:00
    ]
    responses = [_book(at) for at, _ in attempts]
    responses.append(call_tool("book_appointment", {"appointment_type": "meeting", "start": too_soon,
                                                    "caller_name": "G"}))  # fmt: skip
    responses.append(call_tool("book_appointment", {"appointment_type": "meeting", "start": f"{far}T10:00",
                                                    "caller_name": "G"}))  # fmt: skip
    phone.model.script(*[ScriptedResponse(ms=0, calls=r.calls) for r in responses])
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 5, within=20)
        outputs = [o["output"] for o in session.tool_outputs]
        for (_, expected), output in zip(attempts, outputs, strict=False):
            assert expected in output and output.startswith("Failed"), output
        assert "too soon" in outputs[3] and "too far ahead" in outputs[4]
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM calendar_events") == 1
    assert await phone.db.fetchval("SELECT count(*) FROM staged_writes") == 0


async def test_two_callers_racing_for_one_slot_book_it_once(phone):
    await _booking_on(phone)
    phone.model.script(speak("Hi.", ms=300))  # the second call's greeting
    first = await _forwarded(phone)
    second = await _forwarded(phone, from_=OTHER)
    async with phone.caller.media(first) as a, phone.caller.media(second) as b:
        await phone.until_listening(a)
        await b.wait(lambda: any(m.name.startswith("n") for m in b.marks), what="the second greeting")
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 2)
        phone.model.script(_book(), _book())
        await asyncio.gather(phone.model.respond(0), phone.model.respond(1))
        sessions = phone.model.sessions
        await phone.model.wait_for(lambda: all(s.tool_outputs for s in sessions), within=15)
        outputs = sorted(s.tool_outputs[0]["output"] for s in sessions)
        assert outputs[0].startswith("Done:") and "was just taken" in outputs[1]
        await phone.twilio.wait_for_sent(1, within=10)  # the winner's confirmation
        await asyncio.sleep(0.3)
        await a.hang_up()
        await b.hang_up()
    await _ended(phone, first.call_sid)
    await _ended(phone, second.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM calendar_events WHERE status = 'confirmed'") == 1
    assert await phone.db.fetchval("SELECT count(*) FROM answering_bookings") == 1


async def test_the_model_repeating_itself_books_once(phone):
    await _booking_on(phone)
    twice = ScriptedResponse(ms=0, calls=_book().calls * 2)
    phone.model.script(twice, speak("Booked for ten.", ms=600), _book(), speak("Yes, still booked.", ms=600))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=15)
        await phone.twilio.wait_for_sent(1, within=10)
        await phone.model.respond(0)  # and once more, after it was committed
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 3, within=15)
        assert session.tool_outputs[2]["output"].startswith("Done:")
        await asyncio.sleep(0.8)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM calendar_events") == 1
    assert await phone.db.fetchval("SELECT count(*) FROM answering_bookings") == 1
    sent = await phone.twilio.wait_for_sent(2, within=10)
    await asyncio.sleep(0.3)
    assert len([s for s in phone.twilio.sent if s.to == STRANGER]) == 1  # one confirmation text
    assert len(sent) >= 2


async def test_a_hang_up_before_the_confirmation_played_books_nothing(phone):
    await _booking_on(phone)
    phone.model.script(_book(), speak("You're booked for ten o'clock, see you then.", ms=4000))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM calendar_events") == 0
    assert await phone.db.fetchval("SELECT status FROM staged_writes") == "dropped"
    assert await phone.db.fetchval("SELECT count(*) FROM answering_holds") == 0
    assert not [s for s in phone.twilio.sent if s.to == STRANGER]


async def test_the_session_never_sees_what_is_in_the_calendar(phone):
    await _booking_on(phone, caller_info="Ada works from the Islington office.")
    from core.tools.areas.calendar import book

    await book(phone.db, phone.account_id, datetime.combine(DAY, time(14), UTC), datetime.combine(DAY, time(15), UTC),
               "Merger talk with Bob Dylan", description="secret: project Falcon")  # fmt: skip
    phone.model.script(
        call_tool("check_availability", {"date": DAY.isoformat(), "appointment_type": "meeting", "time": "14:00"}),
        call_tool("check_availability", {"date": DAY.isoformat(), "appointment_type": "meeting"}),
        call_tool("list_events", {"start": DAY.isoformat(), "end": (DAY + timedelta(days=1)).isoformat()}),
        call_tool("add_note", {"text": "caller was here"}),
        speak("Sorry, I can only take a message or book a time."),
    )  # fmt: skip
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "Islington" in session.config["instructions"]
        await phone.model.respond(0)  # each tool result starts the next scripted response
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 4, within=15)
        outputs = [o["output"] for o in session.tool_outputs]
        assert "14:00 is taken" in outputs[0]
        assert "Free start times" in outputs[1] and "14:00" not in outputs[1] and "13:45" not in outputs[1]
        assert outputs[2].startswith("Unknown tool 'list_events'") and outputs[3].startswith("Unknown tool 'add_note'")
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    seen = json.dumps([s.events for s in phone.model.sessions])
    for secret in ("Bob Dylan", "Merger", "Falcon"):
        assert secret not in seen
    assert await phone.db.fetchval("SELECT count(*) FROM notes") == 0


async def test_the_owners_pin_does_not_unlock_an_answering_call(phone):
    phone.model.script(speak("Sorry, I can only take a message."))
    answer = await phone.caller.dial(from_=OWNER, to=ANSWERING_LINE)  # even from the owner's own number
    assert answer.connected
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await call.keypad(PIN + "#")
        await asyncio.sleep(0.5)
        assert set(session.tool_names()) == {"take_message", "end_call"}
        assert len([e for e in session.events if e["type"] == "session.update"]) == 1
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["route"] == "answering" and row["verified_by"] is None


def test_tools_outside_the_profile_are_hidden_and_denied_by_the_gate():
    import uuid

    gate = default_gate().with_policy(ANSWERING_POLICY)
    session = SessionContext(kind="call", trust="third_party", channel="answering", account_id=uuid.uuid4())
    registry = starter_registry()  # every built-in tool, as if the profile's registry leaked them
    assert registry.visible(session, hidden=gate.hides) == []
    for tool in registry.all():
        decision = asyncio.run(gate.decide(tool, {}, session))
        assert not decision.allowed, tool.name
    # And the answering tools are refused everywhere else, even to the verified owner.
    from answering_service.tools import CallerCall, make_tools
    from core.tools.registry import Tool, ToolOutcome

    async def nothing(ctx, args):
        return ToolOutcome.ok("")

    rules = asyncio.run(_no_db_rules())
    end = Tool("end_call", "", {"type": "object", "properties": {}}, nothing, area="answering")
    tools = make_tools(CallerCall("CA1", uuid.uuid4(), None, None, rules), end_call=end)
    owner = SessionContext(kind="live", trust="owner_verified", channel="sms", account_id=uuid.uuid4())
    for tool in tools:
        assert tool.name in PROFILE
        assert not asyncio.run(gate.decide(tool, {}, owner)).allowed
        assert asyncio.run(gate.decide(tool, {}, session)).allowed


async def _no_db_rules():
    import dataclasses
    import uuid

    from answering_service.rules import Rules

    return dataclasses.replace(Rules(uuid.uuid4()), booking_enabled=True)


async def test_screening_refuses_blocked_numbers_and_too_many_calls(phone):
    await _rules(phone, blocked_numbers=(OTHER,), max_calls_per_hour=1)
    blocked = await phone.caller.dial(from_=OTHER, to=LINE, ForwardedFrom=OWNER)
    assert not blocked.connected and "can't take your call" in blocked.twiml
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    again = await phone.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)
    assert not again.connected and "too many calls" in again.twiml
    routes = [r["route"] for r in await phone.db.fetch("SELECT route FROM calls ORDER BY started_at")]
    assert routes == ["blocked", "answering", "refused"]


async def test_a_silent_caller_hears_one_sentence_and_the_call_ends(phone):
    phone.calls.answering.silence_seconds = 0.5
    phone.model.script(speak("I can't hear anyone, so I'm ending the call.", ms=300))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await call.wait(lambda: call.closed.is_set(), within=15, what="Pepper to hang up on silence")
    row = await _ended(phone, answer.call_sid)
    assert row["end_reason"] == "silent-caller"


async def _no_holds(phone):
    return await phone.db.fetchval("SELECT count(*) FROM answering_holds") == 0


def _calendar_part(message):
    [part] = [p for p in message.walk() if p.get_content_type() == "text/calendar"]
    return part


async def test_with_invitations_on_a_caller_who_gave_an_address_gets_an_icalendar_request(phone_mail):
    import icalendar

    phone = phone_mail
    await phone.db.execute("INSERT INTO handles (account_id, kind, value, verified_at) VALUES ($1, 'email',"
                           " 'ada.private@example.org', now())", phone.account_id)  # fmt: skip
    await _booking_on(phone, send_invitations=True)
    phone.model.script(
        _book(email="grace at example"),
        _book(email=" Grace@Example.ORG "),
        speak("You're booked; the invitation is on its way.", ms=600),
    )
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        [tool] = [t for t in session.config["tools"] if t["name"] == "book_appointment"]
        assert "email" in tool["parameters"]["properties"]
        await phone.model.respond(0)
        await phone.twilio.wait_for_sent(1, within=15)  # the booking committed
        assert "that email address is not valid" in session.tool_outputs[0]["output"]
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    [mail] = await phone.smtp.wait_for(1, within=10)
    assert mail.rcpt_to == ["grace@example.org"]
    message = mail.message
    assert message["To"] == "grace@example.org" and message["Cc"] is None
    assert "ada.private@example.org" not in message.as_string()  # the owner's own address stays private
    part = _calendar_part(message)
    assert part.get_param("method") == "REQUEST"
    cal = icalendar.Calendar.from_ical(part.get_content())
    [event] = cal.walk("VEVENT")
    assert str(cal["METHOD"]) == "REQUEST"
    assert str(event["ATTENDEE"]) == "mailto:grace@example.org"
    assert str(event["ORGANIZER"]) == "mailto:pepper@pepper.example.org"
    assert event.decoded("DTSTART") == datetime.combine(DAY, time(10), UTC)
    assert str(event["SUMMARY"]) == "Meeting with Ada"
    row = await phone.db.fetchrow(
        "SELECT b.*, e.uid FROM answering_bookings b JOIN calendar_events e ON e.id = b.event_id"
    )
    assert str(event["UID"]) == row["uid"]  # later updates from the owner's calendar match it
    assert row["caller_email"] == "grace@example.org" and row["invited_at"] is not None and row["invite_error"] is None
    await asyncio.sleep(0.3)
    assert len(phone.smtp.received) == 1  # once, not again when the call ended


async def test_with_invitations_off_no_address_is_asked_for_and_no_mail_goes_out(phone_mail):
    phone = phone_mail
    await _booking_on(phone)
    phone.model.script(_book(email="grace@example.org"), _book(), speak("You're booked.", ms=600))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        [tool] = [t for t in session.config["tools"] if t["name"] == "book_appointment"]
        assert "email" not in tool["parameters"]["properties"]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=15)
        assert session.tool_outputs[0]["output"].startswith("Failed")  # no such argument here
        await phone.twilio.wait_for_sent(1, within=10)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    await asyncio.sleep(0.3)
    assert phone.smtp.received == []
    assert await phone.db.fetchval("SELECT count(*) FROM answering_bookings WHERE invited_at IS NULL") == 1


async def test_a_refused_invitation_is_recorded_and_the_booking_stands(phone_mail):
    phone = phone_mail
    phone.smtp.refuse = 554
    await _booking_on(phone, send_invitations=True)
    await _booked_call(phone, _book(email="grace@example.org"), speak("You're booked.", ms=600))
    await until(lambda: phone.db.fetchval("SELECT invite_error FROM answering_bookings"), what="the mail refused")
    row = await phone.db.fetchrow("SELECT * FROM answering_bookings")
    assert row["status"] == "booked" and row["invited_at"] is not None and "554" in row["invite_error"]
    assert phone.smtp.refused == 1
    assert await phone.db.fetchval("SELECT count(*) FROM calendar_events WHERE status = 'confirmed'") == 1


async def test_a_call_books_one_appointment_and_a_dropped_booking_frees_its_slot(phone):
    await _booking_on(phone)
    phone.model.script(_book("10:00"), speak("You're booked for ten, see you then.", ms=3000))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        await asyncio.sleep(0.3)
        await phone.model.speech_started(0)  # the caller barges in before hearing the confirmation
        await until(lambda: phone.db.fetchval("SELECT status FROM staged_writes WHERE status = 'dropped'"),
                     what="the booking dropped")  # fmt: skip
        await until(lambda: _no_holds(phone), what="the slot freed during the call")
        again = ScriptedResponse("Booked for eleven.", ms=600, calls=_book("12:00").calls)
        phone.model.script(_book("11:00"), again, speak("Sorry, just the one."))
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 3, within=15)
        assert session.tool_outputs[1]["output"].startswith("Done:")
        assert "a call books one appointment" in session.tool_outputs[2]["output"]
        await phone.twilio.wait_for_sent(1, within=10)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    rows = await phone.db.fetch("SELECT starts_at FROM calendar_events WHERE status = 'confirmed'")
    assert [r["starts_at"] for r in rows] == [datetime.combine(DAY, time(11), UTC)]
    title = await phone.db.fetchval("SELECT title FROM calendar_events")
    assert title == 'Meeting booked by phone (name as the caller gave it: "Grace Hopper")'


# --- Trust-boundary limits: anonymous callers, the line's caps, where confirmation texts go -------

UK_MOBILE = "+447400123456"


async def test_anonymous_and_withheld_callers_share_one_hourly_bucket(phone):
    await _rules(phone, max_calls_per_hour=2)
    verdicts = []
    for withheld in ("Anonymous", "+266696687", "", "Restricted"):
        answer = await phone.caller.dial(from_=withheld, to=LINE, ForwardedFrom=OWNER)
        verdicts.append(answer.connected)
        if not answer.connected:
            assert "too many calls" in answer.twiml
    assert verdicts == [True, True, False, False]
    assert await phone.db.fetchval("SELECT count(*) FROM answering_calls WHERE caller IS NULL") == 2
    # A caller with a number of their own still has their own count.
    assert (await phone.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)).connected


async def test_a_line_answers_at_most_its_hourly_calls_from_everyone(phone):
    await _rules(phone, max_calls_per_hour=5, max_line_calls_per_hour=3)
    answers = [await phone.caller.dial(from_=f"+1415555{3000 + i:04d}", to=LINE, ForwardedFrom=OWNER)
               for i in range(5)]  # fmt: skip
    assert [a.connected for a in answers] == [True, True, True, False, False]
    assert "cannot take more calls" in answers[3].twiml
    routes = [r["route"] for r in await phone.db.fetch("SELECT route FROM calls ORDER BY started_at")]
    assert routes == ["answering"] * 3 + ["refused"] * 2


async def test_a_withheld_caller_cannot_book_and_no_number_they_give_is_texted(phone):
    await _booking_on(phone)
    # The model, fooled, passes the number the caller asked for; then tries without it.
    phone.model.script(_book(callback_number=UK_MOBILE), _book(), speak("Sorry, I can take a message.", ms=300))
    answer = await phone.caller.dial(from_="Anonymous", to=LINE, ForwardedFrom=OWNER)
    assert answer.connected
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=15)
        assert session.tool_outputs[0]["output"].startswith("Failed")
        assert "withheld" in session.tool_outputs[1]["output"]
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT count(*) FROM answering_bookings") == 0
    assert await phone.db.fetchval("SELECT count(*) FROM answering_deliveries WHERE kind = 'caller_text'") == 0
    assert not [s for s in phone.twilio.sent if s.to != OWNER]


async def test_a_confirmation_goes_only_to_the_caller_id_never_to_a_number_the_caller_names(phone):
    await _booking_on(phone)
    phone.model.script(_book(callback_number=UK_MOBILE), _book(), speak("You're booked for ten.", ms=600))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=15)
        assert session.tool_outputs[0]["output"].startswith("Failed")  # no such argument
        [sms] = await phone.twilio.wait_for_sent(1, within=15)
        assert sms.to == STRANGER and sms.from_ == LINE
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert not [s for s in phone.twilio.sent if s.to == UK_MOBILE]
    assert await phone.db.fetchval("SELECT caller_number FROM answering_bookings") == STRANGER


async def _book_from(phone, caller, at="10:00"):
    """A forwarded call from ``caller`` that books ``at``; returns the tool's output."""
    phone.model.script(_book(at), speak("You're booked.", ms=600))
    answer = await _forwarded(phone, from_=caller)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await phone.model.respond(len(phone.model.sessions) - 1)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        await until(lambda: phone.db.fetchval("SELECT 1 FROM answering_bookings WHERE call_sid = $1",
                                              answer.call_sid), what="the booking committed")  # fmt: skip
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    return session.tool_outputs[0]["output"]


async def test_a_caller_id_outside_the_allowed_countries_is_not_texted(phone):
    await _booking_on(phone)  # PEPPER_DEFAULT_REGION is US: only US numbers get texts
    output = await _book_from(phone, UK_MOBILE)  # a caller ID anyone can set
    assert "no confirmation text" in output
    await phone.twilio.wait_for_sent(1, within=15)  # the owner's notice
    assert not [s for s in phone.twilio.sent if s.to == UK_MOBILE]
    assert await phone.db.fetchval("SELECT count(*) FROM answering_deliveries WHERE kind = 'caller_text'") == 0
    # The owner can allow the country.
    await _rules(phone, sms_countries=("US", "GB"))
    phone.model.script(speak("Hi.", ms=300))
    await _book_from(phone, "+447400123457", at="11:00")
    sent = await phone.twilio.wait_for_sent(3, within=15)
    assert "+447400123457" in [s.to for s in sent]


async def test_a_line_texts_callers_at_most_its_hourly_cap(phone):
    await _booking_on(phone, max_texts_per_hour=1)
    await _book_from(phone, STRANGER, "10:00")
    phone.model.script(speak("Hi.", ms=300))
    output = await _book_from(phone, OTHER, "11:00")
    assert "no confirmation text" in output

    async def both_notices() -> bool:
        sent = "SELECT count(*) FROM answering_deliveries WHERE kind = 'owner_notice' AND status = 'sent'"
        return await phone.db.fetchval(sent) == 2

    await until(both_notices, what="both owner notices")
    callers = [s.to for s in phone.twilio.sent if s.to != OWNER]
    assert callers == [STRANGER]
    assert await phone.db.fetchval("SELECT count(*) FROM answering_bookings") == 2  # the booking stands


async def test_a_hang_up_the_instant_the_booking_is_confirmed_loses_no_text(phone):
    await _booking_on(phone)
    phone.model.script(_book(), speak("You're booked for ten o'clock.", ms=400))
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await phone.model.respond(0)
        # The caller's phone plays the confirmation, acknowledges its mark and hangs up at once.
        deadline = asyncio.get_running_loop().time() + 15
        while not any(m.name.startswith("c") for m in call.marks):
            await asyncio.sleep(0)  # no poll interval: the hang-up follows the mark immediately
            assert not call.closed.is_set() and asyncio.get_running_loop().time() < deadline, "no confirmation mark"
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    assert await phone.db.fetchval("SELECT status FROM answering_bookings") == "booked"
    sent = await phone.twilio.wait_for_sent(2, within=15)
    assert sorted(s.to for s in sent) == sorted([STRANGER, OWNER])
    [caller_text] = [s for s in sent if s.to == STRANGER]
    assert "booked for" in caller_text.body and caller_text.from_ == LINE
    [notice] = [s for s in sent if s.to == OWNER]
    assert "booked a meeting" in notice.body

    async def both_sent() -> list[tuple[str, str]] | None:
        # "sent" is recorded when Twilio answers, which is after the text reached it.
        rows = await phone.db.fetch("SELECT kind, status FROM answering_deliveries ORDER BY id")
        done = [(r["kind"], r["status"]) for r in rows]
        return done if all(status == "sent" for _, status in done) else None

    assert await until(both_sent, what="both deliveries recorded as sent") == [
        ("caller_text", "sent"),
        ("owner_notice", "sent"),
    ]


async def test_a_replayed_webhook_for_an_ended_forwarded_call_gets_no_stream(phone):
    """Someone who captured the signed webhook of a forwarded call replays it once the call is
    over: the same form, so the same valid signature. No fresh stream token comes back."""
    answer = await _forwarded(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await call.hang_up()
    await _ended(phone, answer.call_sid)
    replay = await phone.caller.dial(from_=STRANGER, to=LINE, call_sid=answer.call_sid, ForwardedFrom=OWNER)
    assert replay.status == 200 and not replay.connected
    assert "<Hangup" in replay.twiml and "call_token" not in replay.twiml
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 1
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "voice-webhook-call-over"


async def test_a_replayed_webhook_for_an_answering_line_call_that_streamed_gets_no_stream(phone):
    """The same replay on an answering line, while the first stream still runs: a second stream
    token would let the replayer join the call."""
    answer = await phone.caller.dial(from_=STRANGER, to=ANSWERING_LINE)
    assert answer.connected, answer.twiml
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        replay = await phone.caller.dial(from_=STRANGER, to=ANSWERING_LINE, call_sid=answer.call_sid)
        assert replay.status == 200 and not replay.connected
        assert "<Hangup" in replay.twiml and "call_token" not in replay.twiml
        await call.hang_up()
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 1
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "voice-webhook-call-over"


async def test_a_retried_webhook_for_a_ringing_forwarded_call_still_gets_a_stream(phone):
    """Twilio retrying the webhook before any stream ran is not a replay: a fresh token."""
    answer = await _forwarded(phone)
    again = await phone.caller.dial(from_=STRANGER, to=LINE, call_sid=answer.call_sid, ForwardedFrom=OWNER)
    assert again.connected, again.twiml
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 2
    assert await phone.db.fetchval("SELECT count(*) FROM security_events") == 0


async def test_a_stream_for_an_answering_call_that_already_ended_is_refused(phone):
    """A stream token issued for a forwarded call that ended before its stream came (the status
    callback said so) admits nothing."""
    answer = await _forwarded(phone)
    assert await phone.caller.status(answer.call_sid, "completed") in (200, 204)
    async with phone.caller.media(answer) as call:
        await call.wait(lambda: call.closed.is_set(), within=5, what="the socket to close")
        assert call.close_code == 1008
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "media-call-over"
    assert not phone.model.sessions  # no model session was opened for it
