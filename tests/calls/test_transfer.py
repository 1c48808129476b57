"""Putting a caller through to the owner, end to end on the loopback Twilio: the answering
service's ``transfer_to_owner``, the ``<Dial>`` with its whisper, a second leg that answers or
rings out, and a caller back with Pepper taking a message; the same on calls Pepper placed to a
number the owner approved, and on the owner's line for a caller who has not proved who they are
(never for the owner themselves)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

from phone_support import LINE, NOTICE, OWNER, PIN, PUBLIC, STRANGER, until, verify_by_keypad

from answering_service.rules import load_rules, save_rules
from core import identity
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from voice.testing.realtime_peer import call_tool, speak
from voice.testing.twilio_caller import Answer, new_sid, parse_twiml
from voice.transfer import OFFER_NOTE, RETURNED_NOTE, RETURNED_NOTICE, RETURNED_PASS_ON, RETURNED_PASS_ON_NOTE

AFTER_STREAM = "/twilio/voice/after-stream"
WHISPER = "/twilio/voice/transfer/whisper"
AFTER_DIAL = "/twilio/voice/transfer/after"


SECOND = "+14155553333"  # the owner's other phone (verified after OWNER: OWNER is the one rung)
TOOL = "transfer_to_owner"


async def _transfers_on(phone):
    rules = await load_rules(phone.db, phone.account_id)
    await save_rules(phone.db, dataclasses.replace(rules, transfer_enabled=True))


async def _put_through(phone):
    """A forwarded caller asks for the owner: Pepper says so and closes the stream; the <Dial>."""
    await _transfers_on(phone)
    phone.model.script(
        call_tool("transfer_to_owner", {"caller_name": "Grace Hopper", "reason": "the compiler talk"}),
        speak("Putting you through now."),
        speak("One moment."),
    )
    answer = await phone.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)
    assert answer.connected, answer.twiml
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "transfer_to_owner" in session.tool_names()
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "Putting the caller through" in session.tool_outputs[0]["output"]
        await call.wait(lambda: call.closed.is_set(), within=15, what="Pepper closing the stream")
    status, text = await phone.caller.post(AFTER_STREAM, _form(phone, answer.call_sid))
    assert status == 200
    return answer, ET.fromstring(text)


def _form(phone, call_sid, **extra):
    return {"CallSid": call_sid, "AccountSid": phone.twilio.account_sid, "From": STRANGER, "To": LINE,
            "CallStatus": "in-progress", "Direction": "inbound", **extra}  # fmt: skip


async def test_a_caller_the_owner_does_not_pick_up_for_comes_back_and_leaves_a_message(phone):
    answer, dial_twiml = await _put_through(phone)
    dial = dial_twiml.find("Dial")
    assert dial is not None and dial.get("action") == f"{PUBLIC}{AFTER_DIAL}"
    assert dial.get("callerId") == LINE and int(dial.get("timeout")) > 0
    number = dial.find("Number")
    assert number is not None and number.text == OWNER and number.get("url") == f"{PUBLIC}{WHISPER}"
    # The owner's phone picks up the whisper request (the child leg) before anyone is bridged.
    status, whisper = await phone.caller.post(
        WHISPER, _form(phone, new_sid("CA"), ParentCallSid=answer.call_sid, Direction="outbound-dial")
    )
    assert status == 200
    said = " ".join(parse_twiml(whisper)["says"])
    assert "Grace Hopper" in said and "compiler talk" in said
    # Garbage and forgeries are refused, and change nothing.
    assert (await phone.caller.post(AFTER_DIAL, {"DialCallStatus": "no-answer"}))[0] == 400
    forged = await phone.caller.post(AFTER_DIAL, _form(phone, answer.call_sid, DialCallStatus="no-answer"),
                                     signature="Zm9yZ2Vk")  # fmt: skip
    assert forged[0] == 403
    # The owner does not pick up: back to Pepper on the same call, a new stream.
    phone.model.script(
        speak(RETURNED_NOTICE),
        call_tool("take_message", {"caller_name": "Grace Hopper", "reason": "the compiler talk",
                                   "urgency": "normal", "number_confirmed": True}),
        speak("I'll pass that on."),
    )  # fmt: skip
    status, back = await phone.caller.post(AFTER_DIAL, _form(phone, answer.call_sid, DialCallStatus="no-answer"))
    assert status == 200
    parsed = parse_twiml(back)
    assert parsed.get("stream_url")
    # Twilio retrying the action does not open the call twice.
    again = await phone.caller.post(AFTER_DIAL, _form(phone, answer.call_sid, DialCallStatus="no-answer"))
    assert "stream_url" not in parse_twiml(again[1])
    second = Answer(200, back, answer.call_sid, parsed["stream_url"], parsed["parameters"])
    async with phone.caller.media(second) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[1]
        assert RETURNED_NOTE in session.config.get("instructions", "")
        assert "transfer_to_owner" not in session.tool_names()
        assert RETURNED_NOTICE in session.response_creates[0]["instructions"]
        await phone.model.respond(1)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "message is saved" in session.tool_outputs[0]["output"]
        await call.hang_up()
    [sms] = await phone.twilio.wait_for_sent(1, within=10)
    assert sms.to == OWNER and "Grace Hopper" in sms.body
    row = await until(lambda: phone.db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", answer.call_sid))
    assert row["status"] == "returned" and row["dial_status"] == "no-answer"


async def test_a_caller_the_owner_picks_up_for_is_bridged_and_pepper_hangs_up_after(phone):
    answer, _ = await _put_through(phone)
    status, text = await phone.caller.post(AFTER_DIAL, _form(phone, answer.call_sid, DialCallStatus="completed"))
    assert status == 200
    parsed = parse_twiml(text)
    assert parsed["hangup"] and "stream_url" not in parsed
    row = await phone.db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", answer.call_sid)
    assert row["status"] == "connected"


# --- Calls Pepper placed, and the owner's line ----------------------------------------------------


async def _asks_to_be_put_through(phone, answer, name, reason, *, index=0):
    """On the call's stream: the model puts the caller through; Pepper says so and closes the stream."""
    phone.model.script(call_tool(TOOL, {"caller_name": name, "reason": reason}), speak("Putting you through now."),
                       speak("One moment."))  # fmt: skip
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[index]
        assert TOOL in session.tool_names()
        assert OFFER_NOTE in session.config.get("instructions", "")
        await phone.model.respond(index)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "Putting the caller through" in session.tool_outputs[0]["output"]
        await call.wait(lambda: call.closed.is_set(), within=15, what="Pepper closing the stream")


async def _dial_twiml(phone, form):
    status, text = await phone.caller.post(AFTER_STREAM, form)
    assert status == 200 and "<Dial" in text, text
    # Twilio asking again (a retried action) dials nobody twice.
    again = await phone.caller.post(AFTER_STREAM, form)
    assert "<Dial" not in again[1] and parse_twiml(again[1])["hangup"]
    return text


async def _back_with_pepper(phone, leg, call_sid, *, index=1):
    """The owner did not pick up: the caller is back with Pepper on the same call, told so, and
    not offered the transfer again."""
    parsed = parse_twiml(leg.twiml)
    assert parsed.get("stream_url"), leg.twiml
    phone.model.script(speak(RETURNED_PASS_ON))
    second = Answer(200, leg.twiml, call_sid, parsed["stream_url"], parsed["parameters"])
    async with phone.caller.media(second) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[index]
        assert RETURNED_PASS_ON_NOTE in session.config.get("instructions", "")
        assert TOOL not in session.tool_names()
        assert "did not pick up" in session.response_creates[0]["instructions"]
        await call.hang_up()
    row = await until(lambda: phone.db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", call_sid))
    assert row["status"] == "returned" and row["dial_status"] == "no-answer"


async def _dentist_call(phone, *, to=STRANGER):
    """A task the owner approved a number for (``to``), delivered by a call a person answers."""
    now = datetime.now(UTC)
    async with phone.db.transaction() as conn:
        task = await create_task(conn, phone.account_id, title="Book a cleaning at the dentist",
                                 prompt="Ask for a cleaning.", schedule=parse_schedule("in 1 minute", now=now,
                                 timezone="UTC"), now=now, deliver_to=("call",))  # fmt: skip
    if to != OWNER:
        await phone.db.execute("UPDATE scheduled_tasks SET call_number = $2, call_approved = true WHERE id = $1",
                               task.id, to)  # fmt: skip
    placed_now = await phone.calls.outbound.deliver(phone.account_id, task_id=task.id, run_id=None, key=None,
                                                    brief="Ada would like a cleaning next week.")  # fmt: skip
    assert placed_now.status == "queued", placed_now
    [placed] = await phone.twilio.wait_for_calls(1)
    assert placed.to == to
    status, text = await phone.twilio.answer_call(phone.caller.local, PUBLIC, placed, "human")
    parsed = parse_twiml(text)
    assert status == 200 and parsed.get("stream_url"), text
    return placed, Answer(200, text, placed.sid, parsed["stream_url"], parsed["parameters"])


async def test_the_person_pepper_called_is_put_through_the_owner_hears_the_whisper_then_is_bridged(phone_out):
    phone = phone_out
    await _transfers_on(phone)
    placed, answer = await _dentist_call(phone)
    await _asks_to_be_put_through(phone, answer, "Nora at the front desk", "which day suits for the cleaning")
    form = phone.twilio.call_form(placed, "in-progress")
    dial = await _dial_twiml(phone, form)
    # Garbage and a forgery of the <Dial> action are refused and change nothing.
    assert (await phone.caller.post(AFTER_DIAL, {"DialCallStatus": "completed"}))[0] == 400
    forged = await phone.caller.post(AFTER_DIAL, {**form, "DialCallStatus": "no-answer"}, signature="Zm9yZ2Vk")
    assert forged[0] == 403
    forged_whisper = await phone.caller.post(WHISPER, {**form, "ParentCallSid": placed.sid}, signature="Zm9yZ2Vk")
    assert forged_whisper[0] == 403
    row = await phone.db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", placed.sid)
    assert row["status"] == "dialing" and row["dial_status"] is None  # still ringing the owner
    assert await phone.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'twilio-signature-invalid'") == 2
    leg = await phone.caller.follow_dial(dial, form, answers=True)
    assert leg.number == OWNER and leg.caller_id == LINE
    said = " ".join(leg.whisper)
    assert "Book a cleaning at the dentist" in said and "Nora at the front desk" in said and "which day" in said
    assert leg.bridged and leg.status == 200 and parse_twiml(leg.twiml)["hangup"]
    assert "stream_url" not in parse_twiml(leg.twiml)
    row = await phone.db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", placed.sid)
    assert row["status"] == "connected" and row["to_number"] == OWNER
    # Twilio retrying the action once bridged opens nothing.
    again = await phone.caller.post(AFTER_DIAL, {**form, "DialCallStatus": "no-answer"})
    assert "stream_url" not in parse_twiml(again[1])


async def test_the_person_pepper_called_comes_back_when_the_owner_does_not_pick_up(phone_out):
    phone = phone_out
    await _transfers_on(phone)
    placed, answer = await _dentist_call(phone)
    await _asks_to_be_put_through(phone, answer, "Nora", "the cleaning")
    form = phone.twilio.call_form(placed, "in-progress")
    leg = await phone.caller.follow_dial(await _dial_twiml(phone, form), form, answers=False)
    assert leg.dial_status == "no-answer" and leg.whisper == []
    await _back_with_pepper(phone, leg, placed.sid)
    # The attempt's receipt says so (pepper calls show).
    await until(lambda: phone.db.fetchval("SELECT receipt FROM outbound_calls WHERE call_sid = $1 AND receipt LIKE"
                                          " '%put through to you, who did not pick up'", placed.sid),
                what="the receipt")  # fmt: skip


async def test_a_call_pepper_placed_to_the_owner_never_offers_to_put_them_through(phone_out):
    phone = phone_out
    await _transfers_on(phone)
    await identity.add_handle(phone.db, phone.account_id, "phone", SECOND, verified=True)
    _, answer = await _dentist_call(phone, to=OWNER)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert TOOL not in session.tool_names() and TOOL not in session.config.get("instructions", "")
        phone.model.script(speak("You're verified."))
        await verify_by_keypad(phone, call, PIN)
        assert TOOL not in session.tool_names()
        await call.hang_up()


async def test_someone_at_the_owner_s_other_phone_is_put_through_and_bridged(phone):
    await _transfers_on(phone)
    await identity.add_handle(phone.db, phone.account_id, "phone", SECOND, verified=True)
    answer = await phone.caller.dial(from_=SECOND, to=LINE)
    assert answer.connected, answer.twiml
    await _asks_to_be_put_through(phone, answer, "Charles, Ada's brother", "dinner on Sunday")
    form = {"CallSid": answer.call_sid, "AccountSid": phone.twilio.account_sid, "From": SECOND, "To": LINE,
            "CallStatus": "in-progress", "Direction": "inbound"}  # fmt: skip
    leg = await phone.caller.follow_dial(await _dial_twiml(phone, form), form, answers=True)
    # The other verified number rings, never the one calling.
    assert leg.number == OWNER and leg.caller_id == LINE
    said = " ".join(leg.whisper)
    assert "one of your own numbers" in said and "not proved" in said and "Charles" in said and "Sunday" in said
    assert leg.bridged and parse_twiml(leg.twiml)["hangup"]


async def test_someone_at_the_owner_s_other_phone_comes_back_when_the_owner_does_not_pick_up(phone):
    await _transfers_on(phone)
    await identity.add_handle(phone.db, phone.account_id, "phone", SECOND, verified=True)
    answer = await phone.caller.dial(from_=SECOND, to=LINE)
    await _asks_to_be_put_through(phone, answer, "Charles", "dinner")
    form = {"CallSid": answer.call_sid, "AccountSid": phone.twilio.account_sid, "From": SECOND, "To": LINE,
            "CallStatus": "in-progress", "Direction": "inbound"}  # fmt: skip
    leg = await phone.caller.follow_dial(await _dial_twiml(phone, form), form, answers=False)
    await _back_with_pepper(phone, leg, answer.call_sid)


async def test_the_verified_owner_is_never_offered_a_transfer_to_themselves(phone):
    await _transfers_on(phone)
    # Only one number: the caller's own; nothing to put them through to, before or after the PIN.
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        assert TOOL not in phone.model.sessions[0].tool_names()
        await call.hang_up()
    # Two numbers: offered to whoever is at the other phone until they prove they are the owner.
    await identity.add_handle(phone.db, phone.account_id, "phone", SECOND, verified=True)
    phone.model.script(speak(NOTICE, ms=300))  # the second call's notice
    answer = await phone.caller.dial(from_=SECOND, to=LINE)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[1]
        assert TOOL in session.tool_names()
        phone.model.script(speak("You're verified."))
        await verify_by_keypad(phone, call, PIN)
        await phone.model.wait_for(lambda: TOOL not in session.tool_names())
        assert OFFER_NOTE not in session.config.get("instructions", "")
        await call.hang_up()


async def test_a_stranger_calling_the_owner_s_own_line_may_be_put_through_by_the_answering_service(phone):
    # PEPPER_VOICE_UNKNOWN_CALLER=answering: a stranger on the personal line gets the answering
    # service (never the owner's session), and with it the transfer.
    phone.calls.unknown_caller = "answering"
    await _transfers_on(phone)
    answer = await phone.caller.dial(from_=STRANGER, to=LINE)
    assert answer.connected, answer.twiml
    phone.model.script(call_tool(TOOL, {"caller_name": "Grace", "reason": "the talk"}), speak("Putting you through."),
                       speak("One moment."))  # fmt: skip
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert TOOL in session.tool_names() and "verify_pin" not in session.tool_names()
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        await call.wait(lambda: call.closed.is_set(), within=15, what="Pepper closing the stream")
    form = _form(phone, answer.call_sid)
    leg = await phone.caller.follow_dial(await _dial_twiml(phone, form), form, answers=True)
    assert leg.number == OWNER and "A caller who says they are Grace" in " ".join(leg.whisper) and leg.bridged
    row = await phone.db.fetchrow("SELECT route FROM calls WHERE call_sid = $1", answer.call_sid)
    assert row["route"] == "answering"
