"""A loopback Deepgram: the pre-recorded API (``POST /v1/listen``) that really transcribes what it
gets, and the streaming text to speech websocket (``GET /v1/speak``) that really speaks.

    async with DeepgramPeer(transcribe=whisper.transcribe_sync, synthesize=piper_pcm) as deepgram:
        settings = Settings(deepgram_api_key="dg-test", deepgram_api_url=deepgram.base_url, ...)

Both check the ``Authorization: Token <key>`` header (401 otherwise; for the websocket, at the
handshake).

``/v1/listen`` reads the WAV body and answers with Deepgram's response shape
(``results.channels[0].alternatives[0].transcript``), the text made by ``transcribe`` (16-bit PCM
at the WAV's rate -> text) in a worker thread. ``queries`` keeps the query of each call; ``faults``
answers the next calls with these HTTP statuses instead.

``/v1/speak`` speaks Deepgram's TTS websocket: ``Metadata`` on open; ``Speak`` messages buffer text
until ``Flush``, which synthesises it with ``synthesize`` (text -> 16-bit PCM and its rate), converts
it to the ``encoding`` (linear16, mulaw, alaw) and ``sample_rate`` asked in the query, and sends it
as raw binary messages of 100 ms (one each ``pace`` seconds), then ``Flushed``; ``Clear`` drops the
buffered text and any audio not yet sent and answers ``Cleared``; ``Close`` closes. ``speak_queries``
keeps each socket's query and ``speak_messages`` every message type received, in order;
``speak_faults`` makes the next flushes fail: ``"drop"`` closes the socket with 1011 after the
first 100 ms of audio and ``"close"`` before any (when: ``speak_dropped_at``), ``"warning"``
answers a ``Warning`` instead of audio; ``speak_refuse`` answers the next N handshakes 503 (when:
``speak_refused_at``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import secrets
import time
import uuid
import wave
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import soxr
from aiohttp import WSMsgType, web

from core.testing.peers.script import LoopbackPeer
from voice.codec import audioop

ENCODINGS = ("linear16", "mulaw", "alaw")
SAMPLE_RATES = (8000, 16000, 24000, 32000, 48000)


class DeepgramPeer(LoopbackPeer):
    provider = "deepgram"

    def __init__(
        self,
        *,
        transcribe: Callable[[bytes, int], str] | None = None,
        synthesize: Callable[[str], tuple[bytes, int]] | None = None,
        api_key: str = "dg-test",
        pace: float = 0.0,
    ) -> None:
        super().__init__()
        self.transcribe = transcribe
        self.synthesize = synthesize
        self.api_key = api_key
        self.pace = pace
        self.queries: list[dict[str, str]] = []
        self.faults: deque[int] = deque()
        self.speak_queries: list[dict[str, str]] = []
        self.speak_messages: list[str] = []
        self.speak_faults: deque[str] = deque()
        self.speak_refuse = 0
        self.speak_refused_at: list[float] = []  # time.monotonic()
        self.speak_dropped_at: list[float] = []
        self.audio_sent = 0  # bytes of speech sent, over all sockets

    @property
    def base_url(self) -> str:
        return self.root

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/listen", self._listen), web.get("/v1/speak", self._speak)]

    async def _listen(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Token {self.api_key}":
            return web.json_response({"err_code": "INVALID_AUTH", "err_msg": "Invalid credentials."}, status=401)
        self.queries.append(dict(request.query))
        if self.faults:
            return web.json_response({"err_code": "SERVER_ERROR", "err_msg": "scripted"}, status=self.faults.popleft())
        body = await request.read()
        try:
            with wave.open(io.BytesIO(body)) as wav:
                rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
        except (wave.Error, EOFError):
            return web.json_response({"err_code": "Bad Request", "err_msg": "unsupported audio"}, status=400)
        assert self.transcribe is not None, "DeepgramPeer(transcribe=...) is needed for /v1/listen"
        text = await asyncio.to_thread(self.transcribe, pcm, rate)
        return web.json_response(_response(text, len(pcm) / 2 / rate, request.query.get("model", "base")))

    async def _speak(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Token {self.api_key}":
            return web.json_response({"err_code": "INVALID_AUTH", "err_msg": "Invalid credentials."}, status=401)
        query = dict(request.query)
        self.speak_queries.append(query)
        if self.speak_refuse > 0:
            self.speak_refuse -= 1
            self.speak_refused_at.append(time.monotonic())
            return web.json_response({"err_code": "SERVICE_UNAVAILABLE", "err_msg": "scripted"}, status=503)
        encoding, rate = query.get("encoding", "linear16"), query.get("sample_rate", "24000")
        if encoding not in ENCODINGS or not rate.isdigit() or int(rate) not in SAMPLE_RATES:
            return web.json_response({"err_code": "Bad Request", "err_msg": "unsupported audio format"}, status=400)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        model = query.get("model", "aura-asteria-en")
        await ws.send_json({"type": "Metadata", "request_id": str(uuid.uuid4()), "model_name": model,
                            "model_version": "loopback", "model_uuid": str(uuid.uuid4())})  # fmt: skip
        text: list[str] = []
        sending: asyncio.Task[None] | None = None
        flushes = clears = 0
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                kind = json.loads(message.data).get("type")
                self.speak_messages.append(str(kind))
                if kind == "Speak":
                    text.append(json.loads(message.data).get("text", ""))
                elif kind == "Flush":
                    sentence, text = " ".join(text), []
                    sending = asyncio.create_task(
                        self._send_speech(ws, sending, sentence, encoding, int(rate), flushes),
                        name=f"deepgram-peer-speak-{flushes}",
                    )
                    flushes += 1
                elif kind == "Clear":
                    text = []
                    if sending is not None:
                        sending.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await sending
                    await ws.send_json({"type": "Cleared", "sequence_id": clears})
                    clears += 1
                elif kind == "Close":
                    break
        finally:
            if sending is not None:
                sending.cancel()
        await ws.close()
        return ws

    async def _send_speech(
        self, ws: web.WebSocketResponse, before: asyncio.Task[None] | None, text: str, encoding: str, rate: int,
        sequence: int,
    ) -> None:  # fmt: skip
        if before is not None:
            await before  # flushes are answered in order
        fault = self.speak_faults.popleft() if self.speak_faults else None
        if fault == "warning":
            await ws.send_json({"type": "Warning", "description": "scripted", "code": "SCRIPTED"})
            return
        if fault == "close":
            self.speak_dropped_at.append(time.monotonic())
            await ws.close(code=1011, message=b"NET-0001: scripted drop")
            return
        audio = await asyncio.to_thread(self._audio, text, encoding, rate)
        step = rate // 10 * (2 if encoding == "linear16" else 1)  # 100 ms
        for at in range(0, len(audio), step):
            await ws.send_bytes(audio[at : at + step])
            self.audio_sent += len(audio[at : at + step])
            if fault == "drop":
                self.speak_dropped_at.append(time.monotonic())
                await ws.close(code=1011, message=b"NET-0001: scripted drop")
                return
            if self.pace:
                await asyncio.sleep(self.pace)
        await ws.send_json({"type": "Flushed", "sequence_id": sequence})

    def _audio(self, text: str, encoding: str, rate: int) -> bytes:
        assert self.synthesize is not None, "DeepgramPeer(synthesize=...) is needed for /v1/speak"
        pcm, source_rate = self.synthesize(text)
        samples = np.frombuffer(pcm, np.int16)
        if source_rate != rate and len(samples):
            samples = np.asarray(soxr.resample(samples, source_rate, rate), np.int16)
        raw = samples.tobytes()
        if encoding == "mulaw":
            return audioop.lin2ulaw(raw, 2)
        if encoding == "alaw":
            return audioop.lin2alaw(raw, 2)
        return raw


def _response(text: str, duration: float, model: str) -> dict[str, Any]:
    words = [{"word": w.lower().strip(".,?!"), "start": 0.0, "end": 0.0, "confidence": 0.9, "punctuated_word": w}
             for w in text.split()]  # fmt: skip
    return {
        "metadata": {"transaction_key": "deprecated", "request_id": secrets.token_hex(16), "sha256": "0" * 64,
                     "created": datetime.now(UTC).isoformat(), "duration": duration, "channels": 1,
                     "models": [model], "model_info": {model: {"name": model, "version": "loopback", "arch": model}}},
        "results": {"channels": [{"alternatives": [{"transcript": text, "confidence": 0.9, "words": words}]}]},
    }  # fmt: skip
