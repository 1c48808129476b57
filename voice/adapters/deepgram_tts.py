"""Deepgram Aura text to speech for the cascade, through the official SDK's streaming websocket
(``wss://api.deepgram.com/v1/speak``): the lowest time to first audio Deepgram offers.

Deepgram is asked for ``encoding=mulaw`` and ``sample_rate=8000``: the websocket sends raw audio
(no container), which is exactly what Twilio plays, so nothing is decoded or resampled here.

One socket per call, opened as the call starts (:meth:`DeepgramSpeech.warm`) and kept: each
sentence is a ``Speak`` and a ``Flush``, and its audio is the binary messages up to ``Flushed``.
A cancelled sentence (barge-in) sends ``Clear``; the next sentence first reads up to ``Cleared``
so no audio of the interrupted one leaks into it. Any failure (refused handshake, a ``Warning``,
the socket closing) raises :class:`TextToSpeechFailed` and drops the socket; the next sentence
opens a new one. The cascade speaks a failed sentence with piper instead.

``base_url`` replaces ``https://api.deepgram.com`` (a loopback peer in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator
from typing import Any

from deepgram.core.api_error import ApiError
from deepgram.speak.v1.types import SpeakV1Text

from voice.adapters.deepgram_client import deepgram_client
from voice.realtime import RealtimeError

with warnings.catch_warnings():
    # deepgram-sdk 7 imports websockets' deprecated legacy client lazily; load it once, quietly.
    warnings.simplefilter("ignore", DeprecationWarning)
    import deepgram.speak.v1.client  # noqa: F401
    import websockets.exceptions

log = logging.getLogger(__name__)

CHUNK_BYTES = 800  # 100 ms of 8 kHz mu-law: what the cascade sends per event
CONNECT_SECONDS = 3.0  # the caller is waiting: past this, piper speaks the sentence
SILENCE_SECONDS = 5.0  # no audio nor Flushed for this long: the sentence has failed
CLEAR_SECONDS = 2.0  # waiting for Cleared after a barge-in before giving up on the socket


class TextToSpeechFailed(RealtimeError):
    code = "tts-failed"


class DeepgramTTS:
    """The engine-wide settings; :meth:`for_call` gives each call its own socket."""

    def __init__(self, api_key: str, *, model: str = "aura-2-thalia-en", base_url: str | None = None):
        self._client, self._http = deepgram_client(api_key, base_url)
        self.model = model

    async def aclose(self) -> None:
        await self._http.aclose()

    def for_call(self) -> DeepgramSpeech:
        return DeepgramSpeech(self)

    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        raise TypeError("Deepgram speech needs a socket per call: use for_call()")

    async def connect(self, stack: contextlib.AsyncExitStack) -> Any:
        return await stack.enter_async_context(
            self._client.speak.v1.connect(model=self.model, encoding="mulaw", sample_rate="8000")
        )


class DeepgramSpeech:
    """One call's socket. Sentences run one at a time (the cascade speaks them in order)."""

    def __init__(self, tts: DeepgramTTS):
        self._tts = tts
        self._stack: contextlib.AsyncExitStack | None = None
        self._socket: Any = None
        self._clearing = False  # a Clear was sent and its Cleared not read yet
        self._in_flight = False  # a Speak was sent and its Flushed not read yet
        self._connecting = asyncio.Lock()

    async def _open(self) -> Any:
        if self._socket is not None and self._clearing:
            try:
                async with asyncio.timeout(CLEAR_SECONDS):
                    while _kind(await self._socket.recv()) != "Cleared":
                        pass  # the interrupted sentence's audio, already given up
                self._clearing = False
            except (TimeoutError, websockets.exceptions.WebSocketException):
                await self._drop()
        if self._socket is None:
            async with self._connecting:  # warm() may be opening it already
                if self._socket is None:
                    await self._connect()
        return self._socket

    async def _connect(self) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                self._socket = await self._tts.connect(stack)
        except (ApiError, OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            await stack.aclose()
            raise TextToSpeechFailed(f"Deepgram speech unavailable ({_reason(exc)})", retryable=True) from exc
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    async def warm(self) -> None:
        """Open the socket before the first sentence (the notice), so it waits for no handshake."""
        try:
            await self._open()
        except TextToSpeechFailed as exc:
            log.warning("Deepgram speech could not be opened ahead: %s", exc)

    async def _drop(self) -> None:
        stack, self._stack, self._socket, self._clearing = self._stack, None, None, False
        self._in_flight = False
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def _start(self, text: str) -> Any:
        """The socket, told to speak ``text``. A socket Deepgram closed while the call was quiet
        (an idle timeout) fails on the first send: one fresh socket before giving up."""
        for attempt in (1, 2):
            socket = await self._open()
            try:
                self._in_flight = True
                await socket.send_text(SpeakV1Text(type="Speak", text=text))
                await socket.send_flush()
                return socket
            except websockets.exceptions.WebSocketException as exc:
                await self._drop()
                if attempt == 2:
                    raise TextToSpeechFailed(f"Deepgram speech failed ({_reason(exc)})", retryable=True) from exc
        raise AssertionError("unreachable")

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """8 kHz mu-law for ``text`` in pieces of up to 100 ms, as Deepgram streams them."""
        text = text.strip()
        if not text:
            return
        pending = bytearray()
        try:
            socket = await self._start(text)
            while True:
                async with asyncio.timeout(SILENCE_SECONDS):
                    message = await socket.recv()
                if isinstance(message, bytes):
                    pending += message
                    while len(pending) >= CHUNK_BYTES:
                        yield bytes(pending[:CHUNK_BYTES])
                        del pending[:CHUNK_BYTES]
                elif _kind(message) == "Flushed":
                    self._in_flight = False
                    break
                elif _kind(message) == "Warning":
                    code = getattr(message, "code", "")
                    raise TextToSpeechFailed(f"Deepgram speech warning ({code})", retryable=True)
        except (TimeoutError, websockets.exceptions.WebSocketException) as exc:
            await self._drop()
            raise TextToSpeechFailed(f"Deepgram speech failed ({_reason(exc)})", retryable=True) from exc
        except TextToSpeechFailed:
            await self._drop()
            raise
        finally:
            if self._in_flight and self._socket is not None:
                # Barge-in (or the caller hung up): stop Deepgram speaking what nobody will hear.
                self._in_flight = False
                try:
                    await self._socket.send_clear()
                    self._clearing = True
                except websockets.exceptions.WebSocketException:
                    await self._drop()
        if pending:
            yield bytes(pending)

    async def aclose(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.send_close()
        await self._drop()


def _kind(message: Any) -> str | None:
    """A server message's ``type``. By its ``type`` and not its class: deepgram-sdk 7.17 parses
    ``Cleared`` into ``SpeakV1Flushed`` (both models accept either type)."""
    return None if isinstance(message, bytes) else getattr(message, "type", None)


def _reason(exc: BaseException) -> str:
    """What went wrong, without anything the SDK put in the exception (headers, URLs)."""
    if isinstance(exc, ApiError):
        return f"status {exc.status_code}"
    if isinstance(exc, websockets.exceptions.ConnectionClosed):
        frame = exc.rcvd
        return f"closed {frame.code} {frame.reason}" if frame is not None else "connection lost"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return type(exc).__name__
