"""A loopback Gemini Live server (``BidiGenerateContent`` over TLS) for tests and benchmarks.

    async with GeminiLivePeer() as peer:
        peer.script(speak("Hi, this call is transcribed."), call_tool("list_todos"), speak("Two todos."))
        peer.hear("what's on my list")
        # google-genai: Client(api_key=peer.api_key, http_options=HttpOptions(base_url=peer.base_url,
        #               async_client_args={"ssl": peer.client_ssl()}))   (or SSL_CERT_FILE=peer.ca_file)

The SDK always speaks ``wss`` to Gemini Live when it has an API key, so the peer serves TLS with a
self-signed certificate for 127.0.0.1 made at start. Behaviour (wire-protocols.md section 6):

* Only ``/ws/google.ai.generativelanguage.{v1,v1beta,v1alpha}.GenerativeService.BidiGenerateContent``
  upgrades (anything else gets HTTP 404). The first message must be ``setup`` with a
  ``models/...`` model and audio output, else close 1007; a wrong or missing API key (header
  ``x-goog-api-key`` or ``?key=``) closes 1007 "API key not valid", as production does. A
  ``sessionResumption.handle`` the peer never issued closes 1007.
* ``setupComplete`` goes out as a binary frame holding JSON. With ``sessionResumption`` set up, a
  ``sessionResumptionUpdate`` (new handle, resumable) follows it and each finished turn; a session
  resumed with a handle starts from that handle's conversation.
* Client messages are accepted in both spellings (``realtime_input``/``realtimeInput``, ...), as the
  proto-JSON server does. ``realtimeInput.audio`` must be ``audio/pcm;rate=N``; the peer runs an
  energy VAD over it: speech start interrupts a turn being generated (``interrupted``) and sends
  the first word of the next :meth:`hear` text as ``inputTranscription``; 500 ms of silence sends
  the rest and starts the next scripted turn.
* A scripted turn streams ``modelTurn`` ``inlineData`` PCM16 24 kHz in ``chunk_ms`` chunks paced by
  ``pace``, with ``outputTranscription`` chunks, then ``generationComplete`` and ``turnComplete``.
  A turn with calls ends in ``toolCall``; the peer then waits for a ``toolResponse`` answering
  every id (an unknown id closes 1007) and plays the next scripted turn.
* ``clientContent`` turns are recorded; ``turnComplete: true`` starts the next scripted turn (after
  the one running, if any).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import re
import ssl
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from voice.codec import audioop
from voice.testing.realtime_peer import ScriptedResponse
from voice.testing.socket_faults import Refusals, cut

_PATH = re.compile(r"^/ws/google\.ai\.generativelanguage\.(v1|v1beta|v1alpha)\.GenerativeService\.BidiGenerateContent$")
_MODEL = re.compile(r"^models/[\w.-]+$")
_RATE = re.compile(r"^audio/pcm;\s*rate=(\d+)$")
OUT_RATE = 24000
BAD_KEY = "API key not valid. Please pass a valid API key."


def _pick(data: dict[str, Any], snake: str, camel: str) -> Any:
    return data[snake] if snake in data else data.get(camel)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate (its own CA) and key for 127.0.0.1, as PEM files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "peer-cert.pem", directory / "peer-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


def pcm24k(mulaw: bytes) -> bytes:
    """Scripted 8 kHz mu-law as the PCM16 24 kHz Gemini sends."""
    pcm = audioop.ulaw2lin(mulaw, 2)
    return audioop.ratecv(pcm, 2, 1, 8000, OUT_RATE, None)[0]


@dataclass
class LiveSession:
    """One Gemini Live socket as the peer saw it."""

    headers: dict[str, str]
    path: str
    setup: dict[str, Any] = field(default_factory=dict)
    resumed_from: str | None = None
    context: list[tuple[str, str]] = field(default_factory=list)  # (role, text), what the model knows
    audio_in: bytearray = field(default_factory=bytearray)  # PCM16 at ``audio_rate``
    audio_rate: int | None = None
    first_audio_at: float | None = None
    messages: list[str] = field(default_factory=list)  # kinds of client messages, in order
    tool_responses: list[dict[str, Any]] = field(default_factory=list)
    interruptions: int = 0
    turns_started: int = 0
    close_code: int | None = None
    closed: bool = False

    def tool_names(self) -> list[str]:
        return sorted(
            d["name"] for tool in self.setup.get("tools", []) for d in _pick(tool, "function_declarations",
                                                                            "functionDeclarations") or []
        )  # fmt: skip

    def instructions(self) -> str:
        system = _pick(self.setup, "system_instruction", "systemInstruction") or {}
        return " ".join(p.get("text", "") for p in system.get("parts", []))

    def notes(self) -> list[str]:
        return [text for role, text in self.context if role == "user-text"]


class _Conn:
    def __init__(self, peer: GeminiLivePeer, ws: ServerConnection, rec: LiveSession):
        self.peer = peer
        self.ws = ws
        self.rec = rec
        self.resumable = False
        self.task: asyncio.Task[None] | None = None
        self.cancel_flag = False
        self.queued = 0
        self.awaiting: dict[str, str] = {}
        self.speaking = False
        self.silence_ms = 0
        self.utterance: list[str] = []

    async def emit(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps(message).encode())  # binary frames, like production

    async def content(self, **fields: Any) -> None:
        await self.emit({"serverContent": fields})

    async def resumption_update(self) -> None:
        if self.resumable:
            handle = self.peer._new_handle(self.rec.context)
            await self.emit({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    async def handle(self, message: dict[str, Any]) -> None:
        realtime = _pick(message, "realtime_input", "realtimeInput")
        client = _pick(message, "client_content", "clientContent")
        tool = _pick(message, "tool_response", "toolResponse")
        if realtime is not None:
            self.rec.messages.append("realtimeInput")
            audio = realtime.get("audio")
            if audio is not None:
                await self.audio(audio)
        elif client is not None:
            self.rec.messages.append("clientContent")
            for turn in client.get("turns") or []:
                for part in turn.get("parts") or []:
                    if part.get("text"):
                        self.rec.context.append(("user-text", part["text"]))
            if _pick(client, "turn_complete", "turnComplete"):
                self.start_turn()
        elif tool is not None:
            self.rec.messages.append("toolResponse")
            for response in _pick(tool, "function_responses", "functionResponses") or []:
                call_id = response.get("id")
                if call_id not in self.awaiting:
                    await self.ws.close(1007, f"function response id {call_id!r} not found")
                    return
                del self.awaiting[call_id]
                self.rec.tool_responses.append(response)
                self.rec.context.append(("tool", json.dumps(response.get("response"))))
            if not self.awaiting:
                self.start_turn()
        else:
            await self.ws.close(1007, "Invalid JSON payload received. Unknown message.")

    async def audio(self, blob: dict[str, Any]) -> None:
        rate = _RATE.match(_pick(blob, "mime_type", "mimeType") or "")
        if rate is None:
            await self.ws.close(1007, "Unsupported audio mime type.")
            return
        try:  # proto JSON bytes: standard or URL-safe base64 (the SDK sends URL-safe)
            pcm = base64.b64decode(str(blob.get("data", "")).replace("-", "+").replace("_", "/"), validate=True)
        except ValueError:
            await self.ws.close(1007, "Invalid value at 'realtime_input.audio.data': invalid base64.")
            return
        if len(pcm) % 2:
            await self.ws.close(1007, "PCM16 audio must be a whole number of samples.")
            return
        self.rec.audio_rate = int(rate.group(1))
        if self.rec.first_audio_at is None:
            self.rec.first_audio_at = time.monotonic()
        self.rec.audio_in += pcm
        ms = len(pcm) * 1000 // (2 * self.rec.audio_rate)
        level = audioop.rms(pcm, 2) if pcm else 0
        if level > self.peer.vad_threshold:
            self.silence_ms = 0
            if not self.speaking:
                self.speaking = True
                self.utterance = (self.peer._heard.popleft() if self.peer._heard else "").split()
                if self.task is not None and not self.task.done():
                    self.cancel_flag = True
                if self.utterance:
                    await self.content(inputTranscription={"text": self.utterance.pop(0)})
        elif self.speaking:
            self.silence_ms += ms
            if self.silence_ms >= 500:
                self.speaking = False
                if self.utterance:
                    await self.content(inputTranscription={"text": " " + " ".join(self.utterance)})
                self.utterance = []
                if not self.awaiting:
                    self.start_turn()

    def start_turn(self) -> None:
        if self.task is not None and not self.task.done():
            self.queued += 1
            return
        scripted = self.peer._responses.popleft() if self.peer._responses else self.peer.default_response()
        self.cancel_flag = False
        self.rec.turns_started += 1
        self.task = asyncio.get_running_loop().create_task(self.play(scripted), name="gemini-peer-turn")

    async def play(self, scripted: ScriptedResponse) -> None:
        audio = pcm24k(scripted.audio_bytes())
        words = scripted.text.split()
        chunk = 2 * OUT_RATE * self.peer.chunk_ms // 1000
        pieces = max(1, -(-len(audio) // chunk))
        said: list[str] = []
        for n, offset in enumerate(range(0, len(audio), chunk)):
            if self.cancel_flag:
                self.rec.interruptions += 1
                self.rec.context.append(("model", " ".join(said)))
                await self.content(interrupted=True)
                return
            part = {"inlineData": {"mimeType": f"audio/pcm;rate={OUT_RATE}",
                                   "data": base64.b64encode(audio[offset : offset + chunk]).decode()}}  # fmt: skip
            await self.content(modelTurn={"role": "model", "parts": [part]})
            share = words[len(words) * n // pieces : len(words) * (n + 1) // pieces]
            if share:
                text = " ".join(share)
                await self.content(outputTranscription={"text": (" " if said else "") + text})
                said.append(text)
            if self.peer.pace:
                await asyncio.sleep(self.peer.pace)
        if not audio and words:
            await self.content(outputTranscription={"text": scripted.text})
            said = [scripted.text]
        self.rec.context.append(("model", " ".join(said)))
        if scripted.calls:
            calls = []
            for name, arguments in scripted.calls:
                self.peer._ids += 1
                call_id = f"function-call-{self.peer._ids}"
                self.awaiting[call_id] = name
                calls.append({"id": call_id, "name": name, "args": arguments})
            await self.emit({"toolCall": {"functionCalls": calls}})
            return
        await self.content(generationComplete=True)
        await self.content(turnComplete=True)
        await self.emit({"usageMetadata": {"promptTokenCount": 10, "responseTokenCount": 5, "totalTokenCount": 15}})
        await self.resumption_update()
        if self.queued:
            self.queued -= 1
            asyncio.get_running_loop().call_soon(self.start_turn)


class GeminiLivePeer:
    def __init__(
        self,
        *,
        api_key: str = "gemini-test-key",
        chunk_ms: int = 100,
        pace: float = 0.01,
        vad_threshold: int = 300,
        default_ms: int = 200,
    ) -> None:
        self.api_key = api_key
        self.chunk_ms = chunk_ms
        self.pace = pace
        self.vad_threshold = vad_threshold
        self.default_ms = default_ms
        self.sessions: list[LiveSession] = []
        self._responses: deque[ScriptedResponse] = deque()
        self._heard: deque[str] = deque()
        self._conns: list[_Conn] = []
        self._handles: dict[str, list[tuple[str, str]]] = {}
        self._server: Server | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._ids = 0
        self.port = 0
        self.ca_file = Path()
        self.refusals = Refusals()  # ``peer.refusals.refuse = 1``: the next handshake gets HTTP 503

    def script(self, *responses: ScriptedResponse) -> None:
        self._responses.extend(responses)

    def hear(self, *transcripts: str) -> None:
        """What the transcription of the caller's next utterances says."""
        self._heard.extend(transcripts)

    def default_response(self) -> ScriptedResponse:
        return ScriptedResponse(text="(unscripted)", ms=self.default_ms)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _new_handle(self, context: list[tuple[str, str]]) -> str:
        self._ids += 1
        handle = f"resume-{self._ids}"
        self._handles[handle] = list(context)
        return handle

    async def __aenter__(self) -> GeminiLivePeer:
        self._tmp = tempfile.TemporaryDirectory(prefix="gemini-peer-")
        cert, key = self_signed(Path(self._tmp.name))
        self.ca_file = cert
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = await serve(
            self._handler, "127.0.0.1", 0, ssl=context, process_request=self._process_request, max_size=None,
            compression=None,
        )  # fmt: skip
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def drop(self, index: int = -1) -> None:
        """Drop one socket abruptly (close code 1011), as a failing upstream would."""
        await self._conns[index].ws.close(1011, "Internal error encountered.")

    async def go_away(self, index: int = -1, time_left: str = "10s") -> None:
        """Warn one socket that the server will close it soon."""
        await self._conns[index].emit({"goAway": {"timeLeft": time_left}})

    def forget_handles(self) -> None:
        """Resumption handles issued so far stop working (as they do after their lifetime)."""
        self._handles.clear()

    async def wait_for(self, predicate: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("the Gemini Live peer never saw what the test waited for")
            await asyncio.sleep(0.01)

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        return await self.refusals.check(connection, request) or self._check_path(connection, request)

    def cut(self, index: int = -1) -> float:
        """End one socket without a close frame (the network gone); returns when."""
        return cut(self._conns[index].ws)

    @staticmethod
    def _check_path(connection: ServerConnection, request: Request) -> Response | None:
        if _PATH.match(request.path.split("?", 1)[0]) is None:
            return connection.respond(HTTPStatus.NOT_FOUND, "Not Found\n")
        return None

    def _key_ok(self, request: Request) -> bool:
        key = request.headers.get("x-goog-api-key")
        if key is None and "?" in request.path:
            query = dict(p.partition("=")[::2] for p in request.path.split("?", 1)[1].split("&"))
            key = query.get("key")
        return key == self.api_key

    async def _handler(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        rec = LiveSession({k.lower(): v for k, v in request.headers.raw_items()}, request.path)
        self.sessions.append(rec)
        conn = _Conn(self, ws, rec)
        self._conns.append(conn)
        try:
            await self._serve(conn, request)
        except ConnectionClosed:
            pass
        finally:
            rec.closed = True
            rec.close_code = ws.close_code
            if conn.task is not None:
                conn.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conn.task

    async def _serve(self, conn: _Conn, request: Request) -> None:
        ws, rec = conn.ws, conn.rec
        try:
            async with asyncio.timeout(10):
                first = json.loads(await ws.recv())
        except (TimeoutError, ValueError):
            await ws.close(1007, "Invalid JSON payload received. The first message must be setup.")
            return
        setup = first.get("setup") if isinstance(first, dict) and len(first) == 1 else None
        if not isinstance(setup, dict) or not _MODEL.match(str(setup.get("model", ""))):
            await ws.close(1007, "Invalid JSON payload received. The first message must be setup with a model.")
            return
        if not self._key_ok(request):
            await ws.close(1007, BAD_KEY)
            return
        generation = _pick(setup, "generation_config", "generationConfig") or {}
        if "AUDIO" not in (_pick(generation, "response_modalities", "responseModalities") or []):
            await ws.close(1007, "The peer speaks audio only: responseModalities must include AUDIO.")
            return
        resumption = _pick(setup, "session_resumption", "sessionResumption")
        handle = resumption.get("handle") if isinstance(resumption, dict) else None
        if handle is not None:
            if handle not in self._handles:
                await ws.close(1007, "Invalid session resumption handle.")
                return
            rec.resumed_from = handle
            rec.context = list(self._handles[handle])
        rec.setup = setup
        conn.resumable = resumption is not None
        await conn.emit({"setupComplete": {}})
        await conn.resumption_update()
        async for raw in ws:
            try:
                message = json.loads(raw)
            except ValueError:
                await ws.close(1007, "Invalid JSON payload received.")
                return
            if not isinstance(message, dict):
                await ws.close(1007, "Invalid JSON payload received.")
                return
            await conn.handle(message)
