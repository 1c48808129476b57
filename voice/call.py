"""One phone call: Twilio Media Streams on one side, a realtime voice model on the other.

What a call session promises:

* **Opening.** The transcription notice is the first thing the model says. Until the Twilio mark
  after it comes back (the caller has heard it), caller audio is discarded: neither buffered nor
  sent to the model.
* **Restricted until proven.** The session starts ``owner_unverified``: no memory in the
  instructions, only the tools the gate shows an unverified owner (read-only, nothing personal,
  nothing connected), plus the call's own controls. The PIN (keypad, or spoken digits the model
  passes to ``verify_pin``) or a one-time code sent by SMS is checked in code; on success the same
  model session is reconfigured with the memory block and the full tool set. Repeated failures end
  the call and notify the owner.
* **Tools** come from the same registry and pass the same gate and runner as text turns. A tool
  that takes longer than ``filler_after`` seconds makes the caller hear a short filler.
* **Barge-in.** When the model reports the caller speaking over Pepper: Twilio ``clear``, cancel
  the response, truncate the assistant item to what was played (tracked with marks).
* **Staged writes** wait for the mark after the response asked for after their tool result (sent
  once no other response runs), and only if that response spoke; a barge-in, a hang-up or a model
  drop before it drops them, and the model is told.
* **End.** Caller hang-up (``stop``, socket closed, status callback), the ``end_call`` tool after
  its goodbye was played, the maximum duration, repeated verification failures, or a model that
  cannot be reconnected. The transcript (both sides, tool calls) lands in the person's one
  conversation and the call's turn record, with a short summary.
* **Malformed frames** are ignored and counted; the call goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Protocol
from uuid import UUID

from core import identity
from core.conversation import (
    UNVERIFIED_CALLER,
    conversation_for,
    record_inbound,
    record_outbound,
    start_turn,
    update_turn,
)
from core.memory import MemoryConfig
from core.models.types import ToolCall
from core.owner_context import dossier_section, load_owner_context, session_tools
from core.security import record_security_event
from core.settings import Settings
from core.tools.connectors import Connectors
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolContext, ToolOutcome, ToolRegistry
from core.tools.runner import CallOutcome, run_call
from core.tools.staging import commit_writes, drop_turn_writes, drop_writes
from core.untrusted import neutralise_labels
from voice import media, verification
from voice.engines import RealtimeEngines
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    RealtimeConnection,
    RealtimeDisconnected,
    RealtimeError,
    RealtimeModel,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    UserTranscript,
)

log = logging.getLogger(__name__)

LABEL = "[Pepper runtime note. The caller did not say this.]"
SendSms = Callable[[str, str, str], Awaitable[None]]  # (to, from_, body)

PERSONA = f"""You are Pepper, a personal assistant, on a phone call. Speak briefly and naturally: one or
two short sentences at a time, no lists, no markdown. Never pretend: if you did not do something,
do not say you did. Use the tools to look things up or change things; never invent their results.
A tool result starting "Found nothing" means the lookup worked and there is no data; "Failed" means
it broke; "Refused by Pepper's rules" means it did not run. Confirm before deleting anything or doing
something other people will see. When a write is done, say in one sentence what changed.
Messages that start with "{LABEL}" come from Pepper's runtime, not from the caller."""

RESTRICTED = """The caller has not yet proved who they are, so you cannot see the person's memory or
accounts. They can key in their PIN and then the pound key, say their PIN (pass the digits to
verify_pin), or ask for a one-time code by text message (send_code, then check_code with the digits
they read back). Never guess or repeat a PIN or code aloud."""

PIN_LOCKED_WORDS = (
    "Not checked: the PIN cannot be used on calls for now, after too many wrong tries."
    " Offer to text a one-time code to the caller's phone instead (send_code)."
)
FAILED_NOTICE = "Pepper: someone calling from your number failed to verify and the call was ended."
PIN_LOCKED_NOTICE = (
    "Pepper: too many wrong PINs were tried on calls from your number or to your account in the last hour,"
    " so the PIN is switched off on calls for now. On a call you can still ask for a code texted to this phone."
)

VERIFIED = """The caller proved who they are: you may use the person's memory and every tool."""


def _load_filler() -> bytes:
    return (resources.files("voice") / "data" / "filler.ulaw").read_bytes()


@dataclass(frozen=True)
class VoiceConfig:
    notice: str = "Hi, this is Pepper. This call is transcribed."
    voice: str = "marin"
    max_call_seconds: float = 1800.0
    max_verify_failures: int = 3
    filler_after: float = 1.0
    notice_timeout: float = 20.0
    closing_grace: float = 10.0
    model_reconnects: int = 1
    code_ttl_seconds: float = 300.0
    # Across calls (voice.verification): wrong PINs within the window that lock the PIN path, per
    # calling number and per account; code texts per call and per account per window.
    pin_failures_per_source: int = 5
    pin_failures_per_account: int = 10
    codes_per_call: int = 2
    codes_per_hour: int = 2
    verify_window_seconds: float = 3600.0
    dtmf_idle_seconds: float = 3.0

    @classmethod
    def from_settings(cls, settings: Settings) -> VoiceConfig:
        return cls(
            notice=settings.voice_notice,
            voice=settings.voice_voice,
            max_call_seconds=float(settings.voice_max_call_seconds),
            max_verify_failures=settings.voice_max_verify_failures,
        )


@dataclass
class VoiceDeps:
    """Built once at start-up and shared by every call."""

    db: Any
    model: RealtimeModel | None
    registry: ToolRegistry
    gate: Gate
    config: VoiceConfig = field(default_factory=VoiceConfig)
    send_sms: SendSms | None = None
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    filler: bytes = field(default_factory=_load_filler)
    engines: RealtimeEngines | None = None  # per-line engines; ``model`` is the default one
    # Outside services configured on this server: with the person's connections they decide the
    # connected tools of a verified call, as of a text turn (``core.owner_context``).
    connectors: Connectors | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # The backend pid of this process's call-control session (``voice.control``), recorded on each
    # call it holds so a status callback elsewhere reaches it; None when nothing listens.
    holder: int | None = None

    async def model_for_line(self, line_number: str | None) -> RealtimeModel | None:
        """The model for calls on this line: its own engine if it names one, else ``model``.
        Raises :class:`~voice.engines.EngineUnavailable` for an engine this build lacks."""
        if self.engines is None or line_number is None:
            return self.model
        engine = await self.db.fetchval("SELECT voice_engine FROM phone_lines WHERE number = $1", line_number)
        return self.model if engine is None else self.engines.get(engine)

    @property
    def filler_payload(self) -> str:
        return base64.b64encode(self.filler).decode()


class TwilioLink(Protocol):
    """The media socket as the session uses it; the gateway owns reading it (``CallSession.feed``)."""

    backed_up: bool  # the socket's send buffer is over its high-water mark: wait in drained()

    def send(self, text: str) -> None:
        """Write one frame now (no waiting); dropped once the caller has closed the socket."""

    def send_many(self, texts: Sequence[str]) -> None:
        """Write these frames now, in order, in one write."""

    async def drained(self) -> None:
        """Until the send buffer is below its low-water mark again (at once when it is)."""

    async def close(self, code: int = 1000) -> None: ...


@dataclass(frozen=True)
class OwnerCall:
    """The owner-route call this stream belongs to (from the ``calls`` row)."""

    call_sid: str
    account_id: UUID
    handle_id: UUID | None
    caller: str | None
    line_number: str | None
    attested: bool = False  # the carrier vouched for the number (SHAKEN/STIR A): voice.verification


@dataclass
class CallStats:
    frames_in: int = 0
    frames_to_model: int = 0
    frames_discarded: int = 0
    frames_malformed: int = 0
    frames_dropped: int = 0  # while the model socket was being replaced
    audio_out_bytes: int = 0
    barge_ins: int = 0
    clear_ms: list[float] = field(default_factory=list)
    fillers: int = 0
    model_reconnects: int = 0
    verify_failures: int = 0

    def as_record(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "clear_ms"}
        out["clear_ms"] = [round(v, 3) for v in self.clear_ms]
        return out


@dataclass(slots=True)
class _Mark:
    kind: str  # audio, notice, commit, bye
    item_id: str | None = None
    played_bytes: int = 0
    write_ids: tuple[int, ...] = ()
    cancelled: bool = False


@dataclass(slots=True)
class _Request:
    """A response Pepper asks the model for: sent once no response runs, and tied to the response
    created after it (``write_ids``: the staged writes that response must confirm aloud)."""

    instructions: str | None = None
    write_ids: tuple[int, ...] = ()
    notice: bool = False


_DIGIT_VALUES = {w: str(n) for n, w in enumerate("zero one two three four five six seven eight nine".split())}
_DIGIT_VALUES["oh"] = "0"
_ONE_DIGIT = re.compile("|".join((*_DIGIT_VALUES, r"\d")), re.IGNORECASE)
_DIGIT_WORDS = f"(?:{_ONE_DIGIT.pattern})"
_DIGIT_RUN = re.compile(rf"\b{_DIGIT_WORDS}(?:[\s,.-]*{_DIGIT_WORDS}){{2,}}\b", re.IGNORECASE)
# Playback is tracked with a Twilio mark at least every 100 ms of audio (and at each response's end).
MARK_EVERY_BYTES = 100 * media.BYTES_PER_MS
# Owner notices under way: kept here, not among a call's tasks, so they outlive the call.
_NOTICES: set[asyncio.Task[None]] = set()
# Arguments never written to records: a PIN or code the caller gave.
SECRET_TOOLS = frozenset({"verify_pin", "check_code"})


def withhold_digits(text: str, only: Collection[str] | None = None) -> str:
    """Runs of three or more spoken digits, replaced (a PIN or code said before verification).
    With ``only``, just the runs holding one of those digit strings (a PIN or code the caller used
    is withheld even when said again after verification)."""

    def replace(match: re.Match[str]) -> str:
        if only is None:
            return "[digits withheld]"
        said = "".join(_DIGIT_VALUES.get(d.lower(), d) for d in _ONE_DIGIT.findall(match.group()))
        return "[digits withheld]" if any(secret in said for secret in only) else match.group()

    return _DIGIT_RUN.sub(replace, text)


def labelled(text: str) -> str:
    return f"{LABEL}\n{text}"


class CallSession:
    def __init__(self, deps: VoiceDeps, link: TwilioLink, start: media.StreamStart, call: OwnerCall):
        self.deps = deps
        self.link = link
        self.start = start
        self.call = call
        self.stats = CallStats()
        self.trust = "owner_unverified"
        self.verified_by: str | None = None
        self.listening = False
        self.end_reason: str | None = None
        self._ended = asyncio.Event()
        self._end_stored = False  # the end reason is in the calls row (see ``ended``)
        self._sid = start.stream_sid
        self.model: RealtimeModel | None = deps.model  # the line's engine, looked up in run()
        self._conn: RealtimeConnection | None = None
        self._conn_stack: AsyncExitStack | None = None
        self._generation = 0  # bumps on every model reconnect
        self._marks: dict[str, _Mark] = {}
        self._mark_seq = 0
        self._sent_bytes: dict[str, int] = {}
        self._played_bytes: dict[str, int] = {}
        self._marked_bytes: dict[str, int] = {}
        self._last_item: str | None = None
        self._active_response: str | None = None
        self._cancelled_responses: set[str] = set()
        self._response_audio: dict[str, int] = {}
        self._notice_response: str | None = None
        # Responses asked for: waiting for the running one to end, sent (not yet created), and
        # the created ones with what they answer. The model refuses a response.create while
        # another response runs, so one is sent only when none does.
        self._pending: deque[_Request] = deque()
        self._requested: _Request | None = None
        self._tied: dict[str, _Request] = {}
        self._last_tied: str | None = None
        self._carried: dict[str, tuple[int, ...]] = {}  # response id -> writes its tools' results carry on
        self._unconfirmed: list[int] = []
        self._dropped_notes: list[str] = []
        self._write_summaries: dict[int, str] = {}
        self._tool_tasks: dict[str, list[asyncio.Task[CallOutcome]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._resolving: set[asyncio.Task[Any]] = set()  # commits the caller heard confirmed
        self._closing: str | None = None
        self._dtmf: list[str] = []
        self._dtmf_timer: asyncio.TimerHandle | None = None
        self._code: tuple[str, float] | None = None
        self._codes_sent = 0
        self._verify_lock = asyncio.Lock()  # one PIN or code checked at a time
        # Every PIN or code tried (and the code sent), and the speech begun after verification:
        # only that speech keeps its digits in the records, and never these.
        self._secrets: set[str] = set()
        self._spoken_verified: set[str] = set()
        self._outcomes: list[CallOutcome] = []
        self._transcript: list[dict[str, Any]] = []
        self._records: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        self._started = time.monotonic()
        self._started_at = deps.clock()
        self._turn_id: UUID | None = None
        self._conversation_id: UUID | None = None
        self._registry = self._call_registry()
        self._session_ctx: SessionContext | None = None
        self._timezone = "UTC"
        self._resolved: list[dict[str, Any]] = []
        self._trust_changed = False
        self._connections: frozenset[str] = frozenset()  # the person's, read once they proved who they are
        self._call_trust: dict[str, str] = {}  # the session's trust when each tool call ran

    # --- The call's own controls, as tools through the same gate --------------------------------

    def _call_registry(self) -> ToolRegistry:
        digits = {"type": "object", "properties": {"digits": {"type": "string", "minLength": 1, "maxLength": 40}},
                  "required": ["digits"], "additionalProperties": False}  # fmt: skip
        empty = {"type": "object", "properties": {}, "additionalProperties": False}
        controls = (
            Tool("verify_pin", "Check the PIN the caller said aloud (digits only).", digits, self._tool_verify_pin,
                 area="call"),
            Tool("send_code", "Text a one-time code to the caller's verified phone number.", empty,
                 self._tool_send_code, area="call"),
            Tool("check_code", "Check the one-time code the caller read back (digits only).", digits,
                 self._tool_check_code, area="call"),
            Tool("end_call", "End the call after you have said goodbye in this response.", empty,
                 self._tool_end_call, area="call"),
        )  # fmt: skip
        registry = ToolRegistry(controls)
        for tool in self.deps.registry.all():
            if tool.name not in registry:
                registry.add(tool)
        return registry

    def _session(self) -> SessionContext:
        return SessionContext(
            kind="call",
            trust=self.trust,  # type: ignore[arg-type]
            channel="voice",
            account_id=self.call.account_id,
            conversation_id=self._conversation_id,
            turn_id=self._turn_id,
            timezone=self._timezone,
            connections=self._connections,
        )

    def visible_tools(self) -> list[Tool]:
        session = self._session()
        shown = session_tools(self._registry, self.deps.gate, session)
        if self.trust == "owner_verified":
            shown = [t for t in shown if t.name not in ("verify_pin", "send_code", "check_code")]
        return shown

    async def _instructions(self) -> str:
        if self.trust != "owner_verified":
            return f"{PERSONA}\n\n{RESTRICTED}"
        # The owner's context as a text turn gets it: connections (so the connected tools), the
        # dossier and the memory block, built in core (``core.owner_context``). The call's own lines
        # are left out of the block, as a text turn's own messages are: the model has them already.
        assert self._conversation_id is not None
        db = self.deps.db
        own = await db.fetch(
            "SELECT id FROM messages WHERE conversation_id = $1 AND (turn_id = $2 OR provider_message_id LIKE $3)",
            self._conversation_id, self._turn_id, f"{self.call.call_sid}:%",
        )  # fmt: skip
        context = await load_owner_context(
            db, self.call.account_id, self._conversation_id, self._timezone, self.deps.clock(),
            connectors=self.deps.connectors, memory=self.deps.memory, exclude_message_ids=[r["id"] for r in own],
        )  # fmt: skip
        self._connections = context.connections
        return "\n\n".join([PERSONA, VERIFIED, dossier_section(context.dossier), context.memory])

    async def _config(self) -> SessionConfig:
        return SessionConfig(
            await self._instructions(), tuple(t.spec for t in self.visible_tools()), voice=self.deps.config.voice
        )

    # --- Running -----------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """The call is over and its socket may be closed: at once after a hang-up, else once the end
        reason is stored (Twilio asks for the after-stream TwiML the moment the socket closes)."""
        return self._ended.is_set() and (self._end_stored or self.end_reason == "hangup")

    def hang_up(self, reason: str = "hangup") -> None:
        """End the call from outside (the caller hung up, the status callback said so)."""
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self._ended.set()

    def _spawn(self, name: str, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"call-{self.call.call_sid[-8:]}-{name}")  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._resolving.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call task %s failed", task.get_name(), exc_info=task.exception())
            self._end("error")

    async def run(self) -> None:
        """Run the call until it ends, then record it. Returns normally; CancelledError passes."""
        db = self.deps.db
        self._conversation_id = await conversation_for(db, self.call.account_id)
        self._timezone = await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", self.call.account_id)
        self._turn_id = await start_turn(db, self._conversation_id, channel="voice", kind="call")
        await db.execute("UPDATE calls SET status = 'in-progress', turn_id = $2, held_by = $3 WHERE call_sid = $1",
                         self.call.call_sid, self._turn_id, self.deps.holder)  # fmt: skip
        recorder = self._spawn("recorder", self._record_loop())
        try:
            self.model = await self.deps.model_for_line(self.call.line_number)
        except RealtimeError:
            log.exception("the voice engine of this call's line is unavailable")
            self.model = None
        try:
            if self.model is None or not await self._open_model():
                self._end("model-failed")
            else:
                self._spawn("model", self._model_loop())
                self._spawn("deadline", self._deadline())
                self._spawn("notice-watch", self._notice_watch())
                await self._request_response(_Request(self._notice_instructions(), notice=True))
            await self._ended.wait()
        except RealtimeDisconnected:
            self._end("model-failed")
        finally:
            await self._shutdown(recorder)

    async def _shutdown(self, recorder: asyncio.Task[Any]) -> None:
        for task in list(self._tasks):
            # A commit under way (its mark came back: the caller heard the confirmation) finishes
            # and is recorded; everything else stops.
            if task is not recorder and task not in self._resolving:
                task.cancel()
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()
        others = [t for t in self._tasks if t is not recorder]
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        if self._conn_stack is not None:
            with contextlib.suppress(Exception):
                await self._conn_stack.aclose()
        if self.end_reason != "hangup":
            # Twilio asks for the after-stream TwiML the instant the socket closes, and that answer
            # depends on the end reason (an apology when the model failed): stored first.
            try:
                await self.deps.db.execute("UPDATE calls SET end_reason = $2 WHERE call_sid = $1",
                                           self.call.call_sid, self.end_reason)  # fmt: skip
            except Exception:
                log.exception("could not record why a call ended before hanging up")
            self._end_stored = True
            with contextlib.suppress(Exception):
                await self.link.close(1000)
        self._records.put_nowait(None)
        await asyncio.gather(recorder, return_exceptions=True)
        await self._finish()

    async def _open_model(self) -> bool:
        assert self.model is not None
        stack = AsyncExitStack()
        try:
            conn = await stack.enter_async_context(self.model.connect())
            await conn.configure(await self._config())
        except RealtimeDisconnected:
            await stack.aclose()
            log.warning("could not open the realtime model session")
            return False
        self._conn, self._conn_stack = conn, stack
        conn.deliver_audio_to(self._audio_now)
        return True

    async def _deadline(self) -> None:
        await asyncio.sleep(self.deps.config.max_call_seconds)
        await self._begin_closing("max-duration", "The call has reached its time limit. Say goodbye in one sentence.")

    async def _notice_watch(self) -> None:
        await asyncio.sleep(self.deps.config.notice_timeout)
        if not self.listening:
            log.warning("the opening notice never finished playing; ending the call")
            self._end("model-failed")

    # --- Twilio -> model (the hot path) -----------------------------------------------------------

    def feed(self, raw: str | bytes) -> Awaitable[None] | None:
        """One frame from Twilio, handled at once where nothing has to wait: None when done, else
        what is left to await before the next frame of this call (the model's socket is full, or
        an adapter whose append waits). The media server relays most frames inside its frame
        callback this way, with no task switch per frame. Never raises for a bad frame."""
        try:
            frame = media.parse(raw)
            event = frame["event"]
            if event == "media":
                payload = media.media_payload(frame)
                stats = self.stats
                stats.frames_in += 1
                if not self.listening:
                    stats.frames_discarded += 1
                    return None
                conn = self._conn
                if conn is None:
                    stats.frames_dropped += 1
                    return None
                try:
                    if conn.append_audio_nowait(payload):
                        stats.frames_to_model += 1
                        return None
                except RealtimeDisconnected:
                    stats.frames_dropped += 1
                    return None
                return self._append(conn, payload)
            if event == "mark":
                self._on_mark(media.mark_name(frame))
            elif event == "dtmf":
                self._on_dtmf(media.dtmf_digit(frame))
            elif event == "stop":
                self._end("hangup")
            elif event not in ("connected", "start"):
                raise media.MalformedFrame("unknown event")
        except media.MalformedFrame:
            self.stats.frames_malformed += 1
        return None

    async def _append(self, conn: RealtimeConnection, payload: str) -> None:
        try:
            await conn.append_audio(payload)
            self.stats.frames_to_model += 1
        except RealtimeDisconnected:
            self.stats.frames_dropped += 1

    def _on_mark(self, name: str) -> None:
        mark = self._marks.pop(name, None)
        if mark is None:
            return
        if mark.cancelled:
            return  # echoed by a clear: never played
        if mark.kind == "audio" and mark.item_id is not None:
            self._played_bytes[mark.item_id] = mark.played_bytes
        elif mark.kind == "notice":
            self.listening = True
        elif mark.kind == "commit":
            self._resolving.add(self._spawn("commit", self._resolve_writes(list(mark.write_ids), commit=True)))
        elif mark.kind == "bye":
            self._end(self._closing or "end-call")

    def _send_mark(self, mark: _Mark) -> None:
        self.link.send(self._mark_frame(mark))

    def _mark_frame(self, mark: _Mark) -> str:
        """The frame of a new mark, now awaited; the caller sends it."""
        self._mark_seq += 1
        name = f"{mark.kind[0]}{self._mark_seq}"
        self._marks[name] = mark
        return media.mark_frame(self._sid, name)

    # --- Model -> Twilio ----------------------------------------------------------------------

    async def _model_loop(self) -> None:
        reconnects = 0
        while not self._ended.is_set():
            conn = self._conn
            assert conn is not None
            try:
                async for event in conn.events():
                    await self._on_model(event)
                raise RealtimeDisconnected("the event stream ended")
            except RealtimeDisconnected as exc:
                if self._ended.is_set():
                    return
                log.warning("realtime model socket dropped mid-call: close_code=%s", getattr(exc, "close_code", None))
                if reconnects >= self.deps.config.model_reconnects or not await self._reconnect():
                    self._end("model-failed")
                    return
                reconnects += 1

    async def _reconnect(self) -> bool:
        old = self._conn_stack
        self._conn, self._conn_stack = None, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.aclose()
        self._generation += 1
        # The old socket's responses, requests and notice mean nothing to the new one.
        self._active_response = None
        self._notice_response = None
        self._pending.clear()
        self._requested, self._last_tied = None, None
        self._tied.clear()
        self._carried.clear()
        # Writes whose confirmation the caller has not heard: the new session never saw their tool
        # results, so nothing will confirm them.
        dropped, self._unconfirmed = self._unconfirmed, []
        if not await self._open_model():
            return False  # the call ends; its end drops every write still staged
        self.stats.model_reconnects += 1
        assert self._conn is not None
        said = "\n".join(f"{e['role']}: {neutralise_labels(e['text'])}" for e in self._transcript if "text" in e)[
            -4000:
        ]
        if said:
            await self._conn.add_note(labelled("The line to the model dropped. The call so far:\n" + said))
        if dropped:
            await self._resolve_writes(dropped, commit=False, tell_model=True)
        notice_playing = any(m.kind == "notice" and not m.cancelled for m in self._marks.values())
        if not self.listening and not notice_playing:
            # Dropped while the notice played (or before it was asked): the new socket says it.
            await self._request_response(_Request(self._notice_instructions(), notice=True))
        elif self.listening:
            await self._request_response(
                _Request("Apologise in a few words for the short interruption and carry on where you left off.")
            )
        return True

    def _notice_instructions(self) -> str:
        return f"Say exactly this, and nothing else: {self.deps.config.notice}"

    async def _request_response(self, request: _Request, *, first: bool = False) -> None:
        """Ask for a response: now if none runs, else once the running one has ended."""
        if first:
            self._pending.appendleft(request)
        else:
            self._pending.append(request)
        await self._pump()

    async def _pump(self) -> None:
        """Send the next waiting request when no response runs and none was asked for and not yet
        created. Raises :class:`RealtimeDisconnected` (the model loop reconnects)."""
        conn = self._conn
        if conn is None or self._ended.is_set() or self._active_response is not None or self._requested is not None:
            return
        if not self._pending:
            return
        request = self._requested = self._pending.popleft()
        await conn.create_response(request.instructions)

    def _audio_now(self, event: AudioDelta) -> bool:
        """The model's audio straight to the caller from the adapter's read callback, without
        going through the model loop (``RealtimeConnection.deliver_audio_to``): called only while
        that loop waits for its next event with none queued, so the order of events is kept.
        False, and nothing done, while the caller's socket is backed up."""
        if self.link.backed_up:
            return False
        self._relay_audio(event)
        return True

    def _relay_audio(self, event: AudioDelta) -> None:
        if event.response_id in self._cancelled_responses:
            return
        frame = media.media_frame(self._sid, event.payload)
        size = media.decoded_length(event.payload)
        self.stats.audio_out_bytes += size
        item = event.item_id
        sent = self._sent_bytes.get(item, 0) + size
        self._sent_bytes[item] = sent
        self._last_item = item
        self._response_audio[event.response_id] = self._response_audio.get(event.response_id, 0) + size
        if sent - self._marked_bytes.get(item, 0) >= MARK_EVERY_BYTES:
            self._marked_bytes[item] = sent
            # The audio and its mark in one write: one system call (and one TCP segment) for both.
            self.link.send_many((frame, self._mark_frame(_Mark("audio", item, sent))))
        else:
            self.link.send(frame)

    async def _on_model(self, event: Any) -> None:
        if type(event) is AudioDelta:
            self._relay_audio(event)
            if self.link.backed_up:
                await self.link.drained()
        elif type(event) is SpeechStarted:
            if self.trust == "owner_verified" and event.item_id:
                self._spoken_verified.add(event.item_id)
            await self._barge_in()
        elif type(event) is ResponseCreated:
            self._active_response = event.response_id
            request, self._requested = self._requested, None
            if request is not None:  # the response Pepper asked for (else one the model began itself)
                self._tied[event.response_id] = request
                self._last_tied = event.response_id
                if request.notice:
                    self._notice_response = event.response_id
        elif type(event) is ResponseDone:
            await self._on_response_done(event)
        elif type(event) is FunctionCall:
            self._start_tool(event)
        elif type(event) is UserTranscript:
            text = event.text.strip()
            if text:
                # A transcript often comes after the reply it started (OpenAI transcribes beside the
                # model), so what counts is when the speech began, not the trust at this moment.
                verified = event.item_id in self._spoken_verified
                text = withhold_digits(text, only=self._secrets if verified else None)
                self._note_transcript("caller", text)
                self._records.put_nowait(("in", event.item_id, text))
        elif type(event) is AssistantTranscript:
            # Pepper's side too: a model may read a PIN back. Before verification every run of
            # digits is withheld (the digits may be tried only after this line was said).
            text = withhold_digits(event.text.strip(), only=None if self.trust == "owner_unverified" else self._secrets)
            if text:
                interrupted = event.response_id in self._cancelled_responses
                self._note_transcript("pepper", text, interrupted=interrupted)
                self._records.put_nowait(("out", event.item_id, text + (" [interrupted]" if interrupted else "")))
        elif type(event) is ModelErrorEvent:
            if event.code == "conversation_already_has_active_response":
                await self._refused_request()
            elif event.code not in ("response_cancel_not_active",):
                log.warning("realtime model reported an error: code=%s", event.code)

    def _note_transcript(self, role: str, text: str, **extra: Any) -> None:
        self._transcript.append({"at_ms": round((time.monotonic() - self._started) * 1000), "role": role,
                                 "text": text, **extra})  # fmt: skip

    async def _refused_request(self) -> None:
        """The model refused a response.create because a response it began itself was running (its
        ``response.created`` came first, and was taken for ours): ask again once that one ends."""
        request, self._requested = self._requested, None
        if request is None and self._last_tied is not None:
            request = self._tied.pop(self._last_tied, None)
            if request is not None and request.notice:
                self._notice_response = None
        self._last_tied = None
        if request is not None:
            self._pending.appendleft(request)
            await self._pump()

    async def _on_response_done(self, event: ResponseDone) -> None:
        rid = event.response_id
        if self._active_response == rid:
            self._active_response = None
        request = self._tied.pop(rid, None)
        if self._last_tied == rid:
            self._last_tied = None
        item = self._last_item
        if item is not None and self._sent_bytes.get(item, 0) > self._marked_bytes.get(item, 0):
            self._marked_bytes[item] = self._sent_bytes[item]
            self._send_mark(_Mark("audio", item, self._sent_bytes[item]))
        self._response_ended(event, request)
        await self._pump()

    def _response_ended(self, event: ResponseDone, request: _Request | None) -> None:
        rid = event.response_id
        if rid == self._notice_response:
            if event.status == "completed":
                self._send_mark(_Mark("notice"))
            else:
                log.warning("the opening notice response did not complete: status=%s", event.status)
                self._end("model-failed")
            return
        spoke = self._response_audio.get(rid, 0) > 0
        # A staged write is saved only on the mark after the response asked to confirm it, and only
        # if that response spoke: the caller heard the confirmation play out.
        ids = [i for i in (request.write_ids if request is not None else ()) if i in self._unconfirmed]
        if ids:
            if event.status == "completed" and spoke:
                self._unconfirmed = [i for i in self._unconfirmed if i not in ids]
                self._send_mark(_Mark("commit", write_ids=tuple(ids)))
            elif event.status == "completed" and rid in self._tool_tasks:
                self._carried[rid] = tuple(ids)  # said nothing, called tools: the next response confirms
            else:
                self._unconfirmed = [i for i in self._unconfirmed if i not in ids]
                self._spawn("drop", self._resolve_writes(ids, commit=False, tell_model=True))
        if rid in self._tool_tasks:
            self._spawn("tool-results", self._finish_tools(rid, self._generation))
            return
        if event.status != "completed":
            return
        if self._closing is not None and (spoke or event.function_calls == 0):
            self._send_mark(_Mark("bye"))

    async def _barge_in(self) -> None:
        started = time.perf_counter()
        pending = [m for m in self._marks.values() if not m.cancelled and m.kind != "notice"]
        if not pending and self._active_response is None:
            return
        self.link.send(media.clear_frame(self._sid))
        self.stats.clear_ms.append((time.perf_counter() - started) * 1000)
        self.stats.barge_ins += 1
        dropped: list[int] = list(self._unconfirmed)
        self._unconfirmed = []
        for mark in pending:
            mark.cancelled = True
            dropped.extend(mark.write_ids)
        conn = self._conn
        if conn is None:
            return
        try:
            if self._active_response is not None:
                self._cancelled_responses.add(self._active_response)
                await conn.cancel_response()
            item = self._last_item
            if item is not None and self._played_bytes.get(item, 0) < self._sent_bytes.get(item, 0):
                played_ms = self._played_bytes.get(item, 0) // media.BYTES_PER_MS
                await conn.truncate(item, played_ms)
                self._sent_bytes[item] = self._marked_bytes[item] = self._played_bytes.get(item, 0)
        except RealtimeDisconnected:
            pass  # the model loop reconnects
        if dropped:
            self._spawn("drop", self._resolve_writes(dropped, commit=False, tell_model=True))

    # --- Tools -------------------------------------------------------------------------------

    def _start_tool(self, event: FunctionCall) -> None:
        try:
            arguments = json.loads(event.arguments or "{}")
        except ValueError:
            arguments = event.arguments  # the runner reports it as not a JSON object
        call = ToolCall(event.call_id, event.name, arguments)
        task = self._spawn(f"tool-{event.name}", self._run_tool(call))
        self._tool_tasks.setdefault(event.response_id, []).append(task)

    async def _run_tool(self, call: ToolCall) -> CallOutcome:
        ctx = ToolContext(self._session(), self.deps.db, self.deps.clock())
        visible = {t.name for t in self.visible_tools()}
        work = asyncio.ensure_future(run_call(self._registry, self.deps.gate, ctx, call, visible=visible))
        try:
            done, _ = await asyncio.wait({work}, timeout=self.deps.config.filler_after)
            if not done:
                await self._play_filler()
            outcome = await work
        finally:
            if not work.done():
                work.cancel()
        self._outcomes.append(outcome)
        self._call_trust[call.id] = ctx.session.trust  # whose words its arguments are (core.memory.records)
        if outcome.write is not None and outcome.write.get("staged"):
            self._unconfirmed.append(int(outcome.write["id"]))
            self._write_summaries[int(outcome.write["id"])] = str(outcome.write.get("summary", ""))
        return outcome

    async def _play_filler(self) -> None:
        self.stats.fillers += 1
        self.link.send(media.media_frame(self._sid, self.deps.filler_payload))
        self._send_mark(_Mark("audio", None))

    async def _finish_tools(self, response_id: str, generation: int) -> None:
        tasks = self._tool_tasks.pop(response_id, [])
        outcomes = await asyncio.gather(*tasks)
        conn = self._conn
        staged = [int(o.write["id"]) for o in outcomes if o.write is not None and o.write.get("staged")]
        if conn is None or generation != self._generation or self._ended.is_set():
            # The model session was replaced; its call ids mean nothing to the new one, which will
            # never confirm these writes.
            stale = [i for i in staged if i in self._unconfirmed]
            if stale and not self._ended.is_set():
                self._unconfirmed = [i for i in self._unconfirmed if i not in stale]
                await self._resolve_writes(stale, commit=False, tell_model=True)
            return
        ids = tuple(i for i in (*self._carried.pop(response_id, ()), *staged) if i in self._unconfirmed)
        try:
            for outcome in outcomes:
                content = outcome.content
                if outcome.write is not None and outcome.write.get("staged"):
                    content = (f"Done: {outcome.write['summary']}. It is saved once the caller has heard you"
                               " confirm it; say so in one short sentence.")  # fmt: skip
                await conn.send_tool_output(outcome.call.id, content)
            if self._trust_changed:
                self._trust_changed = False
                await conn.configure(await self._config())
            # Sent once the response running now (if any) has ended; the response created after
            # it is the one that must confirm these writes.
            await self._request_response(_Request(write_ids=ids))
        except RealtimeDisconnected:
            pass

    async def _resolve_writes(self, ids: list[int], *, commit: bool, tell_model: bool = False) -> None:
        assert self._turn_id is not None
        resolve = commit_writes if commit else drop_writes
        for write in await resolve(self.deps.db, self._registry, self._turn_id, ids):
            self._resolved.append(write.as_record())
        if tell_model and not commit and self._conn is not None:
            summaries = ", ".join(self._write_summaries.get(i, "a change") for i in ids)
            with contextlib.suppress(RealtimeDisconnected):
                await self._conn.add_note(
                    labelled(f"NOT saved, because the caller did not hear it confirmed: {summaries}."
                             " Ask again if they still want it.")
                )  # fmt: skip

    # --- Verification ------------------------------------------------------------------------

    async def _verified(self, how: str, digits: str) -> None:
        self.trust = "owner_verified"
        self.verified_by = how
        self._secrets.add(digits)
        self._code = None
        self._trust_changed = True
        log.info("caller verified on a call: method=%s", how)

    async def _failed_verification(self) -> str:
        self.stats.verify_failures += 1
        left = self.deps.config.max_verify_failures - self.stats.verify_failures
        if left > 0:
            return f"That did not match. {left} attempt{'s' if left > 1 else ''} left."
        await record_security_event(self.deps.db, "call-verification-failed", call_sid=self.call.call_sid)
        self._notify_owner_soon(FAILED_NOTICE)
        await self._begin_closing(
            "verification-failed",
            "Tell the caller you could not verify them, so you are ending the call. Say goodbye in one sentence.",
        )
        return "Verification failed too many times; the call is ending."

    def _limits(self) -> dict[str, Any]:
        config = self.deps.config
        return {"attested": self.call.attested, "per_source": config.pin_failures_per_source,
                "per_account": config.pin_failures_per_account, "window": config.verify_window_seconds}  # fmt: skip

    async def _attempt(
        self, digits: str, *, pin: bool, code: bool, method: str, code_method: str = ""
    ) -> tuple[str, str]:
        """Check one PIN (``pin``) and/or the code waiting (``code``), one check at a time per call
        (concurrent tool calls wait their turn). (verdict, detail): ``verified`` (detail: the method),
        ``already``, ``refused`` (the call is closing or out of tries: nothing checked), ``locked``
        (the PIN path is locked across calls: nothing checked), ``no-code``, or ``wrong``."""
        async with self._verify_lock:
            if self.trust == "owner_verified":
                return "already", "The caller is already verified."
            if self._closing is not None or self.stats.verify_failures >= self.deps.config.max_verify_failures:
                return "refused", "Not checked: the call is ending."
            db, account = self.deps.db, self.call.account_id
            code_waiting = code and self._code is not None
            locked = pin and await verification.pin_locked(db, account, self.call.caller, **self._limits())
            if locked and not code_waiting:
                return "locked", PIN_LOCKED_WORDS
            if not pin and not code_waiting:
                return "no-code", "no code is waiting; use send_code first"
            if digits:
                self._secrets.add(digits)
            if pin and not locked and await identity.verify_pin(db, account, digits):
                await self._verified(method, digits)
                return "verified", method
            if code_waiting:
                matched = self._code_matches(digits)
                self._code = None  # a code is checked once: right, or burnt
                if matched:
                    await self._verified(code_method, digits)
                    return "verified", code_method
            kind = verification.WRONG_PIN if pin and not locked else verification.WRONG_CODE
            call = self.call
            limits = self._limits()
            now_locked = await verification.record_wrong(db, account, call.caller, call.call_sid, kind, **limits)
            if now_locked:
                log.warning("the PIN path is locked after repeated wrong PINs")
                self._notify_owner_soon(PIN_LOCKED_NOTICE)
            message = await self._failed_verification()
            return "wrong", f"{message} {PIN_LOCKED_WORDS[len('Not checked: ') :]}" if now_locked else message

    @staticmethod
    def _verdict(verdict: str, detail: str) -> ToolOutcome:
        if verdict == "verified":
            what = "Code" if detail.startswith("sms-code") else "PIN"
            return ToolOutcome.ok(f"{what} correct: the caller is verified. Memory and every tool are now available.")
        if verdict == "already":
            return ToolOutcome.ok(detail)
        return ToolOutcome.failed(detail)

    async def _tool_verify_pin(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        digits = re.sub(r"\D", "", args["digits"])
        return self._verdict(*await self._attempt(digits, pin=True, code=False, method="pin-spoken"))

    async def _tool_send_code(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if self.trust == "owner_verified":
            return ToolOutcome.ok("The caller is already verified.")
        if self.deps.send_sms is None or not self.call.caller or not self.call.line_number:
            return ToolOutcome.failed("text messages cannot be sent from this line")
        config = self.deps.config
        async with self._verify_lock:
            if self.trust == "owner_verified":
                return ToolOutcome.ok("The caller is already verified.")
            if self._closing is not None:
                return ToolOutcome.failed("no code was sent: the call is ending")
            if self._codes_sent >= config.codes_per_call:
                return ToolOutcome.failed("no code was sent: this call has had all the codes it can have")
            claim = await verification.claim_code_send(self.deps.db, self.call.account_id, self.call.caller,
                                                       self.call.call_sid, attested=self.call.attested,
                                                       per_hour=config.codes_per_hour)  # fmt: skip
            if claim is None:
                return ToolOutcome.failed("no code was sent: too many codes were texted in the last hour")
            code = f"{secrets.randbelow(10**6):06d}"
            try:
                await self.deps.send_sms(self.call.caller, self.call.line_number, f"Your Pepper call code is {code}.")
            except Exception:
                log.exception("sending a one-time call code failed")
                await verification.release_code_send(self.deps.db, claim)
                return ToolOutcome.failed("the text message could not be sent")
            self._codes_sent += 1
            self._secrets.add(code)
            self._code = (code, time.monotonic() + config.code_ttl_seconds)
        return ToolOutcome.ok("A six-digit code was texted to the caller's phone. Ask them to read it out or key it.")

    def _code_matches(self, digits: str) -> bool:
        if self._code is None or time.monotonic() > self._code[1]:
            return False
        return secrets.compare_digest(digits, self._code[0])

    async def _tool_check_code(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        digits = re.sub(r"\D", "", args["digits"])
        return self._verdict(*await self._attempt(digits, pin=False, code=True, method="", code_method="sms-code"))

    async def _tool_end_call(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await self._begin_closing("end-call", None)
        return ToolOutcome.ok("The call ends once your goodbye has played. Say goodbye now in a few words.")

    def _on_dtmf(self, digit: str) -> None:
        if self.trust == "owner_verified" or self._closing is not None:
            return
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()
            self._dtmf_timer = None
        if digit == "#":
            self._submit_dtmf()
            return
        if digit.isdigit():
            self._dtmf.append(digit)
        if len(self._dtmf) >= 12:
            self._submit_dtmf()
            return
        self._dtmf_timer = asyncio.get_running_loop().call_later(self.deps.config.dtmf_idle_seconds, self._submit_dtmf)

    def _submit_dtmf(self) -> None:
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()
            self._dtmf_timer = None
        digits, self._dtmf = "".join(self._dtmf), []
        if len(digits) >= 4:
            self._spawn("dtmf-check", self._check_dtmf(digits))

    async def _check_dtmf(self, digits: str) -> None:
        verdict, detail = await self._attempt(digits, pin=True, code=True, method="pin-keypad",
                                              code_method="sms-code-keypad")  # fmt: skip
        if verdict in ("already", "refused"):
            return
        event = {"verified": "verified", "wrong": "wrong digits"}.get(verdict, "not checked")
        self._transcript.append({"at_ms": round((time.monotonic() - self._started) * 1000), "role": "keypad",
                                 "event": event})  # fmt: skip
        conn = self._conn
        if verdict == "verified":
            self._trust_changed = False
            if conn is not None:
                with contextlib.suppress(RealtimeDisconnected):
                    await conn.configure(await self._config())
                    await conn.add_note(labelled("The caller keyed in the right PIN: they are verified."))
                    if self._active_response is None:
                        await conn.create_response("Tell the caller in a few words that they are verified, and ask"
                                                   " how you can help.")  # fmt: skip
            return
        if conn is not None and self._closing is None:
            wrong = verdict == "wrong"
            with contextlib.suppress(RealtimeDisconnected):
                await conn.add_note(labelled(f"The caller keyed in {'a wrong' if wrong else 'a'} PIN. {detail}"))
                if self._active_response is None:
                    await conn.create_response("Tell the caller the PIN was wrong, in a few words." if wrong
                                               else "Tell the caller what the note says, in a few words.")  # fmt: skip

    async def _begin_closing(self, reason: str, instructions: str | None) -> None:
        if self._closing is not None:
            return
        self._closing = reason
        self._spawn("closing-grace", self._closing_grace(reason))
        if instructions is not None and self._conn is not None:
            with contextlib.suppress(RealtimeDisconnected):
                if self._active_response is not None:
                    await self._conn.cancel_response()
                # Sent once the cancelled response has ended, before anything else waiting.
                await self._request_response(_Request(instructions), first=True)

    async def _closing_grace(self, reason: str) -> None:
        await asyncio.sleep(self.deps.config.closing_grace)
        self._end(reason)

    def _notify_owner_soon(self, body: str) -> None:
        """Tell the owner, in a task the end of the call does not cancel: a caller who hangs up at
        once must not stop the notice."""
        task = asyncio.get_running_loop().create_task(self._notify_owner(body), name="call-notify-owner")
        _NOTICES.add(task)
        task.add_done_callback(_NOTICES.discard)

    async def _notify_owner(self, body: str) -> None:
        """A text to the number calling: the owner route admits only a number verified to the account."""
        if self.deps.send_sms is None or not self.call.caller or not self.call.line_number:
            return
        try:
            await self.deps.send_sms(self.call.caller, self.call.line_number, body)
        except Exception:
            log.exception("could not text the owner about failed verification on a call")

    # --- Records -----------------------------------------------------------------------------

    async def _record_loop(self) -> None:
        """Writes transcript lines as they come, off the media path; the call so far is always kept."""
        db = self.deps.db
        while True:
            entry = await self._records.get()
            if entry is None:
                return
            direction, item_id, text = entry
            try:
                if direction == "in":
                    # Speech begun before the caller proved who they are is an unverified caller's.
                    author = None if item_id in self._spoken_verified else UNVERIFIED_CALLER
                    await record_inbound(db, self.call.account_id, "voice", text,
                                         provider_message_id=f"{self.call.call_sid}:{item_id}",
                                         handle_id=self.call.handle_id, author=author)  # fmt: skip
                else:
                    assert self._conversation_id is not None
                    await record_outbound(db, self._conversation_id, "voice", text, turn_id=self._turn_id)
            except Exception:
                log.exception("could not record a call transcript line")

    def summary(self) -> str:
        seconds = round(time.monotonic() - self._started)
        tools = sorted({o.call.name for o in self._outcomes if o.call.name not in SECRET_TOOLS})
        saved = [w["summary"] for w in self._resolved if w["status"] == "committed"]
        dropped = [w["summary"] for w in self._resolved if w["status"] == "dropped"]
        caller_lines = [e["text"] for e in self._transcript if e.get("role") == "caller" and e.get("text")]
        parts = [f"Phone call, {seconds // 60} min {seconds % 60} s"]
        parts.append(f"caller verified ({self.verified_by})" if self.verified_by else "caller not verified")
        if caller_lines:
            first = caller_lines[0]
            parts.append(f'opened with "{first[:80]}{"..." if len(first) > 80 else ""}"')
        if tools:
            parts.append("tools: " + ", ".join(tools))
        if saved:
            parts.append("saved: " + "; ".join(saved))
        if dropped:
            parts.append("not saved: " + "; ".join(dropped))
        parts.append(f"ended: {self.end_reason}")
        return ". ".join(parts) + "."

    def _call_records(self) -> list[dict[str, Any]]:
        records = []
        for outcome in self._outcomes:
            record = outcome.as_record() | {"trust": self._call_trust.get(outcome.call.id, self.trust)}
            if outcome.call.name in SECRET_TOOLS:
                record["arguments"] = {"digits": "[withheld]"}
                record.pop("gated_arguments", None)
            records.append(record)
        return records

    async def _finish(self) -> None:
        db, turn_id = self.deps.db, self._turn_id
        if turn_id is None:
            return
        try:
            for write in await drop_turn_writes(db, self._registry, turn_id):
                self._resolved.append(write.as_record())
            summary = self.summary()
            calls = self._call_records()
            transcript = list(self._transcript)
            for record in calls:
                transcript.append({"role": "tool", "name": record["name"], "status": record["status"]})
            await update_turn(
                db,
                turn_id,
                status="failed" if self.end_reason in ("model-failed", "error") else "delivered",
                trust=self.trust,
                model=getattr(self.model, "model", None) or getattr(self.model, "name", None),
                session=self._session().as_record() | {"verified_by": self.verified_by},
                prompt={"notice": self.deps.config.notice},
                rounds=transcript,
                tool_calls=calls,
                gate_decisions=[
                    {"call_id": o.call.id, "name": o.call.name, **o.gate.as_record()} for o in self._outcomes if o.gate
                ],
                staged_writes=[r for r in self._resolved],
                committed_writes=[r for r in self._resolved if r["status"] == "committed"],
                timings={"total_ms": round((time.monotonic() - self._started) * 1000, 3)},
                delivery={"end_reason": self.end_reason, "stats": self.stats.as_record()},
                reply=summary,
                finished_at=self.deps.clock(),
            )
            await db.execute(
                """
                UPDATE calls SET status = 'completed', ended_at = now(), end_reason = $2, summary = $3,
                                 verified_by = $4, stats = $5::jsonb
                WHERE call_sid = $1
                """,
                self.call.call_sid,
                self.end_reason,
                summary,
                self.verified_by,
                json.dumps(self.stats.as_record()),
            )
        except Exception:
            log.exception("could not record the end of a call")
