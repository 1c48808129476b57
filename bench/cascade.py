"""Time per turn of the cascaded voice engine with the local models (faster-whisper tiny.en, piper
en_US-joe-medium), on this machine's CPU.

* STT: one caller utterance (espeak-ng, 1.8 s) transcribed; beside it, the utterance's length and
  the same with Whisper's 30 s window.
* TTS: one reply sentence synthesised and resampled to 8 kHz mu-law; beside it, its audio length,
  and its first phrase alone.
* TTS through Deepgram (``voice/adapters/deepgram_tts.py``): the same sentence over the SDK's
  ``/v1/speak`` websocket (one socket kept, as a call does) to the loopback Deepgram peer, which
  synthesises it with the same piper and converts it to 8 kHz mu-law. Beside it, piper alone from
  the line above: the difference is what the SDK, the websocket and the peer add (real Deepgram
  streams audio while it synthesises; the peer sends once piper is done).
* Turn: caller stops -> first reply audio, the figure a caller feels. A
  :class:`~voice.adapters.cascade.CascadeConnection` is fed, in real time (a 20 ms frame every
  20 ms, as Twilio sends them), 1 s of quiet, one line of the quiet caller's word-accuracy set
  (``tests/calls/data/quiet_caller``, the lines the tests check word for word), and quiet until the
  reply's first audio; the clock starts on the frame on which the VAD ends the turn (its
  ``stop_secs`` of quiet after the caller's last sound are a setting, not counted). The text model
  is scripted on the loopback OpenAI peer (router, adapter, SDK, HTTP); the reply's first phrase
  is synthesised by piper. Baselines in the same run, turn for turn: the code before the latency
  work (Whisper's full 30 s window, the turn transcribed once the VAD has ended it, the first
  sentence synthesised whole), and that with the old 0.5 s lead-in (untrimmed) too, which cuts a
  quiet caller's first word; beside each, how many lines came back word for word and how many
  turns Whisper decoded again at a higher temperature. The text model's round trip alone is
  printed too, and STT and TTS alone beside the 30 s window and the whole first sentence.

    PYTHONPATH=. .venv/bin/python bench/cascade.py [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
from core.models.types import ChatMessage, Prompt
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, Reply
from voice.adapters.cascade import RATE, CascadeModel, first_phrase_end, local_speech
from voice.codec import audioop
from voice.realtime import AudioDelta, ResponseDone, SessionConfig, UserTranscript

ROOT = Path(__file__).resolve().parents[1]
UTTERANCE = ROOT / "voice" / "testing" / "data" / "weather.ulaw"
QUIET_CALLER = ROOT / "tests" / "calls" / "data" / "quiet_caller"
OLD_LEAD_IN = 0.5
REPLY = "Tomorrow will be warm and sunny in Paris."
FULL_WINDOW = 3000  # Whisper's 30 s


class FullWindowWhisper:
    """The same local Whisper encoding the full 30 s window, as before the 15 s one."""

    def __init__(self, speech: Any):
        self.stt = speech.stt

    async def transcribe(self, pcm: bytes) -> str:
        return await asyncio.to_thread(self.stt.transcribe_sync, pcm, RATE, FULL_WINDOW)


def _line(label: str, values: list[float], beside: str) -> None:
    values = sorted(values)
    print(f"{label:<34} median {statistics.median(values) * 1000:7.0f} ms  p99 {p99(values) * 1000:7.0f} ms   {beside}")


async def main(turns: int) -> None:
    started = time.perf_counter()
    speech = local_speech()
    print(f"model load (once per process): {time.perf_counter() - started:.2f} s")
    utterance = UTTERANCE.read_bytes()
    pcm = audioop.ulaw2lin(utterance, 2)

    stt = []
    for _ in range(turns):
        t = time.perf_counter()
        await speech.stt.transcribe(pcm)
        stt.append(time.perf_counter() - t)
    stt_full = []
    for _ in range(turns):
        t = time.perf_counter()
        await asyncio.to_thread(speech.stt.transcribe_sync, pcm, RATE, FULL_WINDOW)
        stt_full.append(time.perf_counter() - t)
    tts, tts_phrase = [], []
    audio_seconds = phrase_seconds = 0.0
    phrase = REPLY[: first_phrase_end(REPLY)]
    for _ in range(turns):
        t = time.perf_counter()
        audio = await asyncio.to_thread(speech.tts.mulaw_sync, REPLY)
        tts.append(time.perf_counter() - t)
        audio_seconds = len(audio) / 8000
        t = time.perf_counter()
        audio = await asyncio.to_thread(speech.tts.mulaw_sync, phrase)
        tts_phrase.append(time.perf_counter() - t)
        phrase_seconds = len(audio) / 8000

    deepgram_first, deepgram_all = await _deepgram(speech, turns)

    async with OpenAIPeer() as peer:
        adapter = OpenAIResponsesAdapter(api_key="sk-test", base_url=peer.base_url, timeout=30.0)
        router = ModelRouter({OPENAI: adapter}, {"small": Tier("small", (ModelChoice("gpt-small"),))})
        model_alone = []
        prompt = Prompt("Be brief.", (ChatMessage("user", "What is the weather in Paris?"),))
        for _ in range(turns):
            peer.script(Reply(text=REPLY))
            t = time.perf_counter()
            async for _event in router.stream(prompt, conversation_key="bench"):
                pass
            model_alone.append(time.perf_counter() - t)

        lines = json.loads((QUIET_CALLER / "lines.json").read_text())
        old_way = dict(stt=FullWindowWhisper(speech), early_stt_ms=None, first_phrase=False)
        engines = {
            "now": CascadeModel(router),
            # before the latency work: Whisper's 30 s window, the turn transcribed once the VAD
            # has ended it, the first sentence synthesised whole
            "before": CascadeModel(router, **old_way),  # type: ignore[arg-type]
            # and before the lead-in fix too: 0.5 s of lead-in, all of it to Whisper
            "old": CascadeModel(router, lead_in_secs=OLD_LEAD_IN, pad_secs=None, **old_way),  # type: ignore[arg-type]
        }
        turn_times: dict[str, list[float]] = {lead: [] for lead in engines}
        to_transcript: dict[str, list[float]] = {lead: [] for lead in engines}
        word_for_word: dict[str, int] = dict.fromkeys(engines, 0)
        fallbacks: dict[str, int] = dict.fromkeys(engines, 0)
        names = list(lines)
        for engine in engines.values():  # one turn each first, untimed: the VAD's session opens
            peer.script(Reply(text=REPLY))
            await _turn(engine, (QUIET_CALLER / f"{names[0]}.ulaw").read_bytes())
        for n in range(turns):
            name = names[n % len(names)]
            for lead, engine in engines.items():  # turn for turn, so all see the same load
                peer.script(Reply(text=REPLY))
                before = speech.stt.fallbacks
                heard, stt_seconds, seconds = await _turn(engine, (QUIET_CALLER / f"{name}.ulaw").read_bytes())
                to_transcript[lead].append(stt_seconds)
                fallbacks[lead] += speech.stt.fallbacks - before
                word_for_word[lead] += _words(heard) == _words(lines[name])
                turn_times[lead].append(seconds)
        await router.aclose()

    print(f"\n{turns} turns, this machine (load average {os.getloadavg()[0]:.1f}):")
    _line("STT, one 1.8 s utterance", stt, f"baseline: the utterance lasts {len(pcm) / 16000:.2f} s")
    _line("  baseline: STT, Whisper's 30 s window", stt_full, "")
    _line("TTS, one sentence to 8 kHz mu-law", tts, f"baseline: the sentence lasts {audio_seconds:.2f} s")
    _line("TTS, its first phrase", tts_phrase, f"{phrase!r}, lasts {phrase_seconds:.2f} s")
    _line("TTS via Deepgram, first audio", deepgram_first, "")
    _line("TTS via Deepgram, all audio", deepgram_all, "baseline: piper alone, the TTS line above")
    for lead, label in (
        ("now", "caller stops -> first reply audio"),
        ("before", "  baseline: before the latency work"),
        ("old", "  baseline: and the 0.5 s lead-in"),
    ):
        beside = f"{word_for_word[lead]}/{turns} lines word for word, "
        _line(label, turn_times[lead], beside + f"{fallbacks[lead]} temperature fallbacks")
        _line("    of which turn end -> transcript", to_transcript[lead], "")
    _line("  baseline: the text model alone", model_alone, "(loopback peer, streamed)")


async def _turn(engine: CascadeModel, utterance: bytes) -> tuple[str, float, float]:
    """One turn fed in real time: what Whisper heard, turn end -> transcript and -> first reply
    audio (seconds)."""
    quiet = b"\xff" * 160
    frames = [quiet] * 50 + [utterance[i : i + 160] for i in range(0, len(utterance), 160)]
    heard = ""
    async with engine.connect() as conn:
        await conn.configure(SessionConfig("Be brief.", ()))

        async def feed() -> None:
            clock = time.perf_counter()
            for n, frame in enumerate(frames + [quiet] * 500):  # then quiet, as a caller's line is
                await conn.append_audio(base64.b64encode(frame).decode())
                await asyncio.sleep(max(0.0, clock + 0.02 * (n + 1) - time.perf_counter()))

        feeding = asyncio.create_task(feed())
        try:
            async for event in conn.events():
                if type(event) is UserTranscript:
                    heard = event.text
                elif type(event) is AudioDelta:
                    break
                elif type(event) is ResponseDone:
                    raise RuntimeError("the reply had no audio")
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
    stt = engine.timings.stt[-1]
    return heard, stt, stt + engine.timings.first_audio[-1]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


async def _deepgram(speech: Any, turns: int) -> tuple[list[float], list[float]]:
    from voice.adapters.deepgram_tts import DeepgramTTS
    from voice.testing.deepgram_peer import DeepgramPeer

    first, whole = [], []
    async with DeepgramPeer(synthesize=lambda text: (speech.tts.pcm_sync(text), speech.tts.rate)) as peer:
        tts = DeepgramTTS("dg-test", base_url=peer.base_url)
        call = tts.for_call()
        await call.warm()
        for _ in range(turns):
            t = time.perf_counter()
            got_first = False
            async for _piece in call.synthesize(REPLY):
                if not got_first:
                    first.append(time.perf_counter() - t)
                    got_first = True
            whole.append(time.perf_counter() - t)
        await call.aclose()
        await tts.aclose()
    return first, whole


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    asyncio.run(main(parser.parse_args().turns))
