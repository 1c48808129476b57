"""A voice call from the chat page in a real headless Chromium, with its fake microphone playing
real speech (espeak-ng, the call fixtures'), against the loopback OpenAI Realtime server.

The WAV loops: speech, then silence long enough for Pepper's (long) reply to start playing, then
the speech again, over the reply: a barge-in. The page measures the energy of the track it
receives with WebAudio (``window.pepperCall.levels``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import wave
from pathlib import Path

import pytest
from browser_support import chromium, needs_chromium, output_dir, sign_in, wait_for

from core import access, identity
from core.settings import Settings
from core.store import Database
from gateway.server import running_app
from voice.codec import audioop
from voice.testing.realtime_peer import RealtimePeer, speak

pytestmark = [needs_chromium, pytest.mark.slow]

NOTICE = "Hi, this is Pepper. This call is transcribed."
FIXTURES = Path(__file__).resolve().parents[1] / "voice" / "testing" / "data"
LOOP_SECONDS = 4.0  # speech (1.1 s), then silence: the file plays again and again
REPLY_MS = 8000  # longer than a loop: the speech comes back while it plays


def speech_wav(path: Path) -> Path:
    """The fake microphone's file: the ``todo`` fixture (8 kHz mu-law) as 48 kHz 16-bit PCM."""
    pcm = audioop.ulaw2lin((FIXTURES / "todo.ulaw").read_bytes(), 2)
    pcm += bytes(int(LOOP_SECONDS * 8000) * 2 - len(pcm))
    pcm48, _ = audioop.ratecv(pcm, 2, 1, 8000, 48000, None)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes(pcm48)
    return path


def loud_runs(levels: list[list[float]], threshold: float) -> list[float]:
    """Lengths (ms) of the stretches the page's received track stayed above ``threshold``."""
    runs, start = [], None
    for at, level in levels:
        if level > threshold and start is None:
            start = at
        elif level <= threshold and start is not None:
            runs.append(at - start)
            start = None
    if start is not None:
        runs.append(levels[-1][0] - start)
    return runs


async def test_a_call_from_the_chat_page_reaches_the_model_plays_its_reply_and_barge_in_clears_it(
    db: Database, db_url: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
):
    from selenium.webdriver.common.by import By

    ada = await identity.create_account(db, "Ada")
    await access.set_web_password(db, ada.id, "ada", "correct horse battery")
    wav = speech_wav(tmp_path / "speech.wav")
    shots = output_dir(tmp_path_factory)
    async with RealtimePeer() as model:
        model.script(speak(NOTICE, ms=300), speak("Here is a long answer about your list.", ms=REPLY_MS))
        model.hear("what is on my list", "stop, thank you")
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_realtime_url=model.websocket_url,
                            voice_notice=NOTICE, port=0, media_port=0, graceful_timeout=2,
                            voice_notice_audio="model")  # fmt: skip
        async with running_app(settings, db) as (app, port):
            deps = app.extensions["pepper"].calls.deps
            deps.config = dataclasses.replace(deps.config, notice_timeout=10.0)
            base = f"http://127.0.0.1:{port}"
            flags = (
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}",
                "--autoplay-policy=no-user-gesture-required",
            )
            with chromium(*flags) as driver:
                await sign_in(driver, base, "ada", "correct horse battery")
                button = await wait_for(lambda: driver.find_element(By.ID, "call-button"))
                # Chrome's echo canceller would mute the fake microphone while the reply plays (a
                # file talking over Pepper is not a person it can tell from an echo).
                driver.execute_script(
                    "window.pepperCall.audio = {echoCancellation: false,"
                    " noiseSuppression: false, autoGainControl: false}"
                )
                await asyncio.to_thread(button.click)
                await wait_for(lambda: driver.execute_script("return window.pepperCall.phase") == "live", 15)

                # The model hears the speech (its VAD saw it twice: once asked, once over the reply).
                await model.wait_for(lambda: model.sessions and len(model.sessions[0].speech_started_at) >= 2, 20)
                session = model.sessions[0]
                assert audioop.rms(audioop.ulaw2lin(bytes(session.audio_in), 2), 2) > 100
                # The barge-in: Pepper cleared what was queued and cut the reply to what was played.
                await model.wait_for(lambda: session.truncates, 10)
                played = session.truncates[0]["audio_end_ms"]
                assert 0 < played < REPLY_MS - 2000
                await wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#call-transcript .call-line"), 10)
                await asyncio.to_thread(driver.save_screenshot, str(shots / "browser-call.png"))
                levels = driver.execute_script("return window.pepperCall.levels")
                # Muted, the microphone sends silence: a whole loop of the file (speech included)
                # reaches the model as nothing.
                await asyncio.to_thread(driver.find_element(By.ID, "call-mute").click)
                await asyncio.sleep(0.3)
                muted_from = len(session.audio_in)
                await model.wait_for(lambda: len(session.audio_in) - muted_from >= 8 * int(LOOP_SECONDS * 1000), 10)
                muted = bytes(session.audio_in[muted_from : muted_from + 8 * int(LOOP_SECONDS * 1000)])
                assert audioop.rms(audioop.ulaw2lin(muted, 2), 2) < 50
                assert driver.find_element(By.ID, "call-mute").text == "Unmute"
                await asyncio.to_thread(driver.find_element(By.ID, "call-hangup").click)
                await wait_for(lambda: driver.execute_script("return window.pepperCall.phase") == "idle", 10)

                # The call is in the dashboard, with its transcript.
                sql = "SELECT call_sid FROM calls WHERE summary IS NOT NULL"
                for _ in range(300):
                    if (sid := await db.fetchval(sql)) is not None:
                        break
                    await asyncio.sleep(0.05)
                assert sid is not None
                await asyncio.to_thread(driver.get, f"{base}/calls/{sid}")
                page = await wait_for(lambda: "what is on my list" in driver.page_source and driver.page_source, 10)
                assert "Here is a long answer about your list." in page
                await asyncio.to_thread(driver.save_screenshot, str(shots / "browser-call-dashboard.png"))

            # The reply reached the page's audio element, and stopped at the barge-in, seconds
            # before its end: no stretch of sound as long as the reply.
            runs = loud_runs(levels, 0.02)
            assert runs and max(runs) > 500, runs
            assert max(runs) < REPLY_MS - 2000, runs

        row = None
        for _ in range(300):
            row = await db.fetchrow("SELECT * FROM calls WHERE summary IS NOT NULL")
            if row is not None:
                break
            await asyncio.sleep(0.05)
        assert row is not None and row["verified_by"] == "web-session" and row["stats"]
        said = [r["body"] for r in await db.fetch("SELECT body FROM messages WHERE channel = 'voice' ORDER BY id")]
        assert "what is on my list" in said and "Here is a long answer about your list." in said
