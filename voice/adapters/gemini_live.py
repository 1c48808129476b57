"""Gemini Live through the official google-genai SDK (``client.aio.live.connect``).

Audio: Twilio's mu-law 8 kHz is decoded and resampled to PCM16 16 kHz on the way in, and the
model's PCM16 24 kHz is resampled to 8 kHz and encoded as mu-law on the way out. ``audioop.ratecv``
keeps its filter state per direction (input for the socket's life, output per model turn), so
chunk edges do not click.

Gemini Live has no response objects, so each model turn (from its first audio, transcript or tool
call to ``turnComplete``, ``interrupted`` or a ``toolCall``) becomes one synthetic response whose
id is also its item id. The mapping to :mod:`voice.realtime`:

* ``toolCall``: a :class:`FunctionCall` per call, then ``ResponseDone(completed)``. Tool outputs
  are held until :meth:`create_response`, which sends them in one ``toolResponse``; the model then
  carries on by itself, as Gemini does.
* ``interrupted`` (Gemini's own barge-in): :class:`SpeechStarted`, then ``ResponseDone(cancelled)``.
  After a turn is generated (Gemini is faster than real time, so the caller may still be hearing
  it) Gemini reports no interruption; the first caller transcription then counts as speech start.
* Transcription chunks are joined into one :class:`UserTranscript` (delivered when the next model
  turn starts) and one :class:`AssistantTranscript` per turn (delivered before its ``ResponseDone``).
* :meth:`create_response` with instructions sends them as a user turn with ``turnComplete``;
  :meth:`add_note` sends a turn without it. :meth:`cancel_response` and :meth:`truncate` do
  nothing: Gemini stops generating on barge-in by itself and cannot truncate (the session keeps
  what the caller heard from Twilio's marks).
* Instructions and tools are fixed at setup. :meth:`configure` on an open session (the caller
  proved who they are) opens a new session with the new configuration and resumes the conversation
  with the latest session resumption handle; without one (or if Gemini refuses it), the transcript
  so far goes in as a note.
  Tool outputs still held then go in as a note, since the new session never issued those calls.
  While a turn is being generated, the new socket waits for its end.
* ``goAway`` (the server ends every connection after a while): the adapter resumes on a new socket
  with the handle as soon as no model turn is running. A socket that drops ends :meth:`events`
  with :class:`RealtimeDisconnected`; the call session reconnects.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gt
from websockets.exceptions import WebSocketException

from core.models.voice_models import default_voice_model
from core.untrusted import neutralise_labels
from voice.codec import audioop
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    Other,
    RealtimeDisconnected,
    RealtimeError,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    UserTranscript,
)

log = logging.getLogger(__name__)

INPUT_RATE = 16000
OUTPUT_RATE = 24000
TWILIO_RATE = 8000
INPUT_MIME = f"audio/pcm;rate={INPUT_RATE}"
INSTRUCTION = "[Pepper runtime instruction for your next reply. The caller did not say this.]"
NOTE = "[Pepper runtime note. The caller did not say this.]"
HISTORY_CHARS = 4000
HANDLE_WAIT_SECONDS = 3.0  # after a turn, how long a new configuration waits for the handle that includes it
_RATE = re.compile(r"rate=(\d+)")
_FAILURES = (genai_errors.APIError, WebSocketException, OSError, ValueError)


class Resampler:
    """One direction's mu-law <-> PCM16 conversion, with ``ratecv`` state kept between chunks."""

    def __init__(self) -> None:
        self.state: Any = None
        self.rate = 0

    def to_model(self, mulaw: bytes) -> bytes:
        pcm = audioop.ulaw2lin(mulaw, 2)
        out, self.state = audioop.ratecv(pcm, 2, 1, TWILIO_RATE, INPUT_RATE, self.state)
        return out

    def to_twilio(self, pcm: bytes, rate: int) -> bytes:
        if rate != self.rate:
            self.state, self.rate = None, rate
        if len(pcm) % 2:
            pcm = pcm[:-1]
        out, self.state = audioop.ratecv(pcm, 2, 1, rate, TWILIO_RATE, self.state)
        return audioop.lin2ulaw(out, 2)


def live_config(config: SessionConfig, *, voice: str, handle: str | None) -> gt.LiveConnectConfig:
    """What Gemini is told at setup: audio out, both transcriptions, the tools, resumption on, and a
    sliding context window so a long call is not cut at the audio session limit."""
    tools = [
        gt.Tool(
            function_declarations=[
                gt.FunctionDeclaration(name=t.name, description=t.description, parameters_json_schema=t.parameters)
                for t in config.tools
            ]
        )
    ]
    return gt.LiveConnectConfig(
        response_modalities=[gt.Modality.AUDIO],
        system_instruction=config.instructions,
        tools=tools if config.tools else None,
        speech_config=gt.SpeechConfig(
            voice_config=gt.VoiceConfig(prebuilt_voice_config=gt.PrebuiltVoiceConfig(voice_name=voice))
        ),
        input_audio_transcription=gt.AudioTranscriptionConfig(),
        output_audio_transcription=gt.AudioTranscriptionConfig(),
        session_resumption=gt.SessionResumptionConfig(handle=handle),
        context_window_compression=gt.ContextWindowCompressionConfig(sliding_window=gt.SlidingWindow()),
    )


def _text_turn(text: str) -> gt.Content:
    return gt.Content(role="user", parts=[gt.Part(text=text)])


class GeminiLiveConnection:
    """One call's Gemini Live conversation, which may span several sockets (see the module doc)."""

    def __init__(self, model: GeminiLive):
        self._model = model
        self._config: SessionConfig | None = None
        self._manager: Any = None
        self._session: Any = None
        self._ready = asyncio.Event()
        self._swap_lock = asyncio.Lock()
        self._swaps = 0
        self._handle: str | None = None
        self._going_away = False
        self._swap_due = False  # a new configuration waits for the running turn to end
        self._handle_fresh = False  # the handle was issued after the last turn (it includes it)
        self._handle_wait: asyncio.Task[None] | None = None
        self._deferred: list[tuple[str, tuple[Any, ...]]] = []
        self._closed = False
        self._in = Resampler()
        self._out = Resampler()
        self._turns = 0
        self._users = 0
        self._response: str | None = None
        self._out_text: list[str] = []
        self._user_text: list[str] = []
        self._history: list[str] = []
        self._calls: dict[str, str] = {}  # call id -> name, issued on ``_calls_session``
        self._calls_session: Any = None
        self._outputs: list[tuple[str, str, str]] = []
        self._cancelled: set[str] = set()
        self._skip_response = False

    # --- Sockets -------------------------------------------------------------------------------

    async def _open(self, config: SessionConfig, handle: str | None) -> None:
        manager = self._model.client.aio.live.connect(
            model=self._model.model, config=live_config(config, voice=self._model.voice, handle=handle)
        )
        try:
            session = await manager.__aenter__()
        except _FAILURES as exc:
            raise RealtimeDisconnected("cannot open the Gemini Live session") from exc
        if session.setup_complete is None:
            await self._close_socket(manager)
            raise RealtimeDisconnected("Gemini Live did not complete the setup")
        old = self._manager
        self._manager, self._session = manager, session
        self._in = Resampler()
        if old is not None:
            await self._close_socket(old)

    @staticmethod
    async def _close_socket(manager: Any) -> None:
        try:
            await manager.__aexit__(None, None, None)
        except (*_FAILURES, RuntimeError):
            log.debug("Gemini Live socket close failed", exc_info=True)

    async def _swap(self, config: SessionConfig) -> None:
        """A new socket with ``config``, resuming this conversation."""
        async with self._swap_lock:
            handle = self._handle
            self._swaps += 1
            try:
                await self._open(config, handle)
            except RealtimeDisconnected:
                if handle is None:
                    raise
                log.warning("Gemini Live refused to resume the session; starting afresh with the transcript")
                handle = self._handle = None
                await self._open(config, None)
            self._going_away = False
            if handle is None and self._history:
                said = neutralise_labels("\n".join(self._history)[-HISTORY_CHARS:])
                await self._send_turn(f"{NOTE}\nThe call so far:\n{said}", complete=False)
            log.info("Gemini Live session replaced: resumed=%s", handle is not None)

    async def close(self) -> None:
        self._closed = True
        if self._handle_wait is not None:
            self._handle_wait.cancel()
            await asyncio.gather(self._handle_wait, return_exceptions=True)
        if self._manager is not None:
            await self._close_socket(self._manager)

    # --- Client -> model -----------------------------------------------------------------------

    async def configure(self, config: SessionConfig) -> None:
        """The first call opens the socket. Later calls open a new one resuming the conversation;
        while a turn is being generated that waits for its end (replacing the socket would cut
        it), and notes and response requests made meanwhile follow the new socket. Just after a
        turn, before Gemini's handle that includes it, it waits for that handle (resuming from the
        one before would lose the turn), at most :data:`HANDLE_WAIT_SECONDS`."""
        first = self._config is None
        self._config = config
        if first:
            await self._open(config, None)
            self._ready.set()
        elif self._response is not None:
            self._swap_due = True
        elif self._handle is not None and not self._handle_fresh:
            self._swap_due = True
            if self._handle_wait is None or self._handle_wait.done():
                self._handle_wait = asyncio.get_running_loop().create_task(self._swap_without_new_handle())
        else:
            await self._swap(config)

    async def _swap_without_new_handle(self) -> None:
        await asyncio.sleep(HANDLE_WAIT_SECONDS)
        if self._swap_due and self._response is None and not self._closed:
            log.warning("Gemini Live sent no resumption handle after the turn; resuming from the one before")
            try:
                await self._swap_now()
            except RealtimeError:
                log.warning("Gemini Live session could not be replaced", exc_info=True)

    async def _swap_when_idle(self) -> None:
        if not (self._going_away or self._swap_due) or self._response is not None or self._config is None:
            return
        if self._handle is None or self._handle_fresh:
            await self._swap_now()
        # else: Gemini sends a handle that includes the turn just after it ends; wait for it

    async def _swap_now(self) -> None:
        assert self._config is not None
        self._swap_due = False
        await self._swap(self._config)
        deferred, self._deferred = self._deferred, []
        for method, args in deferred:
            await getattr(self, method)(*args)

    def _defer(self, method: str, *args: Any) -> bool:
        if self._swap_due:
            self._deferred.append((method, args))
        return self._swap_due

    def _live(self) -> Any:
        if self._session is None:
            raise RealtimeError("configure() opens the Gemini Live session; nothing can be sent before it")
        return self._session

    async def _call(self, send: Any, **kwargs: Any) -> None:
        session = self._live()
        try:
            await getattr(session, send)(**kwargs)
        except _FAILURES as exc:
            if session is not self._session:
                return  # the socket was replaced while this was on its way; the new one carries on
            raise RealtimeDisconnected("the Gemini Live socket is closed") from exc

    async def _send_turn(self, text: str, *, complete: bool) -> None:
        await self._call("send_client_content", turns=[_text_turn(text)], turn_complete=complete)

    def append_audio_nowait(self, payload: str) -> bool:
        return False  # resampled and sent through the SDK's async session: always awaited

    def deliver_audio_to(self, sink: Any) -> None:
        pass  # audio is resampled in events(): it comes from there

    async def append_audio(self, payload: str) -> None:
        pcm = self._in.to_model(base64.b64decode(payload))
        await self._call("send_realtime_input", audio=gt.Blob(data=pcm, mime_type=INPUT_MIME))

    async def send_tool_output(self, call_id: str, output: str) -> None:
        if call_id in self._cancelled:
            self._cancelled.discard(call_id)
            self._skip_response = True
            return
        name = self._calls.pop(call_id, None)
        if name is None:
            log.warning("a tool output for a call Gemini did not make was dropped")
            return
        self._outputs.append((call_id, name, output))

    async def add_note(self, text: str) -> None:
        if not self._defer("add_note", text):
            await self._send_turn(text, complete=False)

    async def create_response(self, instructions: str | None = None) -> None:
        if self._defer("create_response", instructions):
            return
        outputs, self._outputs = self._outputs, []
        skip, self._skip_response = self._skip_response, False
        if outputs and self._calls_session is self._session:
            responses = [gt.FunctionResponse(id=i, name=n, response={"result": o}) for i, n, o in outputs]
            await self._call("send_tool_response", function_responses=responses)
            if instructions is None:
                return  # Gemini answers a tool response by itself
        elif outputs:
            results = "\n".join(f"Result of {n}: {o}" for _, n, o in outputs)
            await self._send_turn(f"{NOTE}\n{results}", complete=instructions is None)
            if instructions is None:
                return
        elif skip and instructions is None:
            return  # the calls were cancelled by a barge-in; the caller's turn comes next
        if instructions is None:
            await self._call("send_client_content", turn_complete=True)
        else:
            await self._send_turn(f"{INSTRUCTION}\n{instructions}", complete=True)

    async def cancel_response(self) -> None:
        """Nothing to send: Gemini stops a turn by itself when the caller speaks over it."""

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Gemini Live cannot truncate a turn; the session records what the caller heard."""

    # --- Model -> client -----------------------------------------------------------------------

    def _begin(self, out: list[RealtimeEvent]) -> str:
        if self._response is None:
            self._flush_user(out)
            self._turns += 1
            self._response = f"gemini-{self._turns}"
            self._handle_fresh = False
            self._out = Resampler()
            self._out_text = []
            out.append(ResponseCreated(self._response))
        return self._response

    def _end(self, out: list[RealtimeEvent], status: str, calls: int = 0) -> None:
        rid = self._response
        if rid is None:
            return
        self._response = None
        text = "".join(self._out_text).strip()
        self._out_text = []
        if text:
            self._history.append(f"pepper: {text}")
            out.append(AssistantTranscript(rid, rid, text))
        out.append(ResponseDone(rid, status, calls))

    def _next_user_item(self) -> str:
        """The id the caller's words being heard now will carry in their :class:`UserTranscript`."""
        return f"gemini-u{self._users + 1}"

    def _flush_user(self, out: list[RealtimeEvent]) -> None:
        text = "".join(self._user_text).strip()
        self._user_text = []
        if text:
            self._users += 1
            self._history.append(f"caller: {text}")
            out.append(UserTranscript(f"gemini-u{self._users}", text))

    def map_message(self, message: gt.LiveServerMessage) -> list[RealtimeEvent]:
        out: list[RealtimeEvent] = []
        update = message.session_resumption_update
        if update is not None and update.resumable and update.new_handle:
            self._handle = update.new_handle
            self._handle_fresh = self._response is None
        if message.go_away is not None:
            self._going_away = True
            out.append(Other("go_away", {"time_left": message.go_away.time_left}))
        content = message.server_content
        if content is not None:
            heard = content.input_transcription
            if heard is not None and heard.text:
                if not self._user_text and self._response is None:
                    out.append(SpeechStarted(self._next_user_item(), None))
                self._user_text.append(heard.text)
            if content.model_turn is not None:
                for part in content.model_turn.parts or ():
                    blob = part.inline_data
                    if blob is not None and blob.data and (blob.mime_type or "").startswith("audio/pcm"):
                        rid = self._begin(out)
                        match = _RATE.search(blob.mime_type or "")
                        mulaw = self._out.to_twilio(blob.data, int(match.group(1)) if match else OUTPUT_RATE)
                        out.append(AudioDelta(rid, rid, base64.b64encode(mulaw).decode()))
            said = content.output_transcription
            if said is not None and said.text:
                self._begin(out)
                self._out_text.append(said.text)
            if content.interrupted:
                # Words already gathered began before this: their start was reported (or not) then.
                out.append(SpeechStarted(None if self._user_text else self._next_user_item(), None))
                self._end(out, "cancelled")
            if content.turn_complete:
                self._end(out, "completed")
        call = message.tool_call
        if call is not None and call.function_calls:
            rid = self._begin(out)
            self._calls_session = self._session
            for n, fc in enumerate(call.function_calls):
                call_id = fc.id or f"{rid}-call-{n}"
                self._calls[call_id] = fc.name or ""
                out.append(FunctionCall(rid, call_id, fc.name or "", json.dumps(fc.args or {})))
            self._end(out, "completed", len(call.function_calls))
        cancelled = message.tool_call_cancellation
        if cancelled is not None and cancelled.ids:
            for call_id in cancelled.ids:
                if self._calls.pop(call_id, None) is not None:
                    self._cancelled.add(call_id)
            out.append(Other("tool_call_cancellation", {"ids": list(cancelled.ids)}))
        return out

    def _abandoned(self) -> list[RealtimeEvent]:
        """The turn a replaced socket was generating ends, cancelled, so the session's state stays true."""
        out: list[RealtimeEvent] = []
        if self._response is not None:
            self._end(out, "cancelled")
        return out

    async def events(self) -> AsyncIterator[RealtimeEvent]:
        await self._ready.wait()
        while True:
            session, swaps = self._session, self._swaps
            try:
                while True:
                    async for message in session.receive():
                        if self._swaps != swaps:
                            break  # late messages of a replaced socket
                        for event in self.map_message(message):
                            yield event
                        await self._swap_when_idle()
                    if self._swaps != swaps:
                        break
            except RealtimeDisconnected:
                raise
            except _FAILURES as exc:
                if self._swaps == swaps or self._closed:
                    out: list[RealtimeEvent] = []
                    self._end(out, "cancelled")
                    self._flush_user(out)
                    for event in out:
                        yield event
                    code = getattr(exc, "code", None)
                    raise RealtimeDisconnected(
                        "the Gemini Live socket closed", close_code=code if isinstance(code, int) else None
                    ) from exc
            for event in self._abandoned():
                yield event


class GeminiLive:
    """Connects one conversation per call. ``base_url`` follows the SDK (``GOOGLE_GEMINI_BASE_URL``);
    ``ssl_context`` trusts a private CA (the SDK otherwise honours ``SSL_CERT_FILE``)."""

    name = "gemini-live"

    def __init__(
        self,
        *,
        api_key: str,
        model: str = default_voice_model("gemini-live"),
        voice: str = "Kore",
        base_url: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.model = model
        self.voice = voice
        options = gt.HttpOptions(base_url=base_url, async_client_args={"ssl": ssl_context} if ssl_context else None)
        self.client = genai.Client(api_key=api_key, http_options=options)

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[GeminiLiveConnection]:
        conn = GeminiLiveConnection(self)
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def aclose(self) -> None:
        await self.client.aio.aclose()
