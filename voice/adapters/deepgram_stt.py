"""Deepgram speech to text for the cascade, through the official SDK's pre-recorded API: one
request per caller turn (the turn's audio as a WAV), after the VAD has ended the turn.

``base_url`` replaces ``https://api.deepgram.com`` (a loopback peer in tests).
"""

from __future__ import annotations

import io
import logging
import warnings
import wave

import httpx
from deepgram.core.api_error import ApiError

from voice.adapters.deepgram_client import deepgram_client
from voice.realtime import RealtimeError

with warnings.catch_warnings():
    # deepgram-sdk 7 imports a name websockets has deprecated, lazily on the first request; load it
    # here, once, without the warning.
    warnings.simplefilter("ignore", DeprecationWarning)
    import deepgram.listen.v1.client  # noqa: F401

log = logging.getLogger(__name__)


class SpeechToTextFailed(RealtimeError):
    code = "stt-failed"


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


class DeepgramSTT:
    def __init__(self, api_key: str, *, model: str = "nova-3", base_url: str | None = None, rate: int = 8000):
        self._client, self._http = deepgram_client(api_key, base_url)
        self.model = model
        self.rate = rate

    async def transcribe(self, pcm: bytes) -> str:
        try:
            response = await self._client.listen.v1.media.transcribe_file(
                request=wav_bytes(pcm, self.rate), model=self.model, language="en", smart_format=True,
                request_options={"max_retries": 0},  # the caller is waiting: a failed turn is said again
            )  # fmt: skip
        except (ApiError, httpx.HTTPError) as exc:
            status = getattr(exc, "status_code", None)
            raise SpeechToTextFailed(f"Deepgram failed (status {status})", retryable=True) from exc
        results = getattr(response, "results", None)
        if results is None or not results.channels or not results.channels[0].alternatives:
            return ""
        return (results.channels[0].alternatives[0].transcript or "").strip()

    async def aclose(self) -> None:
        await self._http.aclose()
