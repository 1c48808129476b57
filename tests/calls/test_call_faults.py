"""Call faults end to end: the model's socket dropping at awkward moments, and the end of a call
as Twilio sees it (the after-stream request comes the instant Pepper closes the socket)."""

from __future__ import annotations

import dataclasses
import json

from phone_support import LINE, NOTICE, OWNER

from voice.testing.realtime_peer import speak


async def test_a_model_socket_that_drops_while_the_notice_plays_is_replaced_and_the_call_starts(phone):
    phone.model.pace = 0.2  # the notice streams slowly: the drop lands while it plays
    phone.model.script(speak(NOTICE, ms=300))  # what the second socket says: the notice again
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await call.wait(lambda: call.received_media_bytes > 0, what="the notice to start playing")
        first = phone.model.sessions[0]
        assert not any(m.name.startswith("n") for m in call.marks)  # the notice has not finished
        await phone.model.drop(0)
        phone.model.pace = 0.01
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 2)
        second = phone.model.sessions[1]
        assert first.closed
        # The new socket is asked for the notice; its mark goes out, and the call starts listening
        # (well before the notice watch would end the call, 5 s in these tests).
        await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=4, what="the notice mark")
        assert "Say exactly this" in second.response_creates[0]["instructions"]
        await phone.model.wait_for(lambda: second.first_audio_at is not None, within=4)
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"
    assert json.loads(row["stats"])["model_reconnects"] == 1


async def test_the_after_stream_request_the_instant_pepper_hangs_up_hears_the_apology(phone):
    """Twilio asks for the ``<Connect action>`` TwiML as soon as Pepper closes the media socket.
    The call's records are held up here (its turn row locked), as a busy store would: the end
    reason must already be there when that request comes."""
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await phone.model.drop(0)
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 2)
        turn_id = await phone.db.fetchval("SELECT turn_id FROM calls WHERE call_sid = $1", answer.call_sid)
        async with phone.db.transaction() as conn:
            await conn.execute("SELECT 1 FROM turns WHERE id = $1 FOR NO KEY UPDATE", turn_id)
            await phone.model.drop(1)
            await call.wait(lambda: call.closed.is_set(), within=10, what="Pepper to end the call")
            status, twiml = await phone.caller.post("/twilio/voice/after-stream", {"CallSid": answer.call_sid})
            assert status == 200
            assert "<Say>Sorry, I lost the connection" in twiml and "<Hangup" in twiml
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "model-failed"


async def test_a_socket_that_closed_with_no_end_written_hears_the_apology_and_an_ended_call_does_not(phone):
    """What Twilio asks after a media process died holding the call (killed, it wrote nothing): the
    call is held, with no end, so the caller hears the apology rather than a dead line. A call that
    ended normally (the caller hung up: no end reason stored first) still just hangs up."""
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        # The state a SIGKILLed holder leaves (the socket drop itself is scripts/suite-crash's).
        status, twiml = await phone.caller.post("/twilio/voice/after-stream", {"CallSid": answer.call_sid})
        assert status == 200 and "<Say>Sorry, I lost the connection" in twiml and "<Hangup" in twiml
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["end_reason"] == "hangup"
    status, twiml = await phone.caller.post("/twilio/voice/after-stream", {"CallSid": answer.call_sid})
    assert status == 200 and "<Hangup" in twiml and "<Say" not in twiml
    # A call that never streamed (no holder) is not apologised for either.
    unstreamed = await phone.dial_owner()
    status, twiml = await phone.caller.post("/twilio/voice/after-stream", {"CallSid": unstreamed.call_sid})
    assert status == 200 and "<Say" not in twiml


async def test_a_replayed_voice_webhook_for_an_ended_call_gets_no_stream(phone):
    """Someone who captured a signed voice webhook replays it once the call is over: the same
    form, so the same valid signature. No fresh stream token comes back."""
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    replay = await phone.caller.dial(from_=OWNER, to=LINE, call_sid=answer.call_sid)
    assert replay.status == 200 and not replay.connected
    assert "<Hangup" in replay.twiml and "call_token" not in replay.twiml
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 1
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "voice-webhook-call-over"


async def test_a_stream_for_a_call_that_already_ended_is_refused(phone):
    """A stream token issued for a call that ended before its stream came (the status callback
    said so) admits nothing."""
    answer = await phone.dial_owner()
    assert await phone.caller.status(answer.call_sid, "completed") in (200, 204)
    async with phone.caller.media(answer) as call:
        await call.wait(lambda: call.closed.is_set(), within=5, what="the socket to close")
        assert call.close_code == 1008
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "media-call-over"
    assert not phone.model.sessions  # no model session was opened for it


async def test_a_model_handshake_that_hangs_is_given_up_and_the_next_one_answers_the_call(phone):
    # The provider hangs on the first handshake (far past websockets' own 10 s open timeout).
    phone.calls.deps.config = dataclasses.replace(phone.calls.deps.config, model_open_timeout=0.5)
    phone.model.refusals.hold = 60.0
    phone.model.script(speak(NOTICE, ms=300))
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.model.wait_for(lambda: phone.model.refusals.held_at, within=5)
        # Given up after the open timeout; the second handshake opens and the notice is asked of it.
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 1, within=5)
        await call.wait(lambda: call.received_media_bytes > 0, within=5, what="the notice from the second session")
        assert "Say exactly this" in phone.model.sessions[0].response_creates[0]["instructions"]
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"
    assert json.loads(row["stats"])["model_reconnects"] == 1
