"""A loopback Deepgram pre-recorded API (``POST /v1/listen``) that really transcribes what it gets.

    async with DeepgramPeer(transcribe=whisper.transcribe_sync) as deepgram:
        settings = Settings(deepgram_api_key="dg-test", deepgram_api_url=deepgram.base_url, ...)

It checks the ``Authorization: Token <key>`` header (401 otherwise), reads the WAV body, and answers
with Deepgram's response shape (``results.channels[0].alternatives[0].transcript``), the text made
by ``transcribe`` (16-bit PCM at the WAV's rate -> text) in a worker thread. ``requests`` keeps the
query of each call; ``faults`` answers the next calls with these HTTP statuses instead.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import wave
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from core.testing.peers.script import LoopbackPeer


class DeepgramPeer(LoopbackPeer):
    provider = "deepgram"

    def __init__(self, *, transcribe: Callable[[bytes, int], str], api_key: str = "dg-test") -> None:
        super().__init__()
        self.transcribe = transcribe
        self.api_key = api_key
        self.queries: list[dict[str, str]] = []
        self.faults: deque[int] = deque()

    @property
    def base_url(self) -> str:
        return self.root

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/listen", self._listen)]

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
        text = await asyncio.to_thread(self.transcribe, pcm, rate)
        return web.json_response(_response(text, len(pcm) / 2 / rate, request.query.get("model", "base")))


def _response(text: str, duration: float, model: str) -> dict[str, Any]:
    words = [{"word": w.lower().strip(".,?!"), "start": 0.0, "end": 0.0, "confidence": 0.9, "punctuated_word": w}
             for w in text.split()]  # fmt: skip
    return {
        "metadata": {"transaction_key": "deprecated", "request_id": secrets.token_hex(16), "sha256": "0" * 64,
                     "created": datetime.now(UTC).isoformat(), "duration": duration, "channels": 1,
                     "models": [model], "model_info": {model: {"name": model, "version": "loopback", "arch": model}}},
        "results": {"channels": [{"alternatives": [{"transcript": text, "confidence": 0.9, "words": words}]}]},
    }  # fmt: skip
