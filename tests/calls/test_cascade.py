"""The cascaded voice engine end to end with real audio: espeak-ng speech from the loopback Twilio
caller -> Silero VAD -> faster-whisper -> Pepper's text model (router, OpenAI adapter, SDK, over the
wire to the loopback OpenAI peer, scripted) -> piper -> mu-law back to the caller, whose playback is
transcribed again with faster-whisper. Pepper runs on a real server over a fresh database."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from phone_support import LINE, OWNER, STRANGER, TOKEN, _set_pin, caller_for, speech

from answering_service.rules import load_rules, save_rules
from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, Reply, ScriptedCall
from core.testing.twilio_peer import TwilioPeer
from gateway.server import running_app
from voice.adapters.cascade import local_speech
from voice.codec import audioop
from voice.testing.twilio_caller import MediaCall, TwilioCaller

PUBLIC = "https://pepper.example.org"
NOTICE = "Hi, this is Pepper."
FORECAST = "Tomorrow will be warm and sunny in Rome."
VERIFIED = "Thanks, you're verified."


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", text.lower()))


async def heard_words(call: MediaCall, since: int = 0) -> set[str]:
    """What the caller heard (from byte ``since``), transcribed by the same local Whisper model."""
    pcm = audioop.ulaw2lin(bytes(call.heard[since:]), 2)
    return words(await asyncio.to_thread(local_speech().stt.transcribe_sync, pcm))


def assert_heard(expected: str, heard: set[str]) -> None:
    """Every word came back. Piper speaks without its sampled noise here (``speech_models``), so the
    audio, and Whisper's transcript of it, are the same every run; with the noise, tiny.en misheard
    a word or two now and then ("Paris" -> "pairs", "will" -> "we'll")."""
    missing = words(expected) - heard
    assert not missing, f"missing {missing} from {heard}"


def spoken(text: str) -> bytes:
    """Caller speech made by piper at test time: Whisper tiny.en cannot make out espeak-ng's digits."""
    return local_speech().tts.mulaw_sync(text)


@dataclass
class Line:
    db: Database
    twilio: TwilioPeer
    model: OpenAIPeer
    caller: TwilioCaller
    services: Any
    account_id: Any

    @property
    def engine(self) -> Any:
        return self.services.calls.deps.model

    def model_inputs(self) -> list[list[dict[str, Any]]]:
        return [r.body.get("input") or [] for r in self.model.requests]

    async def until(self, predicate: Any, within: float = 20.0, what: str = "the condition") -> None:
        deadline = asyncio.get_running_loop().time() + within
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def speech_models() -> Any:
    speech = local_speech()  # once for the module: about a second on two cores
    speech.tts.without_noise()  # the words a caller hears are checked: the same audio every run
    return speech


@asynccontextmanager
async def _line(db: Database, db_url: str, **extra: Any) -> AsyncIterator[Line]:
    """Pepper on the cascade over a fresh database; ``extra`` settings on top (a speech provider)."""
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await _set_pin(db, ada.id)
    await identity.assign_line(db, LINE, "personal", ada.id)
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        settings = Settings(
            database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
            twilio_api_url=twilio.api_url, openai_api_key="sk-test", openai_base_url=model.base_url,
            voice_engine="cascade", voice_notice=NOTICE, voice_notice_audio="model",
            port=0, media_port=0, graceful_timeout=2,
            memory_jobs_interval=0, scheduler_enabled=False, **extra,
        )  # fmt: skip
        async with running_app(settings, db) as (app, port):
            caller = caller_for(app, port, twilio)
            services = app.extensions["pepper"]
            yield Line(db, twilio, model, caller, services, ada.id)


@pytest.fixture
async def line(db: Database, db_url: str, speech_models: Any) -> AsyncIterator[Line]:
    async with _line(db, db_url) as line:
        yield line


async def _listening(line: Line, call: MediaCall) -> None:
    await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=20, what="the notice mark")


async def test_real_speech_in_is_transcribed_answered_by_the_text_model_and_spoken_back(line):
    assert line.engine.name == "cascade"
    line.model.script(Reply(text=NOTICE), Reply(text=FORECAST))
    answer = await line.caller.dial(from_=OWNER, to=LINE)
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        assert_heard(NOTICE, await heard_words(call))  # the notice, spoken by piper
        heard_before = len(call.heard)
        call.say(speech("weather"))  # espeak-ng
        await line.until(lambda: len(line.model.requests) >= 2, what="the caller's turn to reach the model")
        said = [m for m in line.model_inputs()[1] if m.get("role") == "user"]
        assert {"weather", "paris"} <= words(str(said[-1]))  # Whisper heard the caller
        await _reply_played(line, call, replies=2)
        assert_heard(FORECAST, await heard_words(call, heard_before))
        await call.hang_up()
    row = await _ended(line, answer.call_sid)
    assert row["end_reason"] == "hangup"
    said = await line.db.fetch("SELECT direction, body FROM messages WHERE channel = 'voice' ORDER BY created_at")
    assert any(r["direction"] == "inbound" and "paris" in r["body"].lower() for r in said)
    assert any(r["direction"] == "outbound" and r["body"] == FORECAST for r in said)
    timings = line.engine.timings
    assert timings.stt and timings.tts and timings.first_audio


async def test_a_spoken_pin_reaches_verify_pin_through_the_gate_and_unlocks_the_call(line):
    line.model.script(
        Reply(text=NOTICE),
        Reply(tool_calls=(ScriptedCall("verify_pin", {"digits": "2468"}),)),
        Reply(text=VERIFIED),
    )
    answer = await line.caller.dial(from_=OWNER, to=LINE)
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        first = line.model.requests[0].body
        assert "verify_pin" in {t.get("name") for t in first.get("tools") or []}
        heard_before = len(call.heard)
        call.say(spoken("My PIN is two four six eight."))
        await line.until(lambda: len(line.model.requests) >= 3, what="the tool result to reach the model")
        outputs = [m for m in line.model_inputs()[2] if m.get("type") == "function_call_output"]
        assert outputs and "PIN correct" in outputs[-1]["output"]
        # The same connection was reconfigured: the model now sees the verified tool set.
        assert "verify_pin" not in {t.get("name") for t in line.model.requests[2].body.get("tools") or []}
        await _reply_played(line, call, replies=2)
        assert_heard(VERIFIED, await heard_words(call, heard_before))
        await call.hang_up()
    row = await _ended(line, answer.call_sid)
    assert row["verified_by"] == "pin-spoken"
    # The caller's digits never reach the records.
    assert await line.db.fetchval("SELECT count(*) FROM messages WHERE body LIKE '%2468%'") == 0


async def test_an_answering_call_takes_a_spoken_message_and_the_owner_gets_it(line):
    await identity.assign_line(line.db, "+14155550101", "answering", line.account_id)
    import dataclasses

    rules = await load_rules(line.db, line.account_id)
    await save_rules(line.db, dataclasses.replace(rules, greeting="Hi, you've reached Ada's assistant."))
    line.model.script(
        Reply(text="Hi, you have reached Ada's assistant."),
        Reply(tool_calls=(ScriptedCall("take_message", {"caller_name": "Grace", "reason": "The compiler talk",
                                                        "urgency": "normal", "number_confirmed": True}),)),
        Reply(text="Thanks, I will pass that on."),
    )  # fmt: skip
    answer = await line.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)
    assert answer.connected, answer.twiml
    async with line.caller.media(answer) as call:
        await _listening(line, call)
        call.say(spoken("This is Grace. Please tell Ada about the compiler talk."))
        await line.until(lambda: len(line.model.requests) >= 2, what="the caller's message to reach the model")
        said = [m for m in line.model_inputs()[1] if m.get("role") == "user"]
        assert {"grace", "compiler", "talk"} <= words(str(said[-1]))
        await line.until(lambda: len(line.model.requests) >= 3, what="the message to be taken")
        outputs = [m for m in line.model_inputs()[2] if m.get("type") == "function_call_output"]
        assert outputs and "message is saved" in outputs[-1]["output"]
        await call.hang_up()
    [sms] = await line.twilio.wait_for_sent(1, within=10)
    assert sms.to == OWNER and '"Grace"' in sms.body and '"The compiler talk"' in sms.body
    row = await _until_row(line, "SELECT * FROM answering_calls WHERE call_sid = $1 AND summary IS NOT NULL",
                           answer.call_sid)  # fmt: skip
    assert "compiler" in str(row["transcript"]).lower()


async def _reply_played(line: Line, call: MediaCall, replies: int) -> None:
    """Pepper's ``replies``-th line is recorded (all its audio was sent) and the caller has played it."""
    count = "SELECT count(*) FROM messages WHERE channel = 'voice' AND direction = 'outbound'"
    for _ in range(3000):
        if await line.db.fetchval(count) >= replies:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("Pepper's reply was never recorded")
    await call.wait(lambda: len(call.heard) >= call.received_media_bytes, within=10, what="the reply to play")


async def _until_row(line: Line, query: str, *args: Any) -> Any:
    for _ in range(1000):
        row = await line.db.fetchrow(query, *args)
        if row is not None:
            return row
        await asyncio.sleep(0.01)
    raise AssertionError("the call was never recorded as ended")


async def _ended(line: Line, call_sid: str) -> Any:
    return await _until_row(line, "SELECT * FROM calls WHERE call_sid = $1 AND summary IS NOT NULL", call_sid)


# --- The engine's parts, without a call ---------------------------------------------------------


def _engine_for(models: Any = None, **settings: Any) -> Any:
    from voice.service import voice_deps_from_settings

    deps = voice_deps_from_settings(Settings(**settings), None, registry=None, gate=None, send_sms=None,
                                    models=models)  # fmt: skip
    return deps.model


def test_the_engine_is_chosen_by_settings_and_auto_is_the_cascade_without_an_openai_key():
    from core.models.router import ModelRouter

    with_a_provider = ModelRouter({"anthropic": object()}, {})  # type: ignore[dict-item]
    no_provider = ModelRouter({}, {})
    assert _engine_for(with_a_provider, openai_api_key="sk-test").name == "openai-realtime"
    assert _engine_for(with_a_provider).name == "cascade"
    assert _engine_for(with_a_provider, openai_api_key="sk-test", voice_engine="cascade").name == "cascade"
    assert _engine_for(no_provider) is None  # nothing could answer: calls apologise at once
    assert _engine_for(with_a_provider, voice_engine="openai-realtime") is None
    with pytest.raises(ValueError):
        Settings(voice_engine="telepathy")


async def test_each_call_gets_its_own_vad_state_on_one_shared_model():
    from pipecat.audio.vad.vad_analyzer import VADState

    from voice.adapters.cascade import TurnDetection, silero_vad

    audio = audioop.ulaw2lin(b"\xff" * 4000 + speech("weather") + b"\xff" * 8000, 2)
    first, second = silero_vad(TurnDetection()), silero_vad(TurnDetection())
    assert first._model.session is second._model.session
    states = []
    for at in range(0, len(audio), 320):  # 20 ms frames, as a call feeds them
        states.append(await first.analyze_audio(audio[at : at + 320]))
        if at < 16000:
            assert await second.analyze_audio(b"\0" * 320) == VADState.QUIET  # silence beside speech
    assert VADState.SPEAKING in states and states[-1] == VADState.QUIET
    spoke = [i for i, s in enumerate(states) if s == VADState.SPEAKING]
    assert 0.6 < (spoke[0] * 0.02) < 1.0  # speech starts 0.5 s in; the VAD decides 0.2 s later
    await first.cleanup()
    await second.cleanup()


async def test_a_cancelled_response_stops_speaking_and_truncate_keeps_only_what_was_heard(speech_models):
    from core.models.adapters.openai_responses import OpenAIResponsesAdapter
    from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
    from voice.adapters.cascade import CascadeModel
    from voice.realtime import AssistantTranscript, AudioDelta, ResponseDone, SessionConfig

    long = "First sentence here. " + " ".join(f"Then sentence number {n}." for n in range(2, 30))
    async with OpenAIPeer() as peer:
        adapter = OpenAIResponsesAdapter(api_key="sk-test", base_url=peer.base_url, timeout=10.0)
        router = ModelRouter({OPENAI: adapter}, {"small": Tier("small", (ModelChoice("gpt-small"),))})
        peer.script(Reply(text=long), Reply(text="Sorry."))
        engine = CascadeModel(router)
        async with engine.connect() as conn:
            await conn.configure(SessionConfig("Be brief.", ()))
            await conn.create_response()
            events = conn.events()
            seen: list[Any] = []
            async for event in events:
                seen.append(event)
                if type(event) is AudioDelta:
                    await conn.cancel_response()
                if type(event) is ResponseDone:
                    break
            done = seen[-1]
            assert done.status == "cancelled"
            [said] = [e for e in seen if type(e) is AssistantTranscript]
            assert said.text.startswith("First sentence here.") and "29" not in said.text  # it stopped early
            await conn.truncate(said.item_id, 1000)  # the caller heard one second of it
            await conn.create_response()
            async for event in events:
                if type(event) is ResponseDone:
                    break
        await router.aclose()
    [assistant] = [m for m in peer.requests[1].body["input"] if m.get("role") == "assistant"]
    heard = str(assistant["content"])
    assert "First" in heard and "[interrupted]" in heard and "number 5" not in heard


async def test_deepgram_speech_to_text_through_the_sdk_and_a_failed_turn_leaves_the_call_going(speech_models):
    from core.models.adapters.openai_responses import OpenAIResponsesAdapter
    from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
    from voice.adapters.deepgram_stt import DeepgramSTT
    from voice.realtime import ModelErrorEvent, ResponseDone, SessionConfig, UserTranscript
    from voice.testing.deepgram_peer import DeepgramPeer

    turn = [base64.b64encode(f).decode() for f in _frames(speech("weather"))]
    async with OpenAIPeer() as peer, DeepgramPeer(transcribe=speech_models.stt.transcribe_sync) as deepgram:
        settings = dict(deepgram_api_key="dg-test", deepgram_api_url=deepgram.base_url)
        router = ModelRouter({OPENAI: OpenAIResponsesAdapter(api_key="sk-test", base_url=peer.base_url)},
                             {"small": Tier("small", (ModelChoice("gpt-small"),))})  # fmt: skip
        engine = _engine_for(router, **settings)
        assert isinstance(engine._stt, DeepgramSTT)
        assert not isinstance(_engine_for(router, voice_cascade_stt="whisper", **settings)._stt, DeepgramSTT)
        peer.script(Reply(text="Sunny."))
        deepgram.faults.append(503)
        async with engine.connect() as conn:
            await conn.configure(SessionConfig("Be brief.", ()))
            seen: list[Any] = []
            events = conn.events()
            for payload in turn:  # Deepgram fails this turn: an error event, no reply
                await conn.append_audio(payload)
            async for event in events:
                seen.append(event)
                if type(event) is ModelErrorEvent:
                    break
            assert seen[-1].code == "stt-failed"  # not retried: the caller is waiting
            for payload in turn:  # the caller says it again
                await conn.append_audio(payload)
            async for event in events:
                seen.append(event)
                if type(event) is ResponseDone:
                    break
        await engine.aclose()
        await router.aclose()
    [heard] = [e for e in seen if type(e) is UserTranscript]
    assert {"weather", "paris"} <= words(heard.text)
    assert [q.get("model") for q in deepgram.queries] == ["nova-3", "nova-3"]
    assert {"weather", "paris"} <= words(str(peer.requests[0].body["input"]))


def _frames(mulaw: bytes, quiet_ms: int = 700) -> list[bytes]:
    audio = mulaw + b"\xff" * (quiet_ms * 8)
    return [audio[i : i + 160] for i in range(0, len(audio), 160)]


# --- Word accuracy: a quiet caller's first words ------------------------------------------------

QUIET_CALLER = Path(__file__).resolve().parent / "data" / "quiet_caller"  # scripts/quiet-caller-fixtures


def quiet_lines() -> dict[str, str]:
    return json.loads((QUIET_CALLER / "lines.json").read_text())


async def _transcripts(conn: Any, events: AsyncIterator[Any], audio: bytes, turns: int) -> list[str]:
    """Feed ``audio`` in 20 ms frames and read the ``turns`` transcripts it makes (bounded)."""
    from voice.realtime import UserTranscript

    for at in range(0, len(audio), 160):
        await conn.append_audio(base64.b64encode(audio[at : at + 160]).decode())
    heard: list[str] = []
    async with asyncio.timeout(60):
        async for event in events:
            if type(event) is UserTranscript:
                heard.append(event.text)
                if len(heard) == turns:
                    return heard
    raise AssertionError("the events ended")


async def test_a_quiet_callers_first_words_reach_the_transcript(speech_models):
    """Piper lines at a quiet caller's level (-41 dBFS), on which Silero decides 0.5-1.2 s into the
    utterance: every word said comes back, the first one too (Whisper hears each whole file so).
    And a loud line (espeak-ng), on which it decides 0.36 s in: the second of quiet before it is
    not handed to Whisper, which then hears "Paris today" as "Pakistanade"."""
    from core.testing.scripted import ScriptedModels, reply
    from voice.adapters.cascade import CascadeModel
    from voice.realtime import SessionConfig

    engine = CascadeModel(ScriptedModels(default=reply("")))  # no reply: nothing to synthesise
    heard: dict[str, str] = {}
    async with engine.connect() as conn:
        await conn.configure(SessionConfig("Be brief.", ()))
        events = conn.events()
        for name in quiet_lines():
            turn = b"\xff" * 8000 + (QUIET_CALLER / f"{name}.ulaw").read_bytes() + b"\xff" * 5600
            [heard[name]] = await _transcripts(conn, events, turn, 1)
        [loud] = await _transcripts(conn, events, b"\xff" * 8000 + speech("weather") + b"\xff" * 5600, 1)
    wrong = {name: text for name, text in heard.items() if words_in_order(text) != words_in_order(quiet_lines()[name])}
    assert not wrong, f"misheard: {wrong}"
    assert {"weather", "paris", "today"} <= words(loud), loud


async def test_the_lead_in_never_reaches_back_into_the_previous_turn(speech_models):
    """Two turns with only the VAD's half second of quiet between them: no audio of the first turn
    is transcribed again as the second's lead-in, and each transcript has its own words."""
    from core.testing.scripted import ScriptedModels, reply
    from voice.adapters.cascade import CascadeModel
    from voice.realtime import SessionConfig

    class Recording:  # the local Whisper, keeping what it was given
        def __init__(self) -> None:
            self.turns: list[bytes] = []

        async def transcribe(self, pcm: bytes) -> str:
            self.turns.append(pcm)
            return await speech_models.stt.transcribe(pcm)

    stt = Recording()
    first, second = (QUIET_CALLER / "train.ulaw").read_bytes(), (QUIET_CALLER / "sister.ulaw").read_bytes()
    engine = CascadeModel(ScriptedModels(default=reply("")), stt=stt)
    turns = b"\xff" * 8000 + first + b"\xff" * 4400 + second + b"\xff" * 5600
    async with engine.connect() as conn:
        await conn.configure(SessionConfig("Be brief.", ()))
        heard = await _transcripts(conn, conn.events(), turns, 2)
    assert len(stt.turns) == 2
    assert sum(len(pcm) // 2 for pcm in stt.turns) <= len(turns)  # no sample went to Whisper twice
    assert words_in_order(heard[0]) == words_in_order(quiet_lines()["train"])
    assert words_in_order(heard[1]) == words_in_order(quiet_lines()["sister"])


def words_in_order(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


# --- Latency: the encoder's window, the transcript while the VAD waits, the first phrase --------


async def test_a_short_turn_is_encoded_in_a_15_s_window_and_a_long_one_to_its_end(speech_models, monkeypatch):
    """Whisper's encoder costs far more for its full 30 s window than for 15 s, and hears a short
    turn as well in 15 s (the word-accuracy test above runs so); a turn longer than that gets the
    turn and a second."""
    from faster_whisper import WhisperModel

    windows: list[int] = []
    encode = WhisperModel.encode

    def recording(self: Any, features: Any) -> Any:
        windows.append(features.shape[-1])
        return encode(self, features)

    monkeypatch.setattr(WhisperModel, "encode", recording)
    short = audioop.ulaw2lin((QUIET_CALLER / "weather.ulaw").read_bytes(), 2)
    heard = await speech_models.stt.transcribe(short)
    assert words_in_order(heard) == words_in_order(quiet_lines()["weather"])
    assert windows == [1500]
    names = list(quiet_lines())
    gap = b"\0\0" * 2400
    long = gap.join(audioop.ulaw2lin((QUIET_CALLER / f"{n}.ulaw").read_bytes(), 2) for n in names)
    assert len(long) > 16 * 8000 * 2  # over 16 s of 8 kHz PCM: past the 15 s window
    heard = words(await speech_models.stt.transcribe(long))
    assert windows[1] == len(long) // 160 + 100  # 10 ms frames of the 16 kHz audio (as many samples as bytes here)
    assert words(quiet_lines()[names[0]]) <= heard and words(quiet_lines()[names[-1]]) <= heard


def _voiced(mulaw: bytes) -> bytes:
    """``mulaw`` without the quiet before and after its words (20 ms frames 30 dB below the loudest)."""
    pcm = audioop.ulaw2lin(mulaw, 2)
    levels = [audioop.rms(pcm[at : at + 320], 2) for at in range(0, len(pcm), 320)]
    loud = [n for n, level in enumerate(levels) if level > max(levels) / 30]
    return mulaw[loud[0] * 160 : (loud[-1] + 1) * 160]


class RecordingWhisper:
    """The local Whisper, keeping what it was given."""

    def __init__(self, stt: Any) -> None:
        self.stt = stt
        self.turns: list[bytes] = []

    async def transcribe(self, pcm: bytes) -> str:
        self.turns.append(pcm)
        return await self.stt.transcribe(pcm)


async def test_the_turn_is_transcribed_while_the_vad_waits_out_its_quiet_and_a_pause_starts_over(speech_models):
    """Whisper starts 0.2 s into the VAD's 0.5 s of quiet after the caller's last word, so the
    transcript is ready about when the turn ends: it is given the turn as it stood then, about
    0.3 s shorter than at the end. When the caller goes on after such a pause, that early transcript is
    dropped and the turn's transcript has all of it."""
    from core.testing.scripted import ScriptedModels, reply
    from voice.adapters.cascade import CascadeModel
    from voice.realtime import SessionConfig

    turn = b"\xff" * 8000 + (QUIET_CALLER / "train.ulaw").read_bytes() + b"\xff" * 5600
    given: dict[str, list[bytes]] = {}
    for how, early in (("early", 200), ("at the end", None)):
        stt = RecordingWhisper(speech_models.stt)
        engine = CascadeModel(ScriptedModels(default=reply("")), stt=stt, early_stt_ms=early)
        async with engine.connect() as conn:
            await conn.configure(SessionConfig("Be brief.", ()))
            [heard] = await _transcripts(conn, conn.events(), turn, 1)
        assert words_in_order(heard) == words_in_order(quiet_lines()["train"]), how
        given[how] = stt.turns
    [early_audio], [late_audio] = given["early"], given["at the end"]
    assert late_audio.startswith(early_audio)
    # 0.3 s of 8 kHz PCM, give or take a frame: the VAD decides on 32 ms windows, the call sends 20 ms
    assert 0.25 * 16000 <= len(late_audio) - len(early_audio) <= 0.35 * 16000

    stt = RecordingWhisper(speech_models.stt)
    engine = CascadeModel(ScriptedModels(default=reply("")), stt=stt)
    first, second = (_voiced((QUIET_CALLER / f"{n}.ulaw").read_bytes()) for n in ("train", "sister"))
    paused = b"\xff" * 8000 + first + b"\xff" * 2400 + second + b"\xff" * 5600  # 0.3 s between the words
    async with engine.connect() as conn:
        await conn.configure(SessionConfig("Be brief.", ()))
        [heard] = await _transcripts(conn, conn.events(), paused, 1)
    assert len(stt.turns) == 2  # the pause started one, for nothing
    said = quiet_lines()["train"] + " " + quiet_lines()["sister"]
    assert words_in_order(heard) == words_in_order(said)


async def test_the_replys_first_phrase_is_spoken_before_the_rest_of_its_first_sentence(speech_models):
    """Piper's time grows with the audio it makes, and the caller waits for the first piece only."""
    from core.testing.scripted import ScriptedModels, reply
    from voice.adapters.cascade import CascadeModel, first_phrase_end
    from voice.realtime import AssistantTranscript, ResponseDone, SessionConfig

    class RecordingPiper:
        def __init__(self) -> None:
            self.texts: list[str] = []

        async def synthesize(self, text: str) -> AsyncIterator[bytes]:
            self.texts.append(text)
            async for audio in speech_models.tts.synthesize(text):
                yield audio

    tts = RecordingPiper()
    reply_text = FORECAST + " Take a hat."
    engine = CascadeModel(ScriptedModels(default=reply(reply_text)), tts=tts)
    engine._fallback = speech_models.tts
    async with engine.connect() as conn:
        await conn.configure(SessionConfig("Be brief.", ()))
        await conn.create_response()
        seen = []
        async with asyncio.timeout(60):
            async for event in conn.events():
                seen.append(event)
                if type(event) is ResponseDone:
                    break
    assert tts.texts == ["Tomorrow will be warm", "and sunny in Rome.", "Take a hat."]
    [said] = [e for e in seen if type(e) is AssistantTranscript]
    assert said.text == reply_text
    assert first_phrase_end("Sure, thanks. ") is None  # a short first sentence goes whole
    assert first_phrase_end("Tomorrow will be warm an") is None  # "an" may yet be "another"
    assert first_phrase_end("Yes, I can do that for you") == len("Yes, I can do that")
