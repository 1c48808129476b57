"""A loopback OpenAI Realtime server (GA interface) for tests and benchmarks.

    async with RealtimePeer() as peer:
        peer.script(speak("Hi, this call is transcribed.", ms=400), speak("You have two todos."))
        peer.hear("what's on my list")
        # OpenAI SDK: AsyncOpenAI(base_url=peer.base_url) -> ws://127.0.0.1:PORT/v1/realtime?model=...

Behaviour (wire-protocols.md section 5):

* ``session.created`` first; ``session.update`` is merged and answered with ``session.updated``.
* The retired beta header (``OpenAI-Beta``) is rejected with close code 4000
  ``beta_api_shape_disabled``, like production.
* Server VAD over the appended mu-law audio (an energy threshold): ``speech_started`` when the
  caller speaks, cancelling a response in progress (``interrupt_response``); after 500 ms of
  silence ``speech_stopped``, ``committed``, a transcription (the next :meth:`hear` text) and an
  automatic response.
* Each ``response.create`` (or automatic response) plays the next scripted response: audio deltas
  in ``chunk_ms`` chunks paced by ``pace`` seconds, its transcript (each item of ``then`` likewise,
  as its own item of the same response: a preamble, then the answer), its function calls, then
  ``response.done``. After function calls the peer waits for ``function_call_output`` items and a
  ``response.create``, as the real server does.
* :meth:`script_session` gives the next socket that connects its own script (and transcripts), so
  concurrent calls can each play a different part; other sockets share the common script.
* With ``transcripts_held`` set, transcriptions wait for :meth:`release_transcripts` (the real
  server finishes them beside the reply, often after it).
* A function call's arguments may be a string, sent as is (malformed JSON, for tests of bad input).
* ``response.cancel`` ends the running response with ``status: cancelled`` (or an error event when
  none runs); ``conversation.item.truncate`` is recorded and answered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from voice.codec import audioop
from voice.testing.socket_faults import Refusals, cut

SILENCE = b"\xff"


@functools.lru_cache(maxsize=16)
def _tone_second(hz: float, level: int) -> bytes:
    pcm = b"".join(
        int(level * math.sin(2 * math.pi * hz * i / 8000)).to_bytes(2, "little", signed=True) for i in range(8000)
    )
    return audioop.lin2ulaw(pcm, 2)


def tone(ms: int, hz: float = 440.0, level: int = 8000) -> bytes:
    """A tone as 8 kHz mu-law (what the peer "says" when no audio is scripted); whole-hertz
    frequencies repeat every second, so one computed second is tiled."""
    second = _tone_second(hz, level)
    size = 8 * ms
    return (second * (size // len(second) + 1))[:size]


@dataclass
class ScriptedResponse:
    text: str = ""
    audio: bytes | None = None  # mu-law 8 kHz; None: a tone of ``ms``
    ms: int = 300
    calls: tuple[tuple[str, dict[str, Any] | str], ...] = ()
    # More spoken items in the same response after this one (a preamble, then the answer).
    then: tuple[ScriptedResponse, ...] = ()

    def audio_bytes(self) -> bytes:
        if self.audio is not None:
            return self.audio
        return tone(self.ms) if self.ms > 0 else b""


def speak(text: str, *, ms: int = 300, audio: bytes | None = None) -> ScriptedResponse:
    return ScriptedResponse(text=text, audio=audio, ms=ms)


def call_tool(
    name: str, arguments: dict[str, Any] | str | None = None, *, text: str = "", ms: int = 0
) -> ScriptedResponse:
    return ScriptedResponse(text=text, ms=ms, calls=((name, {} if arguments is None else arguments),))


@dataclass
class PeerSession:
    """One model socket as the peer saw it."""

    headers: dict[str, str]
    path: str
    config: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    audio_in: bytearray = field(default_factory=bytearray)
    first_audio_at: float | None = None
    truncates: list[dict[str, Any]] = field(default_factory=list)
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    response_creates: list[dict[str, Any]] = field(default_factory=list)
    cancels: int = 0
    speech_started_at: list[float] = field(default_factory=list)
    closed: bool = False

    def types(self) -> list[str]:
        return [e.get("type", "") for e in self.events]

    def tool_names(self) -> list[str]:
        return sorted(t["name"] for t in self.config.get("tools", []))


class _Conn:
    """One socket's state and behaviour."""

    def __init__(self, peer: RealtimePeer, ws: ServerConnection, record: PeerSession):
        self.peer = peer
        self.ws = ws
        self.rec = record
        self.n = 0
        self.response_task: asyncio.Task[None] | None = None
        self.response_id: str | None = None
        self.cancel_flag = False
        self.speaking = False
        self.silence_ms = 0
        self.user_item = 0
        self.awaiting_outputs: set[str] = set()
        self.index = len(peer._conns)
        # A script of its own (``RealtimePeer.script_session``) or, when none is waiting, the shared one.
        own = peer._session_scripts.popleft() if peer._session_scripts else None
        self.responses: deque[ScriptedResponse] = own[0] if own else peer._responses
        self.heard: deque[str] = own[1] if own else peer._heard

    def next_id(self, prefix: str) -> str:
        self.peer._ids += 1
        return f"{prefix}_{self.peer._ids}"

    async def emit(self, event: dict[str, Any]) -> None:
        event.setdefault("event_id", self.next_id("ev"))
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps(event))

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "input_audio_buffer.append":
            try:
                audio = base64.b64decode(event.get("audio", ""), validate=True)
            except (binascii.Error, TypeError, ValueError):
                # A bad append is refused with an error event; the session goes on.
                error = {"type": "invalid_request_error", "code": "invalid_value", "param": "audio",
                         "message": "Invalid 'audio': expected base64-encoded audio."}  # fmt: skip
                await self.emit({"type": "error", "error": error})
                return
            if self.rec.first_audio_at is None:
                self.rec.first_audio_at = time.monotonic()
            self.rec.audio_in += audio
            if self.peer.audio_hook is not None:
                self.peer.audio_hook(self.index, audio)
            if self.peer.vad:
                await self.vad(audio)
            return
        self.rec.events.append(event)
        if kind == "session.update":
            self.rec.config.update(event.get("session") or {})
            await self.emit({"type": "session.updated", "session": self.rec.config})
        elif kind == "response.create":
            self.rec.response_creates.append(event.get("response") or {})
            self.awaiting_outputs.clear()
            await self.start_response()
        elif kind == "response.cancel":
            self.rec.cancels += 1
            if self.response_task is not None and not self.response_task.done():
                self.cancel_flag = True
                await self.response_task
            else:
                await self.emit({"type": "error", "error": {"type": "invalid_request_error",
                                 "code": "response_cancel_not_active", "message": "no active response"}})  # fmt: skip
        elif kind == "conversation.item.create":
            item = event.get("item") or {}
            if item.get("type") == "function_call_output":
                self.rec.tool_outputs.append(item)
                self.awaiting_outputs.discard(item.get("call_id"))
            elif item.get("type") == "message":
                self.rec.notes.append(" ".join(c.get("text", "") for c in item.get("content", [])))
            await self.emit({"type": "conversation.item.added", "item": item})
        elif kind == "conversation.item.truncate":
            self.rec.truncates.append(event)
            await self.emit({"type": "conversation.item.truncated", "item_id": event.get("item_id"),
                             "content_index": 0, "audio_end_ms": event.get("audio_end_ms")})  # fmt: skip

    async def vad(self, audio: bytes) -> None:
        level = audioop.rms(audioop.ulaw2lin(audio, 2), 2) if audio else 0
        ms = len(audio) // 8
        if level > self.peer.vad_threshold:
            self.silence_ms = 0
            if not self.speaking:
                self.speaking = True
                self.user_item += 1
                self.rec.speech_started_at.append(time.monotonic())
                await self.emit({"type": "input_audio_buffer.speech_started", "item_id": f"item_u{self.user_item}",
                                 "audio_start_ms": len(self.rec.audio_in) // 8})  # fmt: skip
                if self.response_task is not None and not self.response_task.done():
                    self.cancel_flag = True  # interrupt_response
        elif self.speaking:
            self.silence_ms += ms
            if self.silence_ms >= 500:
                self.speaking = False
                item = f"item_u{self.user_item}"
                # As OpenAI reports it: where in the input audio the speech ended (before the silence).
                end_ms = len(self.rec.audio_in) // 8 - self.silence_ms
                await self.emit({"type": "input_audio_buffer.speech_stopped", "item_id": item, "audio_end_ms": end_ms})
                await self.emit({"type": "input_audio_buffer.committed", "item_id": item})
                text = self.heard.popleft() if self.heard else ""
                transcript = {"type": "conversation.item.input_audio_transcription.completed", "item_id": item,
                              "content_index": 0, "transcript": text}  # fmt: skip
                if self.peer.transcripts_held:
                    self.peer._held_transcripts.append((self, transcript))
                else:
                    await self.emit(transcript)
                if self.response_task is None or self.response_task.done():
                    await self.start_response()

    async def start_response(self) -> None:
        if self.response_task is not None and not self.response_task.done():
            await self.emit({"type": "error", "error": {"type": "invalid_request_error",
                             "code": "conversation_already_has_active_response", "message": "busy"}})  # fmt: skip
            return
        scripted = self.responses.popleft() if self.responses else self.peer.default_response()
        self.cancel_flag = False
        self.response_id = self.next_id("resp")
        self.response_task = asyncio.get_running_loop().create_task(
            self.play(self.response_id, scripted), name=f"realtime-peer-{self.response_id}"
        )

    async def play(self, response_id: str, scripted: ScriptedResponse) -> None:
        await self.emit({"type": "response.created", "response": {"id": response_id, "object": "realtime.response",
                         "status": "in_progress", "output": []}})  # fmt: skip
        output: list[dict[str, Any]] = []
        status = "completed"
        for index, spoken in enumerate((scripted, *scripted.then)):
            audio = spoken.audio_bytes()
            if not audio or status != "completed":
                continue
            item_id = self.next_id("item_a")
            chunk = 8 * self.peer.chunk_ms
            for offset in range(0, len(audio), chunk):
                if self.cancel_flag:
                    status = "cancelled"
                    break
                part = audio[offset : offset + chunk]
                if self.peer.delta_hook is not None:
                    part = self.peer.delta_hook(self.index, part)
                await self.emit({"type": "response.output_audio.delta", "response_id": response_id,
                                 "item_id": item_id, "output_index": index, "content_index": 0,
                                 "delta": base64.b64encode(part).decode()})  # fmt: skip
                if self.peer.pace:
                    await asyncio.sleep(self.peer.pace)
            if status == "completed":
                await self.emit({"type": "response.output_audio.done", "response_id": response_id, "item_id": item_id})
                await self.emit({"type": "response.output_audio_transcript.done", "response_id": response_id,
                                 "item_id": item_id, "transcript": spoken.text})  # fmt: skip
            output.append({"type": "message", "id": item_id, "role": "assistant"})
        if status == "completed":
            for name, arguments in scripted.calls:
                call_id = self.next_id("call")
                args = arguments if isinstance(arguments, str) else json.dumps(arguments)
                await self.emit({"type": "response.function_call_arguments.done", "response_id": response_id,
                                 "item_id": self.next_id("item_f"), "call_id": call_id, "name": name,
                                 "arguments": args})  # fmt: skip
                output.append({"type": "function_call", "call_id": call_id, "name": name, "arguments": args})
                self.awaiting_outputs.add(call_id)
        await self.emit({"type": "response.done", "response": {"id": response_id, "object": "realtime.response",
                         "status": status, "output": output}})  # fmt: skip


class RealtimePeer:
    def __init__(
        self,
        *,
        chunk_ms: int = 100,
        pace: float = 0.01,
        vad: bool = True,
        vad_threshold: int = 300,
        default_ms: int = 200,
    ) -> None:
        self.chunk_ms = chunk_ms
        self.pace = pace
        self.vad = vad
        self.vad_threshold = vad_threshold
        self.default_ms = default_ms
        self.sessions: list[PeerSession] = []
        self.audio_hook: Callable[[int, bytes], None] | None = None  # (socket index, appended chunk decoded)
        self.delta_hook: Callable[[int, bytes], bytes] | None = None  # (socket index, chunk) -> chunk
        self._responses: deque[ScriptedResponse] = deque()
        self._heard: deque[str] = deque()
        self._session_scripts: deque[tuple[deque[ScriptedResponse], deque[str]]] = deque()
        self._conns: list[_Conn] = []
        # Real transcription runs beside the model and often ends after the reply it started.
        self.transcripts_held = False
        self._held_transcripts: list[tuple[_Conn, dict[str, Any]]] = []
        self._server: Server | None = None
        self._ids = 0
        self.port = 0
        self.refusals = Refusals()  # ``peer.refusals.refuse = 1``: the next handshake gets HTTP 503

    def script(self, *responses: ScriptedResponse) -> None:
        self._responses.extend(responses)

    def script_session(self, *responses: ScriptedResponse, heard: tuple[str, ...] = ()) -> None:
        """The next socket to connect plays these responses (and hears these transcripts) alone."""
        self._session_scripts.append((deque(responses), deque(heard)))

    def hear(self, *transcripts: str) -> None:
        """What the transcription of the caller's next utterances says."""
        self._heard.extend(transcripts)

    async def release_transcripts(self) -> None:
        """Send the transcriptions held while ``transcripts_held`` was set, in order, and stop holding."""
        self.transcripts_held = False
        held, self._held_transcripts = self._held_transcripts, []
        for conn, transcript in held:
            await conn.emit(transcript)

    def default_response(self) -> ScriptedResponse:
        return ScriptedResponse(text="(unscripted)", ms=self.default_ms)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def websocket_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> RealtimePeer:
        self._server = await serve(
            self._handler, "127.0.0.1", 0, max_size=None, compression=None, process_request=self.refusals.check
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def respond(self, index: int = -1) -> None:
        """Start the next scripted response on one socket unprompted (as server VAD would)."""
        await self._conns[index].start_response()

    async def speech_started(self, index: int = -1) -> None:
        """Report caller speech on one socket, as server VAD would (cancels a running response)."""
        conn = self._conns[index]
        conn.user_item += 1
        await conn.emit({"type": "input_audio_buffer.speech_started", "item_id": f"item_u{conn.user_item}",
                         "audio_start_ms": len(conn.rec.audio_in) // 8})  # fmt: skip
        if conn.response_task is not None and not conn.response_task.done():
            conn.cancel_flag = True

    async def drop(self, index: int = -1) -> None:
        """Drop one model socket abruptly (close code 1011), as a failing upstream would."""
        conn = self._conns[index]
        await conn.ws.close(1011, "upstream failure")

    def cut(self, index: int = -1) -> float:
        """End one model socket without a close frame (the network gone); returns when."""
        return cut(self._conns[index].ws)

    async def server_error(self, index: int = -1) -> float:
        """The server's own failure as an ``error`` event (its 5xx), as OpenAI sends it; returns when."""
        at = time.monotonic()
        error = {"type": "server_error", "code": None, "param": None, "event_id": None,
                 "message": "The server had an error while processing your request."}  # fmt: skip
        await self._conns[index].emit({"type": "error", "error": error})
        return at

    async def wait_for(self, predicate: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("the realtime peer never saw what the test waited for")
            await asyncio.sleep(0.01)

    async def _handler(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        record = PeerSession(headers, request.path)
        self.sessions.append(record)
        if "openai-beta" in headers:
            error = {"type": "invalid_request_error", "code": "beta_api_shape_disabled",
                     "message": "The beta API shape is retired."}  # fmt: skip
            await ws.send(json.dumps({"type": "error", "error": error}))
            await ws.close(4000, "beta_api_shape_disabled")
            return
        if not request.path.startswith("/v1/realtime") or "authorization" not in headers:
            await ws.close(4001, "bad request")
            return
        conn = _Conn(self, ws, record)
        self._conns.append(conn)
        created = {"type": "realtime", "id": conn.next_id("sess"), "object": "realtime.session",
                   "model": "gpt-realtime-2", "output_modalities": ["audio"]}  # fmt: skip
        await conn.emit({"type": "session.created", "session": created})
        try:
            async for raw in ws:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                await conn.handle(event)
        except ConnectionClosed:
            pass
        finally:
            record.closed = True
            if conn.response_task is not None:
                conn.response_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conn.response_task
