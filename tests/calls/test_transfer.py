"""Putting a caller through to the owner, end to end on the loopback Twilio: the answering
service's ``transfer_to_owner``, the ``<Dial>`` with its whisper, a second leg that answers or
rings out, and a caller back with Pepper taking a message."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

from phone_support import LINE, OWNER, PUBLIC, STRANGER, until

from answering_service.rules import load_rules, save_rules
from voice.testing.realtime_peer import call_tool, speak
from voice.testing.twilio_caller import Answer, new_sid, parse_twiml
from voice.transfer import RETURNED_NOTE, RETURNED_NOTICE

AFTER_STREAM = "/twilio/voice/after-stream"
WHISPER = "/twilio/voice/transfer/whisper"
AFTER_DIAL = "/twilio/voice/transfer/after"


async def _put_through(phone):
    """A forwarded caller asks for the owner: Pepper says so and closes the stream; the <Dial>."""
    rules = await load_rules(phone.db, phone.account_id)
    await save_rules(phone.db, dataclasses.replace(rules, transfer_enabled=True))
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
