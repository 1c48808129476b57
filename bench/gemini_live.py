"""What Gemini Live costs per audio frame next to OpenAI Realtime's pass-through, same run.

In: one 20 ms Twilio frame handed to ``append_audio`` (OpenAI: the base64 goes out as it is;
Gemini: mu-law decode, 8 -> 16 kHz resample, the SDK's ``send_realtime_input``), with the raw SDK
call on ready PCM as the Gemini baseline. Out: one 100 ms model audio message turned into
normalised events (OpenAI: ``map_event`` on the JSON; Gemini: the SDK's message parsing plus
``map_message``, 24 -> 8 kHz and mu-law encode). Calls alternate against the loopback peers; the
figures are the time each call takes on the sending side.

Run: ``python -m bench.gemini_live [--frames 2000]``. Imports google-genai on purpose: the raw
side of the comparison is the SDK itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time
from typing import Any

from google.genai import types as gt

from core.testing.figures import p99
from voice.adapters.gemini_live import GeminiLive, GeminiLiveConnection, Resampler
from voice.adapters.openai_realtime import OpenAIRealtime, map_event
from voice.realtime import SessionConfig
from voice.testing.gemini_live_peer import GeminiLivePeer, pcm24k
from voice.testing.realtime_peer import RealtimePeer, tone

CONFIG = SessionConfig("Be brief.", ())


def _row(name: str, samples: list[float], baseline: list[float] | None = None) -> str:
    ordered = sorted(samples)
    median = statistics.median(ordered) * 1e6
    text = f"{name:<48} median {median:8.1f} us   p99 {p99(ordered) * 1e6:8.1f} us"
    if baseline:
        base = sorted(baseline)
        text += f"   x{median / (statistics.median(base) * 1e6):.2f} median"
    return text


async def _timed(samples: list[float], call: Any) -> None:
    started = time.perf_counter()
    await call
    samples.append(time.perf_counter() - started)


async def main(frames: int) -> None:
    frame = base64.b64encode(tone(20)).decode()
    pcm16 = Resampler().to_model(tone(20))
    chunk24 = pcm24k(tone(100))
    async with RealtimePeer(vad=False) as openai_peer, GeminiLivePeer(vad_threshold=10**9) as gemini_peer:
        openai = OpenAIRealtime(api_key="sk-bench", websocket_base_url=openai_peer.websocket_url)
        gemini = GeminiLive(api_key=gemini_peer.api_key, base_url=gemini_peer.base_url,
                            ssl_context=gemini_peer.client_ssl())  # fmt: skip
        async with openai.connect() as o_conn, gemini.connect() as g_conn:
            await o_conn.configure(CONFIG)
            await g_conn.configure(CONFIG)
            raw = g_conn._live()
            blob = gt.Blob(data=pcm16, mime_type="audio/pcm;rate=16000")
            o_in: list[float] = []
            g_raw: list[float] = []
            g_in: list[float] = []
            for _ in range(frames):
                await _timed(o_in, o_conn.append_audio(frame))
                await _timed(g_raw, raw.send_realtime_input(audio=blob))
                await _timed(g_in, g_conn.append_audio(frame))
        await openai.aclose()
        await gemini.aclose()
    o_event = {"type": "response.output_audio.delta", "response_id": "r", "item_id": "i",
               "delta": base64.b64encode(tone(100)).decode()}  # fmt: skip
    o_raw = json.dumps(o_event)
    g_raw_msg = json.dumps({"serverContent": {"modelTurn": {"parts": [{"inlineData": {
        "mimeType": "audio/pcm;rate=24000", "data": base64.b64encode(chunk24).decode()}}]}}})  # fmt: skip
    o_out: list[float] = []
    g_out: list[float] = []
    conn = GeminiLiveConnection(gemini)  # map_message needs no socket
    for _ in range(frames):
        started = time.perf_counter()
        map_event(json.loads(o_raw))
        o_out.append(time.perf_counter() - started)
        started = time.perf_counter()
        message = gt.LiveServerMessage._from_response(response=json.loads(g_raw_msg), kwargs={})
        conn.map_message(message)
        g_out.append(time.perf_counter() - started)
    print(f"{frames} frames each, alternating")
    print(_row("in:  OpenAI append_audio (pass-through)", o_in))
    print(_row("in:  Gemini raw SDK send_realtime_input", g_raw))
    print(_row("in:  Gemini append_audio (ulaw->16k + SDK)", g_in, g_raw))
    print(_row("out: OpenAI 100 ms delta -> event", o_out))
    print(_row("out: Gemini 100 ms message -> events", g_out, o_out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000)
    asyncio.run(main(parser.parse_args().frames))
