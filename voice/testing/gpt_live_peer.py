"""A loopback OpenAI GPT-Live server for tests and benchmarks, speaking the event types of the
installed SDK (``openai/types/live``).

    async with GptLivePeer() as peer:
        # OpenAI SDK: AsyncOpenAI(websocket_base_url=peer.websocket_url) -> ws://127.0.0.1:PORT/v1/live/sessions
        session = await peer.next_session()
        await session.caller_says("what's on tomorrow")      # session.input_transcript.delta
        delegation = await session.delegate()                  # session.delegation.created
        await peer.wait_for(lambda: session.results(delegation))

Behaviour (shared/reference/gpt-live.md):

* The first client event must be ``session.start``; its session is strict (a field the SDK's
  ``SessionConfigParam`` lacks is an ``unknown_parameter`` error, and the session does not start).
  ``session.started`` carries the id and ``expires_at``.
* ``session.input_audio.append`` is recorded (not acknowledged), never before the start.
* ``session.{thinking,commentary,instructions}.append`` are checked (content a non-empty string
  of at most 500 tokens, counted as characters / 4; ``delegation_id`` present and either null or
  a delegation of this session) and acknowledged with ``…appended {client_event_id}``; an invalid
  one is an ``error`` that does not close the session.
* With ``speak_commentary`` (the default) the model says each commentary: audio deltas (a tone,
  ``chunk_ms`` at a time, ``pace`` seconds apart) and its words as output transcript fragments.
  "Say exactly this, and nothing else: X" says X.
* Full duplex: caller words that arrive while it speaks stop its speech (it stops itself).
* ``session.output_audio.fixture.play {audio}`` (raw PCM16 24 kHz, at most 30 s, validated whole
  first: an ``error`` otherwise): the model's speech stops, input is muted, ``…fixture.playing``,
  the clip goes out as ``output_audio.delta`` in the session's format (pcmu 8 kHz here) at the
  peer's pace, then ``…fixture.played {client_event_id}``; caller audio appended while it plays is
  dropped (``audio_dropped``), not replayed. One fixture at a time.
* ``session.close`` answers ``session.closed {reason: close_requested}`` and closes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from voice.adapters.gpt_live import START_FIELDS
from voice.codec import audioop
from voice.testing.realtime_peer import tone
from voice.testing.socket_faults import Refusals

SAY_EXACTLY = "Say exactly this, and nothing else: "
APPENDS = ("thinking", "commentary", "instructions")
FIXTURE_RATE = 24000
FIXTURE_MAX_BYTES = 30 * FIXTURE_RATE * 2


@dataclass
class LiveSession:
    """One Live socket as the peer saw it."""

    headers: dict[str, str]
    path: str
    peer: GptLivePeer
    config: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    audio_in: bytearray = field(default_factory=bytearray)
    first_audio_at: float | None = None
    started_at: float | None = None
    appends: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    delegations: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    interrupted: int = 0
    sip: bool = False  # a SIP session: its audio goes to the SIP leg, never on the (sideband) socket
    sip_out: bytearray = field(default_factory=bytearray)  # what the SIP caller was played
    fixtures: list[bytes] = field(default_factory=list)  # each fixture played, as the pcmu sent
    fixture_playing: bool = False
    audio_dropped: int = 0  # bytes of caller audio dropped while a fixture played
    closed: bool = False
    ws: ServerConnection | None = None
    _speaking: asyncio.Task[None] | None = None
    _seq: int = 0

    def now_ms(self) -> int:
        return round((time.monotonic() - (self.started_at or time.monotonic())) * 1000)

    def types(self) -> list[str]:
        return [e.get("type", "") for e in self.events]

    def results(self, delegation_id: str) -> list[dict[str, Any]]:
        """The thinking and commentary appended for one delegation."""
        return [a for a in self.appends if a.get("delegation_id") == delegation_id]

    def result_text(self, delegation_id: str) -> str:
        return " ".join(a["content"] for a in self.results(delegation_id))

    # --- What the test scripts ------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        self._seq += 1
        event.setdefault("event_id", f"event_{self._seq}")
        assert self.ws is not None
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps(event))

    async def send_raw(self, text: str) -> None:
        assert self.ws is not None
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(text)

    async def caller_says(self, text: str, ms: int = 600) -> None:
        """The caller's words (the model transcribes them), ending now; talking over the model's
        speech stops it."""
        if self.fixture_playing:
            return  # input is muted while a fixture plays: the model never hears these words
        end = self.now_ms()
        if self._speaking is not None and not self._speaking.done():
            self._speaking.cancel()
            self.interrupted += 1
        await self.send({"type": "session.input_transcript.delta", "delta": text + " ", "start_ms": max(0, end - ms),
                         "end_ms": end})  # fmt: skip

    async def delegate(self, delegation_id: str | None = None) -> str:
        ident = delegation_id or f"dlg_{secrets.token_hex(6)}"
        self.delegations.append(ident)
        await self.send({"type": "session.delegation.created", "offset_ms": self.now_ms(),
                         "delegation": {"id": ident, "target": "client", "type": "delegation"}})  # fmt: skip
        return ident

    async def usage(self, seconds: float) -> None:
        await self.send({"type": "session.usage.updated", "usage": {"seconds": seconds}})

    def speak(self, text: str, ms: int | None = None) -> asyncio.Task[None]:
        """Say ``text`` (a tone of ``ms``, by default 60 ms a word) after what is being said."""
        previous = self._speaking
        self._speaking = asyncio.get_running_loop().create_task(self._speak(text, ms, previous))
        return self._speaking

    async def _speak(self, text: str, ms: int | None, previous: asyncio.Task[None] | None) -> None:
        if previous is not None and not previous.done():
            with contextlib.suppress(asyncio.CancelledError):
                await previous
        audio = tone(ms if ms is not None else max(300, 60 * len(text.split())), hz=self.peer.hz)
        self.said.append(text)
        step = 8 * self.peer.chunk_ms
        start = self.now_ms()
        await self.send({"type": "session.output_transcript.delta", "delta": text, "start_ms": start,
                         "end_ms": start + len(audio) // 8})  # fmt: skip
        for at in range(0, len(audio), step):
            await self._out(audio[at : at + step])
            await asyncio.sleep(self.peer.pace)

    async def _out(self, chunk: bytes) -> None:
        if self.sip:
            self.sip_out += chunk  # to the caller over SIP: the sideband carries no audio
        else:
            await self.send({"type": "session.output_audio.delta", "delta": base64.b64encode(chunk).decode()})

    async def drop(self) -> None:
        """The socket fails (no close frame)."""
        assert self.ws is not None
        self.ws.transport.abort()

    # --- The server's side ----------------------------------------------------------------------

    async def server_error(self) -> float:
        """The server's own failure as an ``error`` event (its 5xx); returns when it was sent."""
        at = time.monotonic()
        await self.send({"type": "error", "error": {"type": "server_error", "code": "server_error",
                                                    "message": "The server had an error."}})  # fmt: skip
        return at

    async def error(self, code: str, message: str, client_event_id: Any = None) -> None:
        error = {"type": "invalid_request_error", "code": code, "message": message}
        if isinstance(client_event_id, str):
            error["client_event_id"] = client_event_id
        self.errors.append(error)
        await self.send({"type": "error", "error": error})

    async def handle(self, event: dict[str, Any]) -> bool:
        """One client event; False once the session is over."""
        kind = event.get("type")
        client_id = event.get("event_id")
        if self.sip and kind == "session.start":
            await self.error("session_already_started", "a sideband attaches to a started session", client_id)
            return True
        if self.started_at is None:
            if kind != "session.start":
                await self.error("session_not_started", "send session.start first", client_id)
                return True
            session = event.get("session")
            unknown = sorted(set(session) - START_FIELDS) if isinstance(session, dict) else ["session"]
            if unknown or not isinstance(session, dict) or not session.get("model"):
                await self.error("unknown_parameter", f"unknown or missing: {', '.join(unknown) or 'model'}", client_id)
                return True
            self.config, self.id, self.started_at = session, f"sess_{secrets.token_hex(6)}", time.monotonic()
            await self.send({"type": "session.started", "session": {
                "id": self.id, "expires_at": int(time.time()) + 7200, "model": session["model"], "status": "active",
                "object": "live.session", "audio": session.get("audio"), "delegation": session.get("delegation"),
                "instructions": session.get("instructions")}})  # fmt: skip
            return True
        if kind == "session.input_audio.append":
            try:
                audio = base64.b64decode(event.get("audio", ""), validate=True)
            except (ValueError, TypeError):
                await self.error("invalid_audio", "audio is not base64", client_id)
                return True
            if self.fixture_playing:
                self.audio_dropped += len(audio)  # muted: dropped and not replayed
                return True
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self.audio_in.extend(audio)
            return True
        if isinstance(kind, str) and kind.startswith("session.") and kind.endswith(".append"):
            what = kind[len("session.") : -len(".append")]
            if what in APPENDS:
                await self._append(what, event)
                return True
        if kind == "session.output_audio.fixture.play":
            await self._fixture(event)
            return True
        if kind == "session.close":
            await self.send({"type": "session.closed", "reason": "close_requested",
                             "usage": {"seconds": self.now_ms() // 1000}})  # fmt: skip
            return False
        if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            await self.send({"type": f"{kind}d", "client_event_id": client_id})
            return True
        await self.error("unknown_event", f"unknown client event {kind!r}", client_id)
        return True

    async def _fixture(self, event: dict[str, Any]) -> None:
        client_id = event.get("event_id")
        try:
            pcm = base64.b64decode(event.get("audio") or "", validate=True)
        except (ValueError, TypeError):
            pcm = b""
        if not pcm or len(pcm) % 2 or len(pcm) > FIXTURE_MAX_BYTES:
            await self.error("invalid_audio", "a fixture is raw PCM16 at 24 kHz, at most 30 s", client_id)
            return
        if self.fixture_playing:
            await self.error("fixture_active", "a fixture is already playing", client_id)
            return
        if self._speaking is not None and not self._speaking.done():
            self._speaking.cancel()  # the model's speech is interrupted
            self.interrupted += 1
        self.fixture_playing = True
        await self.send({"type": "session.output_audio.fixture.playing", "client_event_id": client_id})
        lin8, _ = audioop.ratecv(pcm, 2, 1, FIXTURE_RATE, 8000, None)
        self._speaking = asyncio.get_running_loop().create_task(self._play_fixture(audioop.lin2ulaw(lin8, 2),
                                                                                   client_id))  # fmt: skip

    async def _play_fixture(self, mulaw: bytes, client_id: Any) -> None:
        step = 8 * self.peer.chunk_ms
        try:
            for at in range(0, len(mulaw), step):
                await self._out(mulaw[at : at + step])
                await asyncio.sleep(self.peer.pace)
            self.fixtures.append(mulaw)
        finally:
            self.fixture_playing = False
        await self.send({"type": "session.output_audio.fixture.played", "client_event_id": client_id})

    async def _append(self, what: str, event: dict[str, Any]) -> None:
        client_id = event.get("event_id")
        content = event.get("content")
        if not isinstance(content, str) or not content.strip() or len(content) / 4 > 500:
            await self.error("invalid_content", "content must be text of at most 500 tokens", client_id)
            return
        if what != "instructions":
            if "delegation_id" not in event:
                await self.error("missing_required_parameter", "delegation_id is required (may be null)", client_id)
                return
            ident = event["delegation_id"]
            if ident is not None and ident not in self.delegations:
                await self.error("unknown_delegation", "no such delegation in this session", client_id)
                return
        self.appends.append({"kind": what, "content": content, "delegation_id": event.get("delegation_id"),
                             "event_id": client_id, "at": time.monotonic()})  # fmt: skip
        now = self.now_ms()
        await self.send({"type": f"session.{what}.appended", "client_event_id": client_id, "start_ms": now,
                         "end_ms": now})  # fmt: skip
        if what == "commentary" and self.peer.speak_commentary:
            said = content[len(SAY_EXACTLY) :] if content.startswith(SAY_EXACTLY) else content
            self.speak(said)


class GptLivePeer:
    def __init__(self, *, pace: float = 0.02, chunk_ms: int = 100, speak_commentary: bool = True, hz: float = 440.0):
        self.pace = pace
        self.chunk_ms = chunk_ms
        self.speak_commentary = speak_commentary
        self.hz = hz
        self.sessions: list[LiveSession] = []
        self.sip_sessions: dict[str, LiveSession] = {}  # accepted SIP sessions, by id (voice.testing.gpt_live_sip_peer)
        self.sidebands: list[str] = []  # session ids a sideband attached to, in order
        self._server: Server | None = None
        self._new = asyncio.Event()
        self.port = 0
        self.refusals = Refusals()  # ``peer.refusals.refuse = 1``: the next handshake gets HTTP 503

    @property
    def websocket_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> GptLivePeer:
        self._server = await serve(
            self._serve, "127.0.0.1", 0, compression=None, max_size=None, process_request=self.refusals.check
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for session in self.sessions:
            if session._speaking is not None:
                session._speaking.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def wait_for(self, predicate: Callable[[], Any], within: float = 10.0, what: str = "the condition") -> Any:
        deadline = time.monotonic() + within
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {what}")
            await asyncio.sleep(0.01)

    async def next_session(self, after: int = 0, within: float = 10.0) -> LiveSession:
        """The first session started after ``after`` sessions (its ``session.started`` sent)."""
        return await self.wait_for(lambda: len(self.sessions) > after and self.sessions[after].started_at is not None
                                   and self.sessions[after], within, "a GPT-Live session")  # fmt: skip

    async def _serve(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        path = request.path.split("?")[0]
        attach = path.startswith("/v1/live/sessions/") and path.endswith("/attach")
        if (path != "/v1/live/sessions" and not attach) or not headers.get("authorization", "").startswith("Bearer "):
            await ws.close(4001, "unauthorized or unknown path")
            return
        if attach:
            session_id = path[len("/v1/live/sessions/") : -len("/attach")]
            accepted = self.sip_sessions.get(session_id)
            if accepted is None or accepted.closed:
                await ws.close(4004, "no such accepted session")
                return
            accepted.ws = ws
            self.sidebands.append(session_id)
            session = accepted
        else:
            session = LiveSession(headers, request.path, self, ws=ws)
            self.sessions.append(session)
        try:
            async for raw in ws:
                try:
                    event = json.loads(raw)
                except ValueError:
                    await session.error("invalid_json", "not JSON")
                    continue
                if not isinstance(event, dict):
                    await session.error("invalid_event", "not an object")
                    continue
                session.events.append(event)
                if not await session.handle(event):
                    await ws.close()
                    break
        except ConnectionClosed:
            pass
        finally:
            if not session.sip or session.ws is ws:
                session.closed = not session.sip  # a SIP session outlives its sideband (the call goes on)
                if session._speaking is not None:
                    session._speaking.cancel()
