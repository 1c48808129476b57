"""OpenAI Realtime (the GA interface) through the official SDK's websocket client.

Audio is ``audio/pcmu`` in both directions, so Twilio's base64 payloads pass through unchanged:
``input_audio_buffer.append.audio`` on the way in, ``response.output_audio.delta.delta`` on the
way out. Events are read as raw JSON and mapped to :mod:`voice.realtime` events without building
the SDK's typed models (one event per ~20-100 ms of audio per call).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import orjson
from openai import AsyncOpenAI, OpenAIError
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.connection import Connection as WebSocketConnection
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.frames import DATA_OPCODES, Frame, Opcode, apply_mask
from websockets.protocol import State
from websockets.streams import StreamReader

from core.models.voice_models import default_voice_model
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    Other,
    RealtimeDisconnected,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)
from voice.ws_frames import text_frame_head

log = logging.getLogger(__name__)
_AT_EOF_CODE = StreamReader.at_eof.__code__

TRANSCRIPTION_MODEL = "gpt-4o-mini-transcribe"


def session_payload(config: SessionConfig) -> dict[str, Any]:
    return {
        "type": "realtime",
        "instructions": config.instructions,
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcmu"},
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": 0.5,
                    "prefix_padding_ms": 300,
                    "silence_duration_ms": 500,
                    "create_response": True,
                    "interrupt_response": True,
                },
                "transcription": {"model": TRANSCRIPTION_MODEL},
            },
            "output": {"format": {"type": "audio/pcmu"}, "voice": config.voice},
        },
        "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
            for t in config.tools
        ],
        "tool_choice": "auto",
    }


AUDIO_DELTA = "response.output_audio.delta"
# An audio delta names its type near the start (after at most an event id); only a quick filter
# so other events are not parsed twice: the type is checked after parsing, and a delta laid out
# otherwise takes the ordinary path.
_AUDIO_DELTA_NAME = b'"' + AUDIO_DELTA.encode() + b'"'


def _audio_delta(data: dict[str, Any]) -> AudioDelta:
    return AudioDelta(data.get("response_id", ""), data.get("item_id", ""), data.get("delta", ""))


def map_event(data: dict[str, Any]) -> RealtimeEvent:
    kind = data.get("type", "")
    if kind == AUDIO_DELTA:
        return _audio_delta(data)
    if kind == "input_audio_buffer.speech_started":
        return SpeechStarted(data.get("item_id"), data.get("audio_start_ms"))
    if kind == "input_audio_buffer.speech_stopped":
        end = data.get("audio_end_ms")
        return SpeechStopped(data.get("item_id"), end if isinstance(end, int) and not isinstance(end, bool) else None)
    if kind == "response.created":
        return ResponseCreated((data.get("response") or {}).get("id", ""))
    if kind == "response.done":
        response = data.get("response") or {}
        calls = sum(1 for item in response.get("output") or () if item.get("type") == "function_call")
        return ResponseDone(response.get("id", ""), response.get("status", "completed"), calls)
    if kind == "response.function_call_arguments.done":
        return FunctionCall(
            data.get("response_id", ""), data.get("call_id", ""), data.get("name", ""), data.get("arguments", "")
        )
    if kind == "response.output_audio_transcript.done":
        return AssistantTranscript(data.get("response_id", ""), data.get("item_id", ""), data.get("transcript", ""))
    if kind == "conversation.item.input_audio_transcription.completed":
        return UserTranscript(data.get("item_id", ""), data.get("transcript", ""))
    if kind == "error":
        error = data.get("error") or {}
        return ModelErrorEvent(str(error.get("code") or error.get("type") or "error"), str(error.get("message", "")))
    return Other(kind, data)


class RealtimeSocket(ClientConnection):
    """The SDK's ``websockets`` connection, made through ``create_connection`` (a documented option
    of ``websockets.asyncio.client.connect`` the SDK passes through), with one hook: while the
    reader waits in ``recv`` with no message queued, a complete text message is first offered to
    ``fast`` as soon as it is parsed; ``fast`` returns True when it handled the message. Everything
    else goes to ``recv`` as before, in order. For the model's audio this skips websockets' message
    queue, a future and a task switch per 20 ms frame.

    The bytes are framed here first (``data_received``) while websockets' parser waits at a frame
    boundary: websockets' generator-based parser was the largest Python cost per model frame
    (py-spy, 100 calls: 13 % of the server's time). Only whole, final, unmasked text frames with
    no reserved bits and a 16-bit length (126 B to 64 KiB: every audio delta) are offered to
    ``fast``; at the first frame that is anything else, or that ``fast`` declines, or that is cut
    off at the end of the read, the rest of the bytes go to websockets unchanged, which then
    parses exactly what it would have."""

    fast: Callable[[bytes], bool] | None = None
    waiting = False  # the reader is parked in recv
    queued = 0  # complete messages queued for recv and not yet read

    def data_received(self, data: bytes) -> None:
        fast = self.fast
        if fast is None or not self._between_frames():
            super().data_received(data)
            return
        size_limit = self.protocol.max_message_size
        end, at = len(data), 0
        while at + 4 <= end and self.waiting and not self.queued:
            if data[at] != 0x81 or data[at + 1] != 126:  # FIN + text, unmasked, a 16-bit length
                break
            size = (data[at + 2] << 8) | data[at + 3]
            stop = at + 4 + size
            if stop > end or (size_limit is not None and size > size_limit) or not fast(data[at + 4 : stop]):
                break
            at = stop
        if at < end:
            super().data_received(data[at:] if at else data)

    def _between_frames(self) -> bool:
        """Whether websockets' parser has consumed every byte so far and waits for a new frame
        (parked in ``StreamReader.at_eof`` at the top of its loop, with the connection open)."""
        protocol = self.protocol
        if protocol.state is not State.OPEN or protocol.reader.buffer or protocol.expect_continuation_frame:
            return False
        inner = protocol.parser
        while (outer := getattr(inner, "gi_yieldfrom", None)) is not None:
            inner = outer
        return getattr(inner, "gi_code", None) is _AT_EOF_CODE

    def process_event(self, event: Any) -> None:
        if type(event) is Frame and event.fin and event.opcode in DATA_OPCODES:
            fast = self.fast
            if (fast is not None and self.waiting and not self.queued and event.opcode is Opcode.TEXT
                    and fast(event.data)):  # fmt: skip
                return
            self.queued += 1
        super().process_event(event)


def writes_directly(raw: Any) -> bool:
    """Whether the SDK's socket is the ``websockets`` asyncio connection ``append_audio_nowait``
    writes to (a later SDK or ``websockets`` may change either; then every append takes the
    awaited path, slower but the same on the wire)."""
    protocol = getattr(raw, "protocol", None)
    return (
        isinstance(raw, WebSocketConnection)
        and all(hasattr(raw, name) for name in ("paused", "send_in_progress", "transport"))
        and all(hasattr(protocol, name) for name in ("state", "expect_continuation_frame", "extensions", "writes"))
    )


class _MaskKeys:
    """Masking keys for our client frames. RFC 6455 (5.3) wants each unpredictable, from a strong
    source of entropy; ``websockets`` asks the OS for 4 bytes per frame, a getrandom syscall per
    20 ms of audio per call. These come from ``os.urandom`` 4 KiB at a time, each used once."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(4096), 0
        self._at = at + 4
        return self._pool[at : at + 4]


_MASK_KEYS = _MaskKeys()
_next_key = _MASK_KEYS.next
# A forked child draws its own keys rather than reusing the parent's unused ones.
os.register_at_fork(after_in_child=_MASK_KEYS.__init__)
_APPEND_HEAD = '{"type":"input_audio_buffer.append","audio":"'
_HEAD_16 = bytes((0x81, 0x80 | 126))  # FIN + text, masked, a 16-bit length follows (RFC 6455 5.2)


def masked_text_frame(data: bytes) -> bytes:
    """One final, masked text frame (a client's, RFC 6455 5.2) carrying ``data``."""
    key = _MASK_KEYS.next()
    return text_frame_head(len(data), masked=True) + key + apply_mask(data, key)


class OpenAIRealtimeConnection:
    # What differs between OpenAI's realtime protocols on the audio path (GPT-Live's connection
    # subclasses this one): the append event's opening, the audio delta's type and its event.
    append_head = _APPEND_HEAD
    audio_delta = AUDIO_DELTA
    audio_delta_name = _AUDIO_DELTA_NAME
    audio_event = staticmethod(_audio_delta)

    def __init__(self, conn: Any):
        self._conn = conn
        # The audio hot path writes to the SDK's underlying ``websockets`` connection: the SDK's
        # send adds a send-queue check with an anyio task lookup to every frame (about a fifth of
        # the server's time per frame under load, by py-spy). Other events keep the SDK's send.
        # Falls back to it if a later SDK renames the attribute.
        raw = getattr(conn, "_connection", None)
        self._send_audio = raw.send if raw is not None and hasattr(raw, "send") else conn.send_raw
        # Reading likewise: the SDK's recv_bytes adds a debug log call and a reconnect check to every
        # event (one per 20 ms of audio per call); the raw read returns the same bytes.
        recv = getattr(raw, "recv", None) if raw is not None else None
        self._recv = (lambda: recv(decode=False)) if recv is not None else conn.recv_bytes
        self._direct = raw if writes_directly(raw) else None
        self._socket = raw if isinstance(raw, RealtimeSocket) else None
        self._sink: Callable[[AudioDelta], bool] | None = None

    def deliver_audio_to(self, sink: Callable[[AudioDelta], bool]) -> None:
        if self._socket is not None:
            self._sink = sink
            self._socket.fast = self._fast_audio

    def _fast_audio(self, data: bytes) -> bool:
        sink = self._sink
        if sink is None or data.find(self.audio_delta_name, 0, 128) < 0:
            return False
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if type(event) is not dict or event.get("type") != self.audio_delta:
            return False
        try:
            return sink(self.audio_event(event))
        except Exception:
            # Not into websockets' read path. Dropped, not handed on: the sink may have sent the
            # audio already, and the ordinary path would send it twice.
            log.exception("relaying the model's audio failed")
            return True

    def append_audio_nowait(self, payload: str) -> bool:
        # The hot path without a coroutine: the frame is built here and written to the socket's
        # transport, which is what ``websockets``' own ``send`` does when it would not wait, minus
        # its async context manager, drain, frame object and a getrandom syscall per frame for
        # the mask (see _MaskKeys). Only while the connection is plainly open with nothing of
        # websockets' own in between: no extension (no compression), no fragmented send under
        # way, nothing unsent, the buffer under its high-water mark. Otherwise nothing is sent and
        # the caller awaits ``append_audio``, which waits or reports the close as ``send`` does.
        raw = self._direct
        if raw is None or raw.paused or raw.send_in_progress is not None or raw.transport.is_closing():
            return False
        protocol = raw.protocol
        if (protocol.state is not State.OPEN or protocol.expect_continuation_frame or protocol.extensions
                or protocol.writes):  # fmt: skip
            return False
        data = (self.append_head + payload + '"}').encode()
        size = len(data)
        key = _next_key()
        # masked_text_frame, inline: an append is 126 B to 64 KiB (a 16-bit length) but for tiny payloads
        head = _HEAD_16 + size.to_bytes(2, "big") if 126 <= size < 65536 else text_frame_head(size, masked=True)
        try:
            raw.transport.write(head + key + apply_mask(data, key))
        except (OSError, RuntimeError) as exc:
            raise RealtimeDisconnected("the realtime socket is closed") from exc
        return True

    async def _send(self, event: dict[str, Any]) -> None:
        try:
            # The SDK's raw send: a typed-param transform per audio frame would sit on the hot path.
            await self._conn.send_raw(orjson.dumps(event).decode())
        except (ConnectionClosed, WebSocketException, OSError, OpenAIError) as exc:
            raise RealtimeDisconnected("the realtime socket is closed") from exc

    async def configure(self, config: SessionConfig) -> None:
        await self._send({"type": "session.update", "session": session_payload(config)})

    async def append_audio(self, payload: str) -> None:
        # The hot path (every 20 ms per call): built as a string; base64 needs no JSON escaping.
        try:
            await self._send_audio(self.append_head + payload + '"}')
        except (ConnectionClosed, WebSocketException, OSError, OpenAIError) as exc:
            raise RealtimeDisconnected("the realtime socket is closed") from exc

    async def send_tool_output(self, call_id: str, output: str) -> None:
        await self._send(
            {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                          "output": output}}
        )  # fmt: skip

    async def add_note(self, text: str) -> None:
        await self._send(
            {"type": "conversation.item.create",
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
        )  # fmt: skip

    async def create_response(self, instructions: str | None = None) -> None:
        event: dict[str, Any] = {"type": "response.create"}
        if instructions is not None:
            event["response"] = {"instructions": instructions}
        await self._send(event)

    async def cancel_response(self) -> None:
        await self._send({"type": "response.cancel"})

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        await self._send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms}
        )

    async def events(self) -> AsyncIterator[RealtimeEvent]:
        sock = self._socket
        while True:
            try:
                if sock is None:
                    raw = await self._recv()
                else:
                    sock.waiting = True
                    try:
                        raw = await self._recv()
                    finally:
                        sock.waiting = False
                    sock.queued -= 1
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                raise RealtimeDisconnected("the realtime socket closed", close_code=code) from exc
            except (WebSocketException, OSError, OpenAIError) as exc:
                raise RealtimeDisconnected("the realtime socket failed") from exc
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                log.warning("realtime model sent a frame that is not JSON; ignored")
                continue
            if isinstance(data, dict):
                yield self.map_event(data)

    def map_event(self, data: dict[str, Any]) -> RealtimeEvent:
        return map_event(data)


class OpenAIRealtime:
    """Connects one session per call. ``base_url`` follows the SDK (``OPENAI_BASE_URL`` style)."""

    name = "openai-realtime"

    def __init__(
        self,
        *,
        api_key: str,
        model: str = default_voice_model("openai-realtime"),
        base_url: str | None = None,
        websocket_base_url: str | None = None,
    ):
        self.model = model
        self._client = AsyncOpenAI(
            api_key=api_key, base_url=base_url, websocket_base_url=websocket_base_url, max_retries=0
        )

    def _manager(self, options: Any) -> Any:
        """The SDK's connection manager for one session (GPT-Live's adapter opens ``client.live``)."""
        return self._client.realtime.connect(model=self.model, websocket_connection_options=options)

    def _session(self, conn: Any) -> OpenAIRealtimeConnection:
        return OpenAIRealtimeConnection(conn)

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[OpenAIRealtimeConnection]:
        try:
            # No permessage-deflate: it costs zlib time on every 20 ms frame and base64 audio barely shrinks.
            options = {"compression": None, "create_connection": RealtimeSocket}
            manager = self._manager(cast(Any, options))
            conn = await manager.__aenter__()
        except (OpenAIError, WebSocketException, OSError) as exc:
            raise RealtimeDisconnected("cannot open the realtime socket") from exc
        try:
            yield self._session(conn)
        finally:
            try:
                await manager.__aexit__(None, None, None)
            except (WebSocketException, OSError):
                log.debug("realtime socket close failed", exc_info=True)

    async def aclose(self) -> None:
        await self._client.close()
