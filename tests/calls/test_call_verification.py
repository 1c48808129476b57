"""Proving who the caller is, attacked: a fooled model firing many guesses at once, wrong PINs
spread over calls, a model reading the PIN back, and one-time codes asked for again and again.
The realtime peer plays the model already fooled; the checks that hold are Pepper's code."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from phone_support import NOTICE, OWNER, PIN, until

from core import identity
from voice import verification
from voice.testing.realtime_peer import ScriptedResponse, call_tool, speak


def _many(*calls: tuple[str, dict]) -> ScriptedResponse:
    """One model response carrying all these tool calls (they run side by side)."""
    return ScriptedResponse(ms=0, calls=tuple(calls))


async def _wrong_pins_on_a_call(phone, *pins: str) -> None:
    """One owner call keying in these wrong PINs one after another, then hanging up."""
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        for n, pin in enumerate(pins, start=1):
            await call.keypad(pin + "#")
            await phone.model.wait_for(lambda n=n: sum("keyed in a wrong PIN" in x for x in session.notes) >= n)
        await call.hang_up()
    await phone.call_row(answer.call_sid)


async def test_many_pin_guesses_in_one_response_are_checked_one_at_a_time_and_stop_at_the_limit(phone):
    guesses = [f"{n:04d}" for n in range(10)] + [PIN]  # the right PIN comes 11th
    phone.model.script(_many(*(("verify_pin", {"digits": g}) for g in guesses)),
                       speak("Sorry, I couldn't verify you. Goodbye."))  # fmt: skip
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 11, within=30)
        outputs = [o["output"] for o in session.tool_outputs]
        assert not any("PIN correct" in o for o in outputs)
        assert sum("Not checked: the call is ending." in o for o in outputs) == 8
        assert "add_todo" not in session.tool_names()
        await call.wait(lambda: call.closed.is_set(), within=20, what="Pepper to end the call")
    row = await phone.call_row(answer.call_sid)
    assert row["verified_by"] is None and row["end_reason"] == "verification-failed"
    assert json.loads(row["stats"])["verify_failures"] == 3
    wrong = await phone.db.fetchval("SELECT count(*) FROM call_verification_attempts WHERE kind = 'pin-wrong'")
    assert wrong == 3


async def test_wrong_pins_across_calls_lock_the_pin_tell_the_owner_and_the_texted_code_still_gets_in(phone):
    """Two wrong PINs a call stays under each call's limit; the hour's count from the number does
    not. The caller may be spoofing the owner's number, so the line still answers and the code
    texted to the verified phone still works; only the PIN is refused, unchecked."""
    for pins in (("0000", "1111"), ("2222", "3333"), ("4444",)):
        await _wrong_pins_on_a_call(phone, *pins)
    [notice] = await phone.twilio.wait_for_sent(1)
    assert notice.to == OWNER and "too many wrong PINs" in notice.body
    assert await phone.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'call-pin-locked'") == 1
    assert await phone.db.fetchval("SELECT count(*) FROM call_verification_attempts WHERE kind = 'pin-wrong'") == 5

    # The model answers the refusal by offering a code (send_code).
    phone.model.script(speak(NOTICE), call_tool("send_code"), speak("I've texted you a code."))
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await call.keypad(PIN + "#")  # the right PIN, refused unchecked
        await phone.model.wait_for(lambda: any("cannot be used on calls for now" in x for x in session.notes))
        assert "add_todo" not in session.tool_names()
        sms = (await phone.twilio.wait_for_sent(2, within=15))[1]
        code = re.search(r"\d{6}", sms.body).group(0)
        assert sms.to == OWNER
        updates = len([e for e in session.events if e["type"] == "session.update"])
        await call.keypad(code + "#")
        await phone.model.wait_for(lambda: len([e for e in session.events if e["type"] == "session.update"]) > updates)
        assert "add_todo" in session.tool_names()
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["verified_by"] == "sms-code-keypad"
    # The refused PIN was not counted: the lock lapses as the wrong ones age out of the hour.
    assert await phone.db.fetchval("SELECT count(*) FROM call_verification_attempts WHERE kind = 'pin-wrong'") == 5


async def _settled(phone, session, creates: int) -> None:
    """Until Pepper has asked for ``creates`` responses and the peer has finished the last one."""

    async def done() -> bool:
        conn = phone.model._conns[-1]
        return len(session.response_creates) >= creates and (conn.response_task is None or conn.response_task.done())

    await until(done, within=15, what=f"response {creates} to finish")


async def test_the_pin_lock_counts_per_number_and_per_account_over_a_sliding_hour(db):
    ada = await identity.create_account(db, "Ada")
    limits = {"attested": False, "per_source": 3, "per_account": 5, "window": 3600.0}

    async def wrong(source: str, age: timedelta = timedelta(0)) -> None:
        await verification.record_wrong(db, ada.id, source, "CA1", verification.WRONG_PIN, **limits)
        await db.execute(
            "UPDATE call_verification_attempts SET created_at = now() - $1::interval"
            " WHERE id = (SELECT max(id) FROM call_verification_attempts WHERE kind = 'pin-wrong')",
            age,
        )

    async def locked(source: str) -> bool:
        return await verification.pin_locked(db, ada.id, source, **limits)

    for _ in range(3):
        await wrong("+14155550001", timedelta(minutes=61))  # older than the hour: not counted
    assert not await locked("+14155550001")
    await wrong("+14155550001")
    await wrong("+14155550001")
    assert not await locked("+14155550001")
    await wrong("+14155550001")
    assert await locked("+14155550001")  # three from this number within the hour
    await wrong("+14155550002")
    assert not await locked("+14155550002")  # one from this number, four of five for the account
    await wrong("+14155550002")
    assert await locked("+14155550003")  # five for the account: every number is refused the PIN
    # Calls the carrier vouched for (attestation A) are counted apart: none of these lock them.
    assert not await verification.pin_locked(db, ada.id, "+14155550001", **(limits | {"attested": True}))


async def test_a_model_reading_the_pin_back_leaves_no_digits_tried_in_the_records(phone):
    phone.model.script(
        ScriptedResponse(text="Let me try one three five seven.", ms=300, calls=(("verify_pin", {"digits": "1357"}),)),
        speak("That one was wrong."),
        ScriptedResponse(text="Let me check two four six eight.", ms=300, calls=(("verify_pin", {"digits": PIN}),)),
        speak("Done: your PIN 2468 worked, not 1 3 5 7. I can call 415 555 0100 for you."),
    )
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 1, within=15)
        await _settled(phone, session, 2)
        await phone.model.respond()
        await phone.model.wait_for(lambda: "add_todo" in session.tool_names(), within=15)

        async def said_all() -> bool:
            return await phone.db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound'") >= 5

        await until(said_all, what="every line Pepper said")
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    bodies = [r["body"] for r in await phone.db.fetch("SELECT body FROM messages ORDER BY id")]
    assert "Let me try [digits withheld]." in bodies and "Let me check [digits withheld]." in bodies
    assert "Done: your PIN [digits withheld] worked, not [digits withheld]. I can call 415 555 0100 for you." in bodies
    rounds = await phone.db.fetchval("SELECT rounds::text FROM turns WHERE id = $1", row["turn_id"])
    records = json.dumps(bodies) + rounds
    for said in ("2468", "two four six eight", "1357", "1 3 5 7", "one three five seven"):
        assert said not in records


async def test_codes_are_capped_per_call_and_per_hour_and_a_wrong_check_burns_the_code(phone):
    phone.model.script(_many(("send_code", {}), ("send_code", {}), ("send_code", {})), speak("Texted."))
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 3, within=15)
        outputs = [o["output"] for o in session.tool_outputs]
        assert sum(o.startswith("A six-digit code was texted") for o in outputs) == 2
        assert any("this call has had all the codes it can have" in o for o in outputs)
        sent = await phone.twilio.wait_for_sent(2)
        code = re.search(r"\d{6}", sent[-1].body).group(0)
        wrong = f"{(int(code) + 1) % 10**6:06d}"
        await _settled(phone, session, 2)
        phone.model.script(call_tool("check_code", {"digits": wrong}), speak("That code was wrong."))
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 4, within=15)
        assert "did not match" in session.tool_outputs[3]["output"]
        await _settled(phone, session, 3)
        phone.model.script(call_tool("check_code", {"digits": code}), speak("Still no."))
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 5, within=15)
        assert "no code is waiting" in session.tool_outputs[4]["output"]  # burnt by the wrong check
        assert "add_todo" not in session.tool_names()
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["verified_by"] is None
    assert len(phone.twilio.sent) == 2

    phone.model.script(speak(NOTICE), call_tool("send_code"), speak("Sorry."))
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await phone.model.respond()
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        assert "too many codes were texted in the last hour" in session.tool_outputs[0]["output"]
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    assert len(phone.twilio.sent) == 2


async def test_a_spoofer_of_the_owners_number_cannot_lock_out_the_owner_calling_from_their_own_phone(phone):
    """The spoofer's calls carry no SHAKEN/STIR attestation A; the owner's own phone does. The
    spoofer locks the PIN and uses up the codes for unattested calls only."""
    phone.tune(pin_failures_per_source=2)
    await _wrong_pins_on_a_call(phone, "0000", "1111")  # the spoofer: PIN locked
    phone.model.script(speak(NOTICE), _many(("send_code", {}), ("send_code", {})), speak("Texted."))
    answer = await phone.dial_owner()  # the spoofer again: the hour's codes
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await phone.model.respond()
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 2, within=15)
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    assert len(phone.twilio.sent) == 3  # the lock notice and two codes, all on the owner's phone

    answer = await phone.dial_owner(StirVerstat="TN-Validation-Passed-A")  # the owner, from their phone
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        updates = len([e for e in session.events if e["type"] == "session.update"])
        await call.keypad(PIN + "#")
        await phone.model.wait_for(lambda: len([e for e in session.events if e["type"] == "session.update"]) > updates)
        assert "add_todo" in session.tool_names()
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["verified_by"] == "pin-keypad"

    answer = await phone.dial_owner(StirVerstat="No-TN-Validation")  # the spoofer: still locked
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[-1]
        await call.keypad(PIN + "#")
        await phone.model.wait_for(lambda: any("cannot be used on calls for now" in x for x in session.notes))
        assert "add_todo" not in session.tool_names()
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["verified_by"] is None
