"""Pressing a menu's keys on a call Pepper placed (``send_digits``), end to end on the loopback
Twilio: the stream closes, Twilio asks the ``<Connect action>``, plays ``<Play digits>`` to the far
end (an IVR) and opens a new stream on the same call, where the model goes on with the call so far
and a note of the keys it pressed. A forged, repeated or garbage action request plays nothing;
keys that are not DTMF are refused; no inbound call has the tool."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime

from phone_support import LINE, NOTICE, OWNER, PUBLIC, STRANGER, speech, until, verify_by_keypad

from answering_service.rules import load_rules, save_rules
from core.records import calls as call_records
from core.records import digits as digit_records
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.untrusted import CALLER_LABEL
from gateway import cli_calls
from voice.digits import PRESSED_NOTE, PRESSING
from voice.testing.realtime_peer import call_tool, speak
from voice.testing.twilio_caller import Answer, parse_twiml

AFTER_STREAM = "/twilio/voice/after-stream"
BRIEF = "Please book a table for two at seven tonight, under the name Lovelace."
MENU = "Welcome to Luigi's. For reservations, press 1."


async def _place(phone):
    """A task whose call goes to a number the owner approved (a restaurant's menu); the call
    placed and answered: its stream's Answer and the peer's record of the call."""
    now = datetime.now(UTC)
    async with phone.db.transaction() as conn:
        task = await create_task(conn, phone.account_id, title="Book Luigi's", prompt="Book a table.",
                                 schedule=parse_schedule("in 1 minute", now=now, timezone="UTC"), now=now,
                                 deliver_to=("call",))  # fmt: skip
    await phone.db.execute("UPDATE scheduled_tasks SET call_number = $2, call_approved = true WHERE id = $1",
                           task.id, STRANGER)  # fmt: skip
    placed_by_pepper = await phone.calls.outbound.deliver(phone.account_id, task_id=task.id, run_id=None, key=None,
                                                          brief=BRIEF)  # fmt: skip
    assert placed_by_pepper.status == "queued", placed_by_pepper
    [placed] = await phone.twilio.wait_for_calls(1)
    assert placed.to == STRANGER
    status, text = await phone.twilio.answer_call(phone.caller.local, PUBLIC, placed, "human")
    assert status == 200
    parsed = parse_twiml(text)
    return Answer(200, text, placed.sid, parsed["stream_url"], parsed["parameters"], action=parsed["action"]), placed


def _form(phone, placed):
    return phone.twilio.call_form(placed, "in-progress")


async def _cli(phone, *argv):
    parser = argparse.ArgumentParser()
    cli_calls.add_commands(parser.add_subparsers(dest="command"))
    lines: list[str] = []
    assert await cli_calls.run(parser.parse_args(list(argv)), phone.services.settings, phone.db, lines.append)
    return "\n".join(lines)


async def _show(phone, call_sid):
    return await _cli(phone, "calls", "show", call_sid)


async def test_pepper_presses_a_menu_key_and_the_call_goes_on_in_a_new_stream(phone_out):
    phone = phone_out
    phone.model.script(call_tool("send_digits", {"digits": "1"}), speak("", ms=0))
    answer, placed = await _place(phone)
    assert answer.action == f"{PUBLIC}{AFTER_STREAM}"
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        first_stream = call.stream_sid
        first = phone.model.sessions[0]
        assert first.tool_names() == ["end_call", "send_digits"]
        assert "send_digits" in first.config.get("instructions", "")
        phone.model.hear(MENU)
        call.say(speech("hello"))  # the menu speaks; once it stops the model presses 1
        await phone.model.wait_for(lambda: first.tool_outputs, within=15)
        assert PRESSING in first.tool_outputs[0]["output"]
        await call.wait(lambda: call.closed.is_set(), within=15, what="Pepper closing the stream")
    assert placed.digits_heard == []  # nothing pressed while the stream ran
    row = await until(lambda: phone.db.fetchrow("SELECT * FROM call_digits WHERE call_sid = $1", placed.sid))
    assert row["status"] == "pending" and row["digits"] == "1"
    # A forged action request is refused and changes nothing: the keys still wait.
    forged = await phone.twilio.post_form(phone.caller.local, PUBLIC, AFTER_STREAM, _form(phone, placed),
                                          signature="Zm9yZ2Vk")  # fmt: skip
    assert forged[0] == 403
    assert await phone.db.fetchval("SELECT status FROM call_digits WHERE call_sid = $1", placed.sid) == "pending"
    assert placed.digits_heard == []
    # Twilio asks the <Connect action>: <Play digits="1"/>, then a new stream on the same call.
    phone.model.script(speak("Hello, I'd like to book a table for two at seven tonight, under Lovelace."))
    status, text = await phone.twilio.stream_ended(phone.caller.local, PUBLIC, placed, answer.action)
    assert status == 200
    assert placed.digits_heard == ["1"]
    parsed = parse_twiml(text)
    assert parsed["digits"] == ["1"] and parsed.get("stream_url") and parsed["parameters"]["call_token"]
    # The same request again (a retry or a replay) plays nothing and opens no stream.
    status, again = await phone.twilio.stream_ended(phone.caller.local, PUBLIC, placed, answer.action)
    assert status == 200 and placed.digits_heard == ["1"]
    assert parse_twiml(again)["digits"] == [] and "stream_url" not in parse_twiml(again)
    second = Answer(200, text, placed.sid, parsed["stream_url"], parsed["parameters"], action=parsed["action"])
    async with phone.caller.media(second) as call:
        await phone.until_listening(call)
        second_stream = call.stream_sid
        session = phone.model.sessions[1]
        instructions = session.config.get("instructions", "")
        assert BRIEF in instructions  # the same call: the same task and brief
        # The call so far, carried: Pepper's opening, the menu's words and the key pressed.
        assert NOTICE in instructions and "(you pressed 1)" in instructions
        assert f'They: "{MENU}"' in instructions and CALLER_LABEL in instructions  # their words quoted, labelled
        assert PRESSED_NOTE.format(digits="1") in instructions
        await phone.model.wait_for(lambda: any(PRESSED_NOTE.format(digits="1") in n for n in session.notes))
        assert session.response_creates == []  # no notice again: Pepper listens for the menu's next prompt
        assert session.tool_names() == ["end_call", "send_digits"]
        await phone.model.respond(1)  # the restaurant answers; the model speaks again
        await call.wait(lambda: call.heard_ms > 200, within=15, what="Pepper speaking on the new stream")
        await call.hang_up()
    record = await phone.call_row(placed.sid)
    assert record["route"] == "outbound"
    assert await phone.db.fetchval("SELECT count(*) FROM calls WHERE call_sid = $1", placed.sid) == 1
    shown = await _show(phone, placed.sid)
    assert "keys pressed by Pepper: 1" in shown and "played 20" in shown

    # Each stream's engine recorded its own run, and both recordings are kept (the second one's
    # chunks once collided with the first's); each replays on its own.
    async def both_recorded():
        streams = await call_records.load_recordings(phone.db, placed.sid)
        return streams if len(streams) == 2 and all(s.complete for s in streams) else None

    streams = await until(both_recorded)
    assert [s.stream_sid for s in streams] == [first_stream, second_stream]
    assert "recording for replay: complete, 2 media streams" in await _show(phone, placed.sid)
    replayed = await _cli(phone, "replay-call", placed.sid)
    assert replayed.count("replay identical") == 2 and "stream 2 of 2" in replayed, replayed


async def test_keys_that_are_not_dtmf_are_refused_and_nothing_is_played(phone_out):
    phone = phone_out
    phone.model.script(
        call_tool("send_digits", {"digits": "1a"}),
        call_tool("send_digits", {"digits": "1" * 33}),
        speak("Sorry, let me listen again."),
    )
    answer, placed = await _place(phone)
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond(0)
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=15)
        for output in session.tool_outputs[:2]:
            assert "digits" in output["output"] and PRESSING not in output["output"], output
        await call.wait(lambda: call.heard_ms > 200, within=15, what="Pepper speaking after the refusal")
        assert not call.closed.is_set()  # the stream goes on
        await call.hang_up()
    await phone.call_row(placed.sid)
    assert await phone.db.fetchval("SELECT count(*) FROM call_digits") == 0
    status, text = await phone.twilio.stream_ended(phone.caller.local, PUBLIC, placed, answer.action)
    assert status == 200 and parse_twiml(text)["digits"] == [] and placed.digits_heard == []
    # Keys left waiting by a stream that ended for another reason (here the callee hung up) are
    # never played: only a stream closed to press them opens the next.
    assert await digit_records.request(phone.db, placed.sid, phone.account_id, "9", [])
    status, text = await phone.twilio.stream_ended(phone.caller.local, PUBLIC, placed, answer.action)
    assert status == 200 and "stream_url" not in parse_twiml(text) and placed.digits_heard == []
    assert await phone.db.fetchval("SELECT status FROM call_digits WHERE call_sid = $1", placed.sid) == "pending"
    # Garbage action requests play nothing either.
    for garbage in ({}, {"CallSid": "nonsense"}, {"CallSid": placed.sid, "Digits": "1"}):
        status, text = await phone.twilio.post_form(phone.caller.local, PUBLIC, AFTER_STREAM, garbage)
        assert status == 200 and parse_twiml(text)["digits"] == [] and "stream_url" not in parse_twiml(text)
    assert "keys pressed by Pepper: 9  (asked" in await _show(phone, placed.sid)
    assert "not played" in await _show(phone, placed.sid)


async def test_no_inbound_call_is_offered_send_digits(phone):
    # The owner calling in: neither before nor after the PIN.
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "verify_pin" in session.tool_names() and "send_digits" not in session.tool_names()
        await verify_by_keypad(phone, call)
        assert "send_digits" not in session.tool_names() and len(session.tool_names()) > 4
        await call.hang_up()
    # A forwarded caller on the answering line (with every answering tool on).
    rules = await load_rules(phone.db, phone.account_id)
    await save_rules(phone.db, dataclasses.replace(rules, transfer_enabled=True))
    phone.model.script(speak("Hello, you've reached Ada's line."))
    answer = await phone.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)
    assert answer.connected, answer.twiml
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        names = phone.model.sessions[1].tool_names()
        assert "take_message" in names and "send_digits" not in names
        await call.hang_up()
