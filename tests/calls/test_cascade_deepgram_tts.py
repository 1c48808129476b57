"""The cascade with Deepgram Aura speaking (PEPPER_VOICE_CASCADE_TTS=deepgram), end to end with real
audio: piper speech from the loopback Twilio caller -> Silero VAD -> Deepgram STT (the loopback
peer transcribes with the local Whisper) -> the scripted text model -> the deepgram SDK's
``/v1/speak`` websocket to the loopback peer, which really speaks (piper, converted to the 8 kHz
mu-law Pepper asks for) -> the caller, whose playback is transcribed again with Whisper."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from phone_support import LINE, OWNER, speech
from test_cascade import FORECAST, NOTICE, Line, _ended, _line, _listening, _reply_played, assert_heard, heard_words

from core.store import Database
from core.testing.peers import Reply
from voice.adapters.cascade import local_speech
from voice.testing.deepgram_peer import DeepgramPeer
from voice.testing.twilio_caller import MediaCall

KEY = "dg-live-0123456789abcdef0123456789abcdef"  # distinctive, so a leak into the logs is found
LONG = ("Here is the whole forecast for Paris this week, which will be warm and sunny every day with a light "
        "breeze in the afternoon and cool, clear evenings that are good for a walk along the river.")  # fmt: skip
AFTER = "Yes, it will be sunny."


@functools.cache
def piper_pcm(text: str) -> tuple[bytes, int]:
    """The peer's voice. Kept per text: the peer says all of a sentence once piper is done (real
    Deepgram streams as it goes), and on a loaded machine piper takes longer over the long reply
    than the adapter waits for audio before it gives the sentence to piper (5 s)."""
    tts = local_speech().tts
    return tts.pcm_sync(text), tts.rate


@pytest.fixture(scope="module")
def speech_models() -> Any:
    speech = local_speech()
    speech.tts.without_noise()  # the words a caller hears are checked: the same audio every run
    return speech


@pytest.fixture
async def deepgram(speech_models: Any) -> AsyncIterator[DeepgramPeer]:
    async with DeepgramPeer(transcribe=speech_models.stt.transcribe_sync, synthesize=piper_pcm, api_key=KEY) as peer:
        yield peer


@pytest.fixture
async def line(db: Database, db_url: str, deepgram: DeepgramPeer) -> AsyncIterator[Line]:
    async with _line(db, db_url, deepgram_api_key=KEY, deepgram_api_url=deepgram.base_url,
                     voice_cascade_tts="deepgram") as line:  # fmt: skip
        yield line


async def _turn(line: Line, call: MediaCall, requests: int) -> None:
    call.say(speech("weather"))
    await line.until(lambda: len(line.model.requests) >= requests, what="the caller's turn to reach the model")


async def test_deepgram_speaks_the_replies_in_mulaw_8k_and_the_key_stays_out_of_the_logs(line, deepgram, caplog):
    caplog.set_level(logging.DEBUG)  # websockets logs handshake headers at DEBUG (it redacts the key)
    line.model.script(Reply(text=NOTICE), Reply(text=FORECAST))
    answer = await line.caller.dial(from_=OWNER, to=LINE)
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        assert_heard(NOTICE, await heard_words(call))
        heard_before = len(call.heard)
        await _turn(line, call, 2)
        await _reply_played(line, call, replies=2)
        assert_heard(FORECAST, await heard_words(call, heard_before))
        await call.hang_up()
    await _ended(line, answer.call_sid)
    # One socket for the call, asking for what Twilio plays as is; a Speak and a Flush per sentence.
    assert deepgram.speak_queries == [{"model": "aura-2-thalia-en", "encoding": "mulaw", "sample_rate": "8000"}]
    assert deepgram.speak_messages[:4] == ["Speak", "Flush", "Speak", "Flush"]
    assert deepgram.speak_messages[-1] == "Close"
    assert [q.get("model") for q in deepgram.queries] == ["nova-3"]  # the caller's turn went to Deepgram STT too
    # All the caller heard came from Deepgram: no sentence fell back to piper.
    assert call.received_media_bytes <= deepgram.audio_sent
    assert "piper speaks" not in caplog.text
    assert any(r.name.startswith("websockets") for r in caplog.records)  # the DEBUG records were made
    assert KEY not in caplog.text


async def test_barge_in_clears_deepgram_and_the_next_reply_comes_over_the_same_socket(line, deepgram):
    deepgram.pace = 0.1  # 100 ms of audio each 100 ms: the long reply is still being made when cut
    await asyncio.to_thread(piper_pcm, LONG)  # made before the call: the peer sends it at once
    line.model.script(Reply(text=NOTICE), Reply(text=LONG), Reply(text=AFTER))
    answer = await line.caller.dial(from_=OWNER, to=LINE)
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        notice_sent = deepgram.audio_sent
        await _turn(line, call, 2)
        await call.wait(lambda: deepgram.audio_sent - notice_sent >= 8000, within=30, what="a second of the reply")
        heard_before = len(call.heard)
        await _turn(line, call, 3)  # the caller talks over the long reply
        assert call.clears, "Twilio was never told to clear"
        await line.until(lambda: "Clear" in deepgram.speak_messages, what="Clear on the Deepgram socket")
        long_audio = len(local_speech().tts.mulaw_sync(LONG))
        said = "SELECT count(*) FROM messages WHERE channel = 'voice' AND direction = 'outbound' AND body = $1"
        for _ in range(3000):
            if await line.db.fetchval(said, AFTER):
                break
            await asyncio.sleep(0.01)
        sent_marks = lambda: sum(1 for f in call.received if f.get("event") == "mark")  # noqa: E731
        await call.wait(lambda: len(call.marks) >= sent_marks(), within=10, what="the reply to play")
        assert_heard(AFTER, await heard_words(call, heard_before))
        await call.hang_up()
    await _ended(line, answer.call_sid)
    # Deepgram stopped making the long reply: far less than all of it was sent.
    assert deepgram.audio_sent < notice_sent + long_audio
    assert len(deepgram.speak_queries) == 1  # the socket was kept: Cleared was read, then the next reply
    cleared_at = deepgram.speak_messages.index("Clear")
    assert deepgram.speak_messages[cleared_at + 1 : cleared_at + 3] == ["Speak", "Flush"]
    assert await line.db.fetchval(said, AFTER) == 1


async def test_a_dropped_deepgram_socket_mid_sentence_is_spoken_by_piper_and_the_call_goes_on(line, deepgram, caplog):
    line.model.script(Reply(text=NOTICE), Reply(text=FORECAST), Reply(text=AFTER))
    answer = await line.caller.dial(from_=OWNER, to=LINE)
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        deepgram.speak_faults.append("drop")  # 100 ms of the forecast, then close 1011
        heard_before = len(call.heard)
        await _turn(line, call, 2)
        await _reply_played(line, call, replies=2)
        assert_heard(FORECAST, await heard_words(call, heard_before))  # piper said all of it
        heard_before = len(call.heard)
        await _turn(line, call, 3)
        await _reply_played(line, call, replies=3)
        assert_heard(AFTER, await heard_words(call, heard_before))
        await call.hang_up()
    row = await _ended(line, answer.call_sid)
    assert row["end_reason"] == "hangup"
    assert len(deepgram.speak_queries) == 2  # the next sentence opened a fresh socket
    assert [r for r in caplog.records if "piper speaks" in r.getMessage()]
    assert KEY not in caplog.text


async def test_deepgram_unreachable_or_warning_falls_back_to_piper_per_sentence(speech_models, deepgram):
    from voice.adapters.cascade import CascadeModel, _load
    from voice.adapters.deepgram_tts import DeepgramTTS, TextToSpeechFailed

    wrong = DeepgramTTS("dg-wrong", base_url=deepgram.base_url).for_call()
    with pytest.raises(TextToSpeechFailed, match="status 401"):
        async with asyncio.timeout(10):
            [piece async for piece in wrong.synthesize("Hello.")]
    await wrong.aclose()
    speech_out = DeepgramTTS(KEY, base_url=deepgram.base_url)
    call = speech_out.for_call()
    deepgram.speak_faults.append("warning")
    with pytest.raises(TextToSpeechFailed, match="SCRIPTED"):
        [piece async for piece in call.synthesize("Hello.")]
    pieces = [piece async for piece in call.synthesize("Hello there.")]  # a fresh socket after the failure
    assert pieces and all(len(p) <= 800 for p in pieces) and len(deepgram.speak_queries) == 2
    await call.aclose()
    await speech_out.aclose()
    # The engine loads piper beside a provider's speech, to speak what the provider fails on.
    engine = CascadeModel(models=None, tts=DeepgramTTS(KEY, base_url=deepgram.base_url))  # type: ignore[arg-type]
    await engine._speech()
    assert engine._fallback is _load("piper")
    await engine.aclose()


def test_piper_stays_the_default_with_a_deepgram_key_and_deepgram_is_chosen_by_setting():
    from test_cascade import _engine_for

    from core.models.router import ModelRouter
    from voice.adapters.deepgram_tts import DeepgramTTS

    router = ModelRouter({"anthropic": object()}, {})  # type: ignore[dict-item]
    assert _engine_for(router, deepgram_api_key=KEY)._tts is None  # piper, loaded on the first call
    chosen = _engine_for(router, deepgram_api_key=KEY, voice_cascade_tts="deepgram")._tts
    assert isinstance(chosen, DeepgramTTS) and chosen.model == "aura-2-thalia-en"
    assert _engine_for(router, voice_cascade_tts="deepgram")._tts is None  # no key: piper, with a warning
