"""A Realtime response that speaks several items (a preamble, then the answer): each item's
playback is tracked to its end, and a barge-in cuts every item to what the caller heard."""

from __future__ import annotations

from voice.testing.realtime_peer import ScriptedResponse, speak, tone


async def test_a_barge_in_during_a_preamble_truncates_it_and_the_answer_after_it(phone):
    answer = speak("You have two todos.", audio=tone(800, hz=880))
    phone.model.script(ScriptedResponse(text="Let me check.", audio=tone(800, hz=660), then=(answer,)))
    call_answer = await phone.dial_owner()
    async with phone.caller.media(call_answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        heard = call.heard_ms
        await phone.model.respond(0)
        await call.wait(lambda: call.heard_ms > heard + 300, what="some of the preamble to play")
        await phone.model.speech_started(0)
        await phone.model.wait_for(lambda: len(session.truncates) >= 2)
        cut = {t["item_id"]: t["audio_end_ms"] for t in session.truncates}
        first, second = sorted(cut)
        assert 100 <= cut[first] < 800  # the preamble, cut where the caller stopped hearing it
        assert cut[second] == 0  # the answer, never heard
        await call.hang_up()
