"""The transcription notice as a guarantee, on every engine: Pepper plays its own recording (the
cascade's local TTS, cached in the data dir) before the model may speak, and not one caller frame
reaches the model before the notice's mark comes back. The words the caller heard are the
configured notice, transcribed with the cascade's local Whisper."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from phone_support import LINE, NOTICE, OWNER, TOKEN, _set_pin, call_settings, caller_for, normalised, transcribed

from core import identity
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.twilio_peer import TwilioPeer
from gateway.server import running_app
from voice.testing.gemini_live_peer import GeminiLivePeer
from voice.testing.gpt_live_peer import GptLivePeer
from voice.testing.realtime_peer import RealtimePeer
from voice.testing.twilio_caller import MediaCall, TwilioCaller

pytestmark = pytest.mark.slow

LINES = {"openai-realtime": LINE, "gemini-live": "+14155550102", "gpt-live": "+14155550103",
         "cascade": "+14155550104"}  # fmt: skip
# What the caller "says" until the notice's mark is echoed: loud, and unlike anything else sent.
BEFORE = b"\x11" * 160


@dataclass
class Lines:
    db: Database
    realtime: RealtimePeer
    gemini: GeminiLivePeer
    live: GptLivePeer
    text: OpenAIPeer
    caller: TwilioCaller
    services: Any
    data_dir: Any


@asynccontextmanager
async def lines(db: Database, db_url: str, monkeypatch: Any, tmp_path: Any) -> AsyncIterator[Lines]:
    """Pepper with one line per engine, the notice played by Pepper (the default)."""
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await _set_pin(db, ada.id)
    for engine, number in LINES.items():
        await identity.assign_line(db, number, "personal", ada.id)
        await identity.set_line_engine(db, number, engine)
    async with (TwilioPeer(auth_token=TOKEN) as twilio, RealtimePeer() as realtime, GeminiLivePeer() as gemini,
                GptLivePeer() as live, OpenAIPeer() as text):  # fmt: skip
        monkeypatch.setenv("SSL_CERT_FILE", str(gemini.ca_file))
        settings = call_settings(
            db_url, twilio, voice_notice_audio="local", openai_realtime_url=realtime.websocket_url,
            gemini_api_key=gemini.api_key, gemini_base_url=gemini.base_url, gpt_live_url=live.websocket_url,
            openai_base_url=text.base_url, memory_jobs_interval=0, data_dir=tmp_path / "data",
        )  # fmt: skip
        async with running_app(settings, db) as (app, port):
            services = app.extensions["pepper"]
            deps = services.calls.deps
            deps.config = dataclasses.replace(deps.config, notice_timeout=20.0)
            yield Lines(db, realtime, gemini, live, text, caller_for(app, port, twilio), services, settings.data_dir)


def notice_marks(call: MediaCall) -> list[Any]:
    return [m for m in call.marks if m.name.startswith("n")]


async def play_until_the_notice(call: MediaCall) -> tuple[int, bytes]:
    """The caller talks (``BEFORE``) until the notice's mark is echoed: (frames it sent by then,
    the audio heard up to the mark)."""
    sent_before = 0

    def frame(n: int) -> bytes | None:
        nonlocal sent_before
        if notice_marks(call):
            return None  # silence after the mark
        sent_before = n
        return BEFORE

    call.frame_hook = frame
    await call.wait(lambda: notice_marks(call), within=25, what="the notice's mark")
    return sent_before, bytes(call.heard)


async def _notice_is_guaranteed(lines: Lines, engine: str) -> None:
    answer = await lines.caller.dial(from_=OWNER, to=LINES[engine])
    assert answer.connected, answer.twiml
    async with lines.caller.media(answer) as call:
        await call.wait(lambda: answer.call_sid in lines.services.calls.sessions, what="the call engine")
        session = lines.services.calls.sessions[answer.call_sid]
        sent_before, heard = await play_until_the_notice(call)
        assert sent_before > 20  # the caller really talked over the notice
        # Every frame sent before the mark was discarded; none reached the model.
        await call.wait(lambda: session.stats.frames_in >= sent_before, what="the frames before the mark at Pepper")
        assert session.stats.frames_discarded >= sent_before
        assert normalised(await transcribed(heard)) == normalised(NOTICE)
        await call.wait(lambda: session.listening, what="Pepper listening after the mark")
        await call.wait(lambda: session.stats.frames_to_model > 0, what="caller audio at the model after the mark")
        await call.hang_up()
    return None


async def test_the_notice_is_pepper_s_own_recording_on_realtime_gemini_and_the_cascade_before_any_caller_frame(
    db, db_url, monkeypatch, tmp_path
):
    async with lines(db, db_url, monkeypatch, tmp_path) as ls:
        await _notice_is_guaranteed(ls, "openai-realtime")
        rec = ls.realtime.sessions[0]
        assert rec.response_creates == []  # the model was never asked to say it
        assert BEFORE[:1] not in bytes(rec.audio_in)  # no byte of the caller's talk-over
        # Synthesised once and cached in the data dir; the later calls use the recording.
        cached = list((ls.data_dir / "notice-audio").glob("*.ulaw"))
        assert len(cached) == 1 and ls.services.calls.deps.notice_audio.synthesised == 1

        await _notice_is_guaranteed(ls, "gemini-live")
        pcm = bytes(ls.gemini.sessions[0].audio_in)
        # Nothing loud reached Gemini: after the mark the caller sends only silence.
        assert max((abs(int.from_bytes(pcm[i : i + 2], "little", signed=True)) for i in range(0, len(pcm), 2)),
                   default=0) < 2000  # fmt: skip
        await _notice_is_guaranteed(ls, "cascade")
        assert ls.text.requests == []  # the cascade's text model never wrote the notice
        assert ls.services.calls.deps.notice_audio.synthesised == 1


async def test_the_notice_on_gpt_live_is_an_audio_fixture_and_drops_during_a_notice_play_it_once(
    db, db_url, monkeypatch, tmp_path
):
    async with lines(db, db_url, monkeypatch, tmp_path) as ls:
        await _notice_is_guaranteed(ls, "gpt-live")
        session = ls.live.sessions[0]
        plays = [e for e in session.events if e.get("type") == "session.output_audio.fixture.play"]
        assert len(plays) == 1 and not session.appends  # a fixture, not a commentary for the model to say
        assert session.audio_dropped == 0 and BEFORE[:1] not in bytes(session.audio_in)

        # The socket drops while the fixture plays: the new session plays it again, once.
        ls.live.pace = 0.1  # 100 ms of audio a tenth of a second: the drop lands mid-fixture
        answer = await ls.caller.dial(from_=OWNER, to=LINES["gpt-live"])
        async with ls.caller.media(answer) as call:
            first = await ls.live.next_session(1)
            await ls.live.wait_for(lambda: first.fixture_playing, what="the fixture playing")
            await first.drop()
            second = await ls.live.next_session(2)
            await call.wait(lambda: notice_marks(call), within=25, what="the notice's mark")
            plays = [e for e in second.events if e.get("type") == "session.output_audio.fixture.play"]
            assert len(plays) == 1 and len(notice_marks(call)) == 1
            await call.hang_up()

        # Realtime: Pepper's recording went to Twilio, not to the model; a drop while it plays
        # changes nothing the caller hears, and the new socket is not asked to say it.
        answer = await ls.caller.dial(from_=OWNER, to=LINE)
        async with ls.caller.media(answer) as call:
            await ls.realtime.wait_for(lambda: len(ls.realtime.sessions) == 1)
            await call.wait(lambda: call.received_media_bytes > 0, what="the notice starting to play")
            await ls.realtime.drop()
            await ls.realtime.wait_for(lambda: len(ls.realtime.sessions) == 2)
            _, heard = await play_until_the_notice(call)
            assert normalised(await transcribed(heard)) == normalised(NOTICE)  # heard once, whole
            assert all(s.response_creates == [] for s in ls.realtime.sessions)
            assert len(notice_marks(call)) == 1
            await call.hang_up()
