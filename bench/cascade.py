"""Time per turn of the cascaded voice engine with the local models (faster-whisper tiny.en, piper
en_US-joe-medium), on this machine's CPU.

* STT: one caller utterance (espeak-ng, 1.8 s) transcribed; beside it, the utterance's length.
* TTS: one reply sentence synthesised and resampled to 8 kHz mu-law; beside it, its audio length.
* TTS through Deepgram (``voice/adapters/deepgram_tts.py``): the same sentence over the SDK's
  ``/v1/speak`` websocket (one socket kept, as a call does) to the loopback Deepgram peer, which
  synthesises it with the same piper and converts it to 8 kHz mu-law. Beside it, piper alone from
  the line above: the difference is what the SDK, the websocket and the peer add (real Deepgram
  streams audio while it synthesises; the peer sends once piper is done).
* Turn: a :class:`~voice.adapters.cascade.CascadeConnection` fed the utterance and 0.6 s of quiet
  in 20 ms frames; its own timings (``CascadeModel.timings``) from the frame that ends the turn
  (the VAD's 0.5 s of quiet are algorithmic, not counted) to the transcript and to the first reply
  audio, with a scripted text model on the loopback
  OpenAI peer (router, adapter, SDK, HTTP). Baseline from the same run: the text model's round
  trip alone, so the difference is what STT and TTS add.

    PYTHONPATH=. .venv/bin/python bench/cascade.py [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import time
from pathlib import Path
from typing import Any

from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
from core.models.types import ChatMessage, Prompt
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, Reply
from voice.adapters.cascade import CascadeModel, local_speech
from voice.codec import audioop
from voice.realtime import ResponseDone, SessionConfig

UTTERANCE = Path(__file__).resolve().parents[1] / "voice" / "testing" / "data" / "weather.ulaw"
REPLY = "Tomorrow will be warm and sunny in Paris."


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
    tts = []
    audio_seconds = 0.0
    for _ in range(turns):
        t = time.perf_counter()
        audio = await asyncio.to_thread(speech.tts.mulaw_sync, REPLY)
        tts.append(time.perf_counter() - t)
        audio_seconds = len(audio) / 8000

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

        engine = CascadeModel(router)
        frames = [utterance[i : i + 160] for i in range(0, len(utterance), 160)] + [b"\xff" * 160] * 30
        for _ in range(turns):
            peer.script(Reply(text=REPLY))
            async with engine.connect() as conn:
                await conn.configure(SessionConfig("Be brief.", ()))
                for frame in frames:
                    await conn.append_audio(base64.b64encode(frame).decode())
                async for event in conn.events():
                    if type(event) is ResponseDone:
                        break
        await router.aclose()

    print(f"\n{turns} turns, this machine (load average {os.getloadavg()[0]:.1f}):")
    _line("STT, one 1.8 s utterance", stt, f"baseline: the utterance lasts {len(pcm) / 16000:.2f} s")
    _line("TTS, one sentence to 8 kHz mu-law", tts, f"baseline: the sentence lasts {audio_seconds:.2f} s")
    _line("TTS via Deepgram, first audio", deepgram_first, "")
    _line("TTS via Deepgram, all audio", deepgram_all, "baseline: piper alone, the TTS line above")
    timings = engine.timings
    _line("turn end -> transcript (in a call)", timings.stt, "")
    _line("transcript -> first reply audio", timings.first_audio, "(the text model, then TTS of sentence 1)")
    turn = [a + b for a, b in zip(timings.stt, timings.first_audio, strict=True)]
    _line("turn end -> first reply audio", turn, "")
    _line("  baseline: the text model alone", model_alone, "(loopback peer, streamed)")


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
