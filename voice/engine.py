"""One phone call: Twilio Media Streams on one side, a realtime voice model on the other.

The engine runs the call; a :class:`~voice.profile.CallProfile` says who it is for (the tools,
the instructions, the trust, what the keypad does, where the transcript goes). What the engine
promises, for every profile:

* **Opening.** The profile's notice is the first thing the caller hears: Pepper plays it itself
  from a cached recording (``voice.notice``), straight to Twilio with a mark after it, while the
  model's session opens (on GPT-Live as the session's audio fixture, once it is open), before the
  model may speak; without a recording the model is asked to say it. Until the Twilio mark after
  it comes back (the caller has heard it), caller audio is discarded: neither buffered nor sent to
  the model. A profile with no notice (``""``: a call going on after Pepper pressed keys,
  ``voice.digits``) sends only the mark.
* **Tools** come from the profile's registry and pass its gate and the same runner as text
  turns. A tool that takes longer than ``filler_after`` seconds makes the caller hear a short filler.
* **Barge-in.** When the model reports the caller speaking over Pepper: Twilio ``clear``, cancel
  the response, truncate each assistant item to what was played (tracked with marks; a response
  may speak several items, a preamble and then the answer).
* **Staged writes** wait for the mark after the response asked for after their tool result (sent
  once no other response runs), and only if that response spoke; a barge-in, a hang-up or a model
  drop before it drops them, and the model is told. A commit under way when the call ends
  finishes (a hang-up does not cancel it) before the call is recorded.
* **End.** Caller hang-up (``stop``, socket closed, status callback), the ``end_call`` tool after
  its goodbye was played, the maximum duration, the profile closing the call, or a model that
  cannot be reconnected. The call's turn record gets the transcript (both sides, tool calls) and
  a short summary; the profile stores the transcript lines as they come.
* **Malformed frames** are ignored and counted; the call goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from core.adapters.twilio import media_streams as media
from core.conversation import conversation_for, start_turn, update_turn
from core.metrics import Metrics, metrics
from core.models.types import ToolCall
from core.records import calls as call_records
from core.store import when_reachable
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.tools.runner import CallOutcome, run_call
from core.tools.staging import commit_writes, drop_turn_writes, drop_writes
from core.tracing import traced
from core.untrusted import neutralise_labels
from voice.call_tape import CallTape
from voice.deps import VoiceDeps
from voice.live_call import LiveCall
from voice.profile import AdmittedCall, CallProfile, labelled
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    RealtimeConnection,
    RealtimeDisconnected,
    RealtimeError,
    RealtimeModel,
    RealtimeServerFailed,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)

log = logging.getLogger(__name__)


class TwilioLink(Protocol):
    """The media socket as the engine uses it; the gateway owns reading it (``CallEngine.feed``)."""

    backed_up: bool  # the socket's send buffer is over its high-water mark: wait in drained()

    def send(self, text: str) -> None:
        """Write one frame now (no waiting); dropped once the caller has closed the socket."""

    def send_many(self, texts: Sequence[str]) -> None:
        """Write these frames now, in order, in one write."""

    async def drained(self) -> None:
        """Until the send buffer is below its low-water mark again (at once when it is)."""

    async def close(self, code: int = 1000) -> None: ...


# The metrics' engine label, by the model's class (voice.engines names them so).
ENGINE_LABELS = {"OpenAIRealtime": "openai-realtime", "GptLive": "gpt-live", "GptLiveSip": "gpt-live",
                 "GeminiLive": "gemini-live", "CascadeModel": "cascade"}  # fmt: skip


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
    # Per reply: ms from the model hearing the caller stop to Pepper's first audio frame sent
    # (the dashboard's call latency plots), and that split: the model's part (its speech_stopped
    # to its first audio) and Pepper's own relay (that audio handled to its frame written).
    response_ms: list[float] = field(default_factory=list)
    model_ms: list[float] = field(default_factory=list)
    relay_ms: list[float] = field(default_factory=list)
    # Per caller turn, as the model reports it: ms of caller audio Pepper had sent past the end of
    # the speech when the model said it stopped (its end-of-speech detection).
    endpointing_ms: list[float] = field(default_factory=list)
    tool_ms: list[float] = field(default_factory=list)  # per tool call
    # Per reply again (beside model_ms): the endpointing of the caller turn it answers (0 when the
    # model did not report it) and the tool time inside its model_ms (the calls that ran between
    # the caller stopping and the reply's first audio). The call page's stacked bars.
    reply_endpointing_ms: list[float] = field(default_factory=list)
    reply_tool_ms: list[float] = field(default_factory=list)
    # Sampled (the first frame and every SAMPLE_EVERY-th after), for the metrics only, not the record:
    # ms of Pepper's own part of a caller frame's way to the model (the payload handed to the model
    # socket) and of a model audio frame's way to the caller (the Twilio frame written).
    caller_to_model_ms: list[float] = field(default_factory=list)
    model_to_caller_ms: list[float] = field(default_factory=list)

    def as_record(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, list)}
        out["clear_ms"] = [round(v, 3) for v in self.clear_ms]
        out["relay_ms"] = [round(v, 3) for v in self.relay_ms]
        for name in ("response_ms", "model_ms", "endpointing_ms", "tool_ms", "reply_endpointing_ms", "reply_tool_ms"):
            out[name] = [round(v, 1) for v in getattr(self, name)]
        return out


@dataclass(slots=True)
class _Mark:
    kind: str  # audio, notice, commit, bye; settle (a full-duplex model's delegated writes)
    item_id: str | None = None
    played_bytes: int = 0
    write_ids: tuple[int, ...] = ()
    cancelled: bool = False
    turns: tuple[Any, ...] = ()  # settle: the delegated turns this speech confirmed (voice.live_call)


@dataclass(slots=True)
class _Request:
    """A response Pepper asks the model for: sent once no response runs, and tied to the response
    created after it (``write_ids``: the staged writes that response must confirm aloud)."""

    instructions: str | None = None
    write_ids: tuple[int, ...] = ()
    notice: bool = False


# Playback is tracked with a Twilio mark at least every 100 ms of audio (and at each response's end).
FRAME_MS = 20  # one caller frame (Twilio and browser calls alike)
MARK_EVERY_BYTES = 100 * media.BYTES_PER_MS
SAMPLE_EVERY = 50  # frames between two timed ones (one a second of audio each way)
# Arguments never written to records: a PIN or code the caller gave.
SECRET_TOOLS = frozenset({"verify_pin", "check_code"})


class CallOutside(Protocol):
    """The engine's edges to the store and the tools, replaced as a whole by a replay
    (``voice.replay_call``); without one the engine uses the store and the tool runner."""

    async def open_records(self, engine: CallEngine) -> None: ...

    async def execute(self, ctx: ToolContext, call: ToolCall, visible: set[str]) -> CallOutcome: ...

    async def settle_writes(self, ids: list[int], *, commit: bool) -> list[dict[str, Any]]: ...

    async def finish(self) -> None: ...


class CallEngine:
    """Runs one admitted call with its profile. ``trust`` and ``stats`` may be read from outside;
    :meth:`feed`, :meth:`hang_up` and :meth:`run` drive it."""

    def __init__(
        self,
        deps: VoiceDeps,
        link: TwilioLink,
        start: media.StreamStart,
        call: AdmittedCall,
        profile: CallProfile,
        *,
        model: RealtimeModel | None = None,  # the call's own model (SIP direct: its session), else the line's
        outside: CallOutside | None = None,
    ):
        self.deps = deps
        self.link = link
        self.start = start
        self._call = call
        self._profile = profile
        self.stats = CallStats()
        self._relayed = 0  # model audio frames relayed (for the sampled timing)
        self._heard_at: float | None = None  # when the caller last stopped speaking, until Pepper answers
        self._heard_endpointing = 0.0  # that caller turn's endpointing, as the model reported it
        self._heard_tools = 0  # tool calls timed before it (the reply's own are those after)
        self._session_frames = 0  # caller frames sent to the model before its session began
        self.end_reason: str | None = None
        self._listening = False
        self._ended = asyncio.Event()
        self._end_stored = False  # the end reason is in the calls row (see ``ended``)
        self._sid = start.stream_sid
        self._media_head = media.media_frame(self._sid, "")[: -len('"}}')]  # a media frame up to its payload
        self.model: RealtimeModel | None = model or deps.model  # the line's engine, looked up in run()
        self._own_model = model is not None
        self._conn: RealtimeConnection | None = None
        self._conn_stack: AsyncExitStack | None = None
        self._generation = 0  # bumps on every model reconnect
        self._start_retried = False  # the first session was refused and opened on a second try
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
        self._write_summaries: dict[int, str] = {}
        self._tool_tasks: dict[str, list[asyncio.Task[CallOutcome]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._resolving: set[asyncio.Task[Any]] = set()  # commits the caller heard confirmed
        # The commits themselves, in tasks of their own: a hang-up must not cancel one (and with
        # it what is recorded in its transaction); the call's records wait for them.
        self._commits: set[asyncio.Task[None]] = set()
        self._closing: str | None = None
        self._outcomes: list[CallOutcome] = []
        self._transcript: list[dict[str, Any]] = []
        self._records: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        self._started = time.monotonic()
        self._turn_id: UUID | None = None
        self._conversation_id: UUID | None = None
        self._timezone = "UTC"
        self._resolved: list[dict[str, Any]] = []
        self._trust_changed = False
        self._call_trust: dict[str, str] = {}  # the session's trust when each tool call ran
        # The model side of a call on a full-duplex model (GPT-Live), set once the line's model is known.
        self._live: LiveCall | None = None
        # The notice as Pepper plays it (mu-law 8 kHz, voice.notice); None: the model says it.
        self.notice_mulaw: bytes | None = None
        self._notice_sent = False  # Pepper's recording of it went to Twilio (never twice)
        # The call's recording for replay (voice.call_tape), made in run() unless turned off.
        self.tape: CallTape | None = None
        self._tape_writes: set[asyncio.Task[None]] = set()
        self._outside = outside
        profile.attach(self)

    # --- What profiles see (voice.profile.CallControls) ----------------------------------------

    @property
    def call(self) -> AdmittedCall:
        return self._call

    @property
    def trust(self) -> str:
        return self._profile.trust

    @property
    def conversation_id(self) -> UUID | None:
        return self._conversation_id

    @property
    def turn_id(self) -> UUID | None:
        return self._turn_id

    @property
    def timezone(self) -> str:
        return self._timezone

    @property
    def listening(self) -> bool:
        return self._listening

    @property
    def closing(self) -> str | None:
        return self._closing

    @property
    def transcript(self) -> Sequence[Mapping[str, Any]]:
        return tuple(self._transcript)

    def note(self, role: str, **fields: Any) -> None:
        self._transcript.append({"at_ms": round((time.monotonic() - self._started) * 1000), "role": role, **fields})

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"call-{self._call.call_sid[-8:]}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def begin_closing(self, reason: str, instructions: str | None) -> None:
        if self.tape is not None:
            self.tape.add("cl", reason, instructions)
        if self._closing is not None:
            return
        self._closing = reason
        self.spawn("closing-grace", self._closing_grace(reason))
        if instructions is not None and self._conn is not None:
            with contextlib.suppress(RealtimeDisconnected):
                if self._active_response is not None:
                    await self._conn.cancel_response()
                # Sent once the cancelled response has ended, before anything else waiting.
                await self._request_response(_Request(instructions), first=True)

    async def tell_model(self, note: str, *, respond: bool = False, instructions: str | None = None) -> None:
        if self.tape is not None:
            self.tape.add("tm", note, respond, instructions)
        conn = self._conn
        if conn is None or self._ended.is_set():
            return
        with contextlib.suppress(RealtimeDisconnected):
            await conn.add_note(labelled(note))
            if respond and self._active_response is None:
                await conn.create_response(instructions)

    async def reconfigure(self) -> None:
        if self.tape is not None:
            self.tape.add("rf")
        self._trust_changed = False
        if self._conn is not None:
            with contextlib.suppress(RealtimeDisconnected):
                await self._conn.configure(await self._config())

    def reconfigure_after_tools(self) -> None:
        if self.tape is not None:
            self.tape.add("ra")
        self._trust_changed = True

    def end_call_tool(self, area: str) -> Tool:
        empty = {"type": "object", "properties": {}, "additionalProperties": False}
        return Tool("end_call", "End the call after you have said goodbye in this response.", empty,
                    self._tool_end_call, area=area)  # fmt: skip

    async def _tool_end_call(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await self.begin_closing("end-call", None)
        return ToolOutcome.ok("The call ends once your goodbye has played. Say goodbye now in a few words.")

    async def _config(self) -> SessionConfig:
        if self._live is not None:
            return self._live.config()
        profile = self._profile
        config = SessionConfig(
            await profile.instructions(), tuple(t.spec for t in profile.visible_tools()), voice=self.deps.config.voice
        )
        if self.tape is not None:
            self.tape.config(config)
        return config

    # --- Running -----------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """The call is over and its socket may be closed: at once after a hang-up, else once the end
        reason is stored (Twilio asks for the after-stream TwiML the moment the socket closes)."""
        return self._ended.is_set() and (self._end_stored or self.end_reason == "hangup")

    def hang_up(self, reason: str = "hangup") -> None:
        """End the call from outside (the caller hung up, the status callback said so)."""
        if self.tape is not None:
            self.tape.add("hup", reason)
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            if self.tape is not None:
                self.tape.add("oe", reason)
        self._ended.set()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._resolving.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call task %s failed", task.get_name(), exc_info=task.exception())
            self._end("error")

    @traced(
        "pepper.call",
        lambda a: {"call_sid": a["self"]._call.call_sid, "route": a["self"]._profile.route},
        lambda _, a: {"end_reason": a["self"].end_reason, "turn_id": a["self"]._turn_id},
    )
    async def run(self) -> None:
        """Run the call until it ends, then record it. Returns normally; CancelledError passes."""
        call = self._call
        await self._open_records()
        counted = metrics()
        counted.calls_started.labels(self._profile.route).inc()
        counted.calls_active.inc()
        recorder = self.spawn("recorder", self._record_loop())
        try:
            if not self._own_model:
                self.model = await self.deps.model_for_line(call.line_number)
        except RealtimeError:
            log.exception("the voice engine of this call's line is unavailable")
            self.model = None
        if getattr(self.model, "full_duplex", False):
            self._live = LiveCall(self)
        self._start_tape()
        if self.deps.notice_audio is not None and self.model is not None and self._profile.notice:
            self.notice_mulaw = await self.deps.notice_audio.mulaw(self._profile.notice)
        try:
            if self.notice_mulaw and self._live is None:
                # Pepper's own recording needs no model: it plays while the session opens, so a
                # slow or hanging handshake is not heard as silence.
                self._play_notice(self.notice_mulaw)
            if self.model is None or not await self._open_first():
                self._end("model-failed")
            else:
                self.spawn("model", self._model_loop())
                self.spawn("deadline", self._deadline())
                self.spawn("notice-watch", self._notice_watch())
                if self._live is not None:
                    self.spawn("speech-watch", self._live.watch())
                    await self._live.start()
                elif not self._profile.notice:
                    # Nothing to say first (a call going on after keys were pressed): the
                    # caller's turn once this mark comes back, at once, with no audio before it.
                    self._send_mark(_Mark("notice"))
                elif self._notice_sent:
                    pass  # playing already
                else:
                    await self._request_response(_Request(self._notice_instructions(), notice=True))
            await self._ended.wait()
        except RealtimeDisconnected:
            self._end("model-failed")
        finally:
            counted.calls_active.dec()
            try:
                await self._shutdown(recorder)
            finally:
                self._count_end(counted)

    async def _open_records(self) -> None:
        """The call's conversation, the person's time zone, and the call's turn (started)."""
        if self._outside is not None:
            await self._outside.open_records(self)
            return
        db, call = self.deps.db, self._call
        self._conversation_id = await conversation_for(db, call.account_id)
        self._timezone = await call_records.account_timezone(db, call.account_id)
        self._turn_id = await start_turn(db, self._conversation_id, channel="voice", kind="call")
        await call_records.call_started(db, call.call_sid, self._turn_id, self.deps.holder)

    # --- The recording for replay (voice.call_tape) ----------------------------------------------

    def _start_tape(self) -> None:
        if not self.deps.config.record_calls or self.tape is not None:
            return
        model = self.model
        self.tape = CallTape({"call_sid": self._call.call_sid, "notice": self._profile.notice,
                              "trust": self._profile.trust, "route": self._profile.route,
                              "medium": self._profile.medium, "full_duplex": self._live is not None,
                              "engine": getattr(model, "model", None) or getattr(model, "name", None),
                              "stream_sid": self._sid, "account_id": str(self._call.account_id),
                              "model_reconnects": self.deps.config.model_reconnects})  # fmt: skip
        self.link = self.tape.wrap_link(self.link)
        self.spawn("tape", self._tape_loop())

    async def _tape_loop(self) -> None:
        """Writes the recording in chunks while the call runs (the frame path only appends)."""
        every = self.deps.config.tape_flush_s
        # Calls that began together write at different moments, not all in one burst.
        await asyncio.sleep(every * (0.5 + (hash(self._sid) % 1000) / 1000))
        while True:
            self._write_tape(final=False)
            await asyncio.sleep(every)

    def _write_tape(self, *, final: bool) -> asyncio.Task[None] | None:
        if self.tape is None or self._outside is not None:  # a replay's tape stays in memory
            return None
        seq, entries = self.tape.take()
        if not entries and not final:
            return None
        task = asyncio.get_running_loop().create_task(self._store_tape(seq, entries, final))
        self._tape_writes.add(task)  # not cancelled by the end of the call; _finish waits for it
        task.add_done_callback(self._tape_writes.discard)
        return task

    async def _store_tape(self, seq: int, entries: list[list[Any]], final: bool) -> None:
        writer = self.deps.tape_writer
        try:
            if writer is not None:  # batched with the other calls' chunks (it logs a failure itself)
                await writer.write(self._call.call_sid, self._call.account_id, seq, entries, final=final,
                                   stream_sid=self._sid)  # fmt: skip
            else:  # a chunk is written once (a repeat changes nothing): retried through a database restart
                call, stream_sid = self._call, self._sid
                await when_reachable(lambda: call_records.store_recording(self.deps.db, call.call_sid,
                                     call.account_id, seq, entries, final=final, stream_sid=stream_sid),
                                     what="a recording chunk")  # fmt: skip
        except Exception:
            log.exception("could not store a chunk of a call's recording")

    def _timer_fired(self, name: str) -> None:
        """A timer of the call ran out (``grace``: the closing grace; ``notice``: the notice's)."""
        if self.tape is not None:
            self.tape.add("tmr", name)
        if name == "grace":
            self._end(self._closing or "end-call")
        elif name == "notice" and not self._listening:
            log.warning("the opening notice never finished playing; ending the call")
            self._end("model-failed")

    def _count_end(self, counted: Metrics) -> None:
        """The call's figures into the metrics, once, when it is over (nothing per frame)."""
        counted.calls_ended.labels(self.end_reason or "unknown").inc()
        stats = self.stats
        delegations = self._live.delegation_ms if self._live is not None else []
        for histogram, values in ((counted.call_clear_ms, stats.clear_ms), (counted.call_model_ms, stats.model_ms),
                                  (counted.call_relay_ms, stats.relay_ms), (counted.call_tool_ms, stats.tool_ms),
                                  (counted.call_endpointing_ms, stats.endpointing_ms),
                                  (counted.call_caller_to_model_ms, stats.caller_to_model_ms),
                                  (counted.call_model_to_caller_ms, stats.model_to_caller_ms),
                                  (counted.call_delegation_ms, delegations)):  # fmt: skip
            for ms in values:
                histogram.observe(ms)
        if self.stats.barge_ins:
            counted.call_barge_ins.inc(self.stats.barge_ins)

    async def _shutdown(self, recorder: asyncio.Task[Any]) -> None:
        for task in list(self._tasks):
            # A commit under way (its mark came back: the caller heard the confirmation) finishes
            # and is recorded; everything else stops.
            if task is not recorder and task not in self._resolving:
                task.cancel()
        self._profile.stop()
        others = [t for t in self._tasks if t is not recorder]
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        if self._conn_stack is not None:
            with contextlib.suppress(Exception):
                await self._conn_stack.aclose()
        if self.end_reason != "hangup":
            # Twilio asks for the after-stream TwiML the instant the socket closes, and that answer
            # depends on the end reason (an apology when the model failed): stored first.
            try:  # briefly: the caller's socket waits for it
                await when_reachable(lambda: call_records.store_end_reason(self.deps.db, self._call.call_sid,
                                     self.end_reason), what="a call's end reason", within=5)  # fmt: skip
            except Exception:
                log.exception("could not record why a call ended before hanging up")
            self._end_stored = True
            with contextlib.suppress(Exception):
                await self.link.close(1000)
        self._records.put_nowait(None)
        await asyncio.gather(recorder, return_exceptions=True)
        try:
            await self._finish()
        finally:
            await self._finish_tape()

    async def _open_first(self) -> bool:
        """The call's first model session; a refused one is tried again at once, within the
        call's reconnect budget (the caller hears the notice from the second)."""
        if await self._open_model():
            return True
        if self.deps.config.model_reconnects < 1:
            return False
        self._start_retried = True
        opened = await self._open_model()
        self._count_reconnect(opened)
        if opened:
            self.stats.model_reconnects += 1
        return opened

    def _count_reconnect(self, opened: bool) -> None:
        metrics().call_model_reconnects.labels(self._engine_name(), "reconnected" if opened else "failed").inc()

    def _engine_name(self) -> str:
        return ENGINE_LABELS.get(type(self.model).__name__, "other")

    async def _open_model(self) -> bool:
        assert self.model is not None
        stack = AsyncExitStack()
        within = self.deps.config.model_open_timeout  # each of the handshake and the configuration
        try:
            async with asyncio.timeout(within):
                conn = await stack.enter_async_context(self.model.connect())
            config = await self._config()  # the store's part is not the model's: not timed here
            async with asyncio.timeout(within):
                await conn.configure(config)
        except (RealtimeDisconnected, TimeoutError):
            await stack.aclose()
            log.warning("could not open the realtime model session (refused, dropped or too slow)")
            return False
        if self.tape is not None:
            conn = self.tape.wrap(conn)
        self._conn, self._conn_stack = conn, stack
        self._session_frames = self.stats.frames_to_model  # the new session's audio starts here
        if self._live is not None:
            self._live.opened()
            conn.deliver_audio_to(self._live.audio_now)
        else:
            conn.deliver_audio_to(self._audio_now)
        return True

    async def _deadline(self) -> None:
        await asyncio.sleep(self.deps.config.max_call_seconds)
        await self.begin_closing("max-duration", "The call has reached its time limit. Say goodbye in one sentence.")

    async def _notice_watch(self) -> None:
        await asyncio.sleep(self.deps.config.notice_timeout)
        self._timer_fired("notice")

    async def _closing_grace(self, reason: str) -> None:
        await asyncio.sleep(self.deps.config.closing_grace)
        self._timer_fired("grace")

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
                return self.feed_audio(media.media_payload(frame))
            if self.tape is not None:
                self.tape.frame_in(event, frame)
            if event == "mark":
                self._on_mark(media.mark_name(frame))
            elif event == "dtmf":
                self._profile.on_dtmf(media.dtmf_digit(frame))
            elif event == "stop":
                self._end("hangup")
            elif event not in ("connected", "start"):
                raise media.MalformedFrame("unknown event")
        except media.MalformedFrame:
            self.stats.frames_malformed += 1
            if self.tape is not None:
                self.tape.add("bad")
        return None

    def feed_audio(self, payload: str) -> Awaitable[None] | None:
        """One 20 ms frame of caller audio (base64 mu-law 8 kHz), as :meth:`feed` returns: a
        Twilio ``media`` frame's payload, or a browser call's audio (``voice.adapters.webrtc``)."""
        stats = self.stats
        stats.frames_in += 1
        timed = time.perf_counter() if stats.frames_in % SAMPLE_EVERY == 1 else 0.0
        if self.tape is not None:
            self.tape.audio_in(payload)
        if not self._listening:
            stats.frames_discarded += 1
            return None
        conn = self._conn
        if conn is None:
            stats.frames_dropped += 1
            return None
        try:
            if conn.append_audio_nowait(payload):
                stats.frames_to_model += 1
                if timed:
                    stats.caller_to_model_ms.append((time.perf_counter() - timed) * 1000)
                return None
        except RealtimeDisconnected:
            stats.frames_dropped += 1
            return None
        return self._append(conn, payload)

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
            if not self._listening:
                self._listening = True
                self._profile.on_listening()
        elif mark.kind == "commit":
            self._resolving.add(self.spawn("commit", self._commit(list(mark.write_ids))))
        elif mark.kind == "bye":
            self._end(self._closing or "end-call")
        elif mark.kind == "settle" and self._live is not None:
            self._live.on_settle_mark(mark)

    @staticmethod
    def _new_mark(kind: str, item_id: str | None = None, played_bytes: int = 0, turns: tuple[Any, ...] = ()) -> _Mark:
        return _Mark(kind, item_id, played_bytes, turns=turns)

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
        handle = self._live.on_event if self._live is not None else self._on_model
        while not self._ended.is_set():
            conn = self._conn
            assert conn is not None
            try:
                async for event in conn.events():
                    if self.tape is not None:
                        self.tape.model_event(event)
                    await handle(event)
                raise RealtimeDisconnected("the event stream ended")
            except RealtimeDisconnected as exc:
                if self._ended.is_set():
                    return
                if self.tape is not None and not isinstance(exc, RealtimeServerFailed):
                    self.tape.add("drop")
                log.warning("realtime model socket dropped mid-call: close_code=%s", getattr(exc, "close_code", None))
                if self._start_retried:
                    reconnects += 1  # the budget's first reconnect went on opening the call
                if reconnects >= self.deps.config.model_reconnects:
                    self._end("model-failed")
                    return
                opened = await self._reconnect()
                self._count_reconnect(opened)
                if not opened:
                    self._end("model-failed")
                    return
                reconnects += 1
                self._start_retried = False

    async def _reconnect(self) -> bool:
        old = self._conn_stack
        self._conn, self._conn_stack = None, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.aclose()
        self._generation += 1
        if self._live is not None:
            return await self._reconnect_live(self._live)
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
        if not self._listening and not notice_playing and not self._notice_sent:
            # Dropped while the model said the notice (or before it was asked): the new socket says
            # it. Pepper's own recording went to Twilio, not to the model: it plays on regardless.
            await self._request_response(_Request(self._notice_instructions(), notice=True))
        elif self._listening:
            await self._request_response(
                _Request("Apologise in a few words for the short interruption and carry on where you left off.")
            )
        return True

    async def _reconnect_live(self, live: LiveCall) -> bool:
        """A full-duplex model: the new session starts with the call so far as its history."""
        await live.dropped_model()
        live.flush_caller()
        if not await self._open_model():
            return False
        self.stats.model_reconnects += 1
        notice_playing = any(m.kind == "notice" and not m.cancelled for m in self._marks.values())
        if not self._listening and not notice_playing:
            await live.start()
        elif self._listening:
            say = "Apologise in a few words for the short interruption and carry on."
            await self.tell_model("The line dropped for a moment.", respond=True, instructions=say)
        return True

    def _play_notice(self, audio: bytes) -> None:
        """Pepper's recording of the notice straight to Twilio, then its mark: caller audio reaches
        the model only once the mark comes back. Sent once a call, whatever the model socket does."""
        self._notice_sent = True
        step = MARK_EVERY_BYTES
        frames = [media.media_frame(self._sid, base64.b64encode(audio[at : at + step]).decode())
                  for at in range(0, len(audio), step)]  # fmt: skip
        frames.append(self._mark_frame(_Mark("notice")))
        self.stats.audio_out_bytes += len(audio)
        self.link.send_many(frames)
        self.notice_heard_as_said()

    def notice_heard_as_said(self) -> None:
        """Pepper's own notice into the call's transcript and records, as the model's words would be."""
        self._on_model_nowait(AssistantTranscript("notice", "notice", self._profile.notice))

    def _notice_instructions(self) -> str:
        return f"Say exactly this, and nothing else: {self._profile.notice}"

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
        if self.tape is not None:
            self.tape.model_audio(event)
        if self._heard_at is not None:
            self._reply_audio(event)
        else:
            self._relay_audio(event)
        return True

    def _reply_audio(self, event: AudioDelta) -> None:
        """Audio after the caller stopped speaking: relayed, and the first of a reply timed (the
        model's part, Pepper's own relay)."""
        heard = self._heard_at
        arrived = time.perf_counter()
        self._relay_audio(event)
        if heard is None or event.response_id in self._cancelled_responses:
            return
        sent = time.perf_counter()
        self._heard_at = None
        stats = self.stats
        stats.model_ms.append((arrived - heard) * 1000)
        stats.relay_ms.append((sent - arrived) * 1000)
        stats.response_ms.append((sent - heard) * 1000)
        stats.reply_endpointing_ms.append(self._heard_endpointing)
        stats.reply_tool_ms.append(sum(stats.tool_ms[self._heard_tools :]))

    def _relay_audio(self, event: AudioDelta) -> None:
        if event.response_id in self._cancelled_responses:
            return
        self._relayed += 1
        timed = time.perf_counter() if self._relayed % SAMPLE_EVERY == 1 else 0.0
        payload = event.payload
        frame = self._media_head + payload + '"}}'  # media.media_frame, without the call
        size = len(payload) * 3 // 4 - payload.count("=", -2)  # media.decoded_length, likewise
        self.stats.audio_out_bytes += size
        item = event.item_id
        last = self._last_item
        if item != last and last is not None and self._sent_bytes.get(last, 0) > self._marked_bytes.get(last, 0):
            # A response may speak several items (a preamble, then the answer): the one before
            # this gets its final mark, so what of it played is known to its end.
            self._marked_bytes[last] = self._sent_bytes[last]
            self.link.send(self._mark_frame(_Mark("audio", last, self._sent_bytes[last])))
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
        if timed:
            self.stats.model_to_caller_ms.append((time.perf_counter() - timed) * 1000)

    async def _on_model(self, event: Any) -> None:
        if type(event) is AudioDelta:
            if self._heard_at is not None:
                self._reply_audio(event)
            else:
                self._relay_audio(event)
            if self.link.backed_up:
                await self.link.drained()
        elif type(event) is SpeechStarted:
            self._profile.on_speech_started(event.item_id)
            await self._barge_in()
        elif type(event) is SpeechStopped:
            self._heard_at = time.perf_counter()
            self._heard_endpointing, self._heard_tools = 0.0, len(self.stats.tool_ms)
            if event.audio_end_ms is not None:
                sent_ms = (self.stats.frames_to_model - self._session_frames) * FRAME_MS
                self._heard_endpointing = max(0.0, float(sent_ms - event.audio_end_ms))
                self.stats.endpointing_ms.append(self._heard_endpointing)
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
        elif type(event) is UserTranscript or type(event) is AssistantTranscript:
            self._on_model_nowait(event)
        elif type(event) is ModelErrorEvent:
            if event.server_side:
                raise RealtimeServerFailed(f"the model reported a server error: {event.code}")
            if event.code == "conversation_already_has_active_response":
                await self._refused_request()
            elif event.code not in ("response_cancel_not_active",):
                log.warning("realtime model reported an error: code=%s", event.code)

    def _on_model_nowait(self, event: UserTranscript | AssistantTranscript) -> None:
        """A transcript line: into the call's transcript and the profile's records."""
        if type(event) is UserTranscript:
            text = event.text.strip()
            if text:
                text = self._profile.caller_text(event.item_id, text)
                self.note("caller", text=text)
                self._records.put_nowait(("in", event.item_id, text))
                self._profile.on_caller_words(event.item_id, text)
        elif type(event) is AssistantTranscript:
            text = self._profile.pepper_text(event.text.strip())
            if text:
                interrupted = event.response_id in self._cancelled_responses
                self.note("pepper", text=text, interrupted=interrupted)
                self._records.put_nowait(("out", event.item_id, text + (" [interrupted]" if interrupted else "")))

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
                self.spawn("drop", self._resolve_writes(ids, commit=False, tell_model=True))
        if rid in self._tool_tasks:
            self.spawn("tool-results", self._finish_tools(rid, self._generation))
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
            # Every item the caller did not hear to its end (a response may speak several).
            for item in [i for i, sent in self._sent_bytes.items() if self._played_bytes.get(i, 0) < sent]:
                played_ms = self._played_bytes.get(item, 0) // media.BYTES_PER_MS
                await conn.truncate(item, played_ms)
                self._sent_bytes[item] = self._marked_bytes[item] = self._played_bytes.get(item, 0)
        except RealtimeDisconnected:
            pass  # the model loop reconnects
        if dropped:
            self.spawn("drop", self._resolve_writes(dropped, commit=False, tell_model=True))

    # --- Tools -------------------------------------------------------------------------------

    def _start_tool(self, event: FunctionCall) -> None:
        try:
            arguments = json.loads(event.arguments or "{}")
        except ValueError:
            arguments = event.arguments  # the runner reports it as not a JSON object
        call = ToolCall(event.call_id, event.name, arguments)
        if self.tape is not None:
            self.tape.add("otool", event.call_id, event.name)
        task = self.spawn(f"tool-{event.name}", self._run_tool(call))
        self._tool_tasks.setdefault(event.response_id, []).append(task)

    async def _run_tool(self, call: ToolCall) -> CallOutcome:
        profile = self._profile
        ctx = ToolContext(profile.session_context(), self.deps.db, self.deps.clock())
        visible = {t.name for t in profile.visible_tools()}
        work = asyncio.ensure_future(self._execute(ctx, call, visible))
        try:
            done, _ = await asyncio.wait({work}, timeout=self.deps.config.filler_after)
            if not done:
                await self._play_filler()
            outcome = await work
        finally:
            if not work.done():
                work.cancel()
        self._outcomes.append(outcome)
        self.stats.tool_ms.append(outcome.duration_ms)
        self._call_trust[call.id] = ctx.session.trust  # whose words its arguments are (core.memory.records)
        if outcome.write is not None and outcome.write.get("staged"):
            self._unconfirmed.append(int(outcome.write["id"]))
            self._write_summaries[int(outcome.write["id"])] = str(outcome.write.get("summary", ""))
        result = profile.tool_result(outcome)
        if self.tape is not None:
            self.tape.tool_done(result.as_record())
        return result

    async def _execute(self, ctx: ToolContext, call: ToolCall, visible: set[str]) -> CallOutcome:
        """Run one tool call through the profile's gate and the shared runner."""
        if self._outside is not None:
            return await self._outside.execute(ctx, call, visible)
        profile = self._profile
        return await run_call(profile.registry, profile.gate, ctx, call, visible=visible)

    async def _play_filler(self) -> None:
        if self.tape is not None:
            self.tape.add("fl")
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

    async def _commit(self, ids: list[int]) -> None:
        """The caller heard these writes confirmed: commit them in a task the end of the call does
        not cancel (``_finish`` waits for it)."""
        task = asyncio.get_running_loop().create_task(
            self._resolve_writes(ids, commit=True), name=f"call-{self._call.call_sid[-8:]}-commit-owned"
        )
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        await asyncio.shield(task)

    async def _resolve_writes(self, ids: list[int], *, commit: bool, tell_model: bool = False) -> None:
        if self.tape is not None:
            self.tape.add("ow", commit, ids)
        records = await self._settle_writes(ids, commit=commit)
        if self.tape is not None:
            self.tape.add("wd")  # the store answered (the replay waits for this point)
        self._resolved.extend(records)
        if tell_model and not commit and self._conn is not None:
            summaries = ", ".join(self._write_summaries.get(i, "a change") for i in ids)
            with contextlib.suppress(RealtimeDisconnected):
                await self._conn.add_note(
                    labelled(f"NOT saved, because the caller did not hear it confirmed: {summaries}."
                             " Ask again if they still want it.")
                )  # fmt: skip
        await self._profile.after_resolve(ids, commit=commit, records=records)

    async def _settle_writes(self, ids: list[int], *, commit: bool) -> list[dict[str, Any]]:
        """Commit or drop these staged writes of the call's turn: their records."""
        if self._outside is not None:
            return await self._outside.settle_writes(ids, commit=commit)
        assert self._turn_id is not None
        resolve = commit_writes if commit else drop_writes
        return [w.as_record() for w in await resolve(self.deps.db, self._profile.registry, self._turn_id, ids)]

    # --- Records -----------------------------------------------------------------------------

    async def _record_loop(self) -> None:
        """Hands transcript lines to the profile as they come, off the media path; the call so far
        is always kept."""
        while True:
            entry = await self._records.get()
            if entry is None:
                return
            direction, item_id, text = entry
            try:  # while the database restarts the lines wait here, in order; the audio does not
                await when_reachable(self._profile.record, direction, item_id, text, what="a transcript line")
            except Exception:
                log.exception("could not record a call transcript line")

    def summary(self) -> str:
        seconds = round(time.monotonic() - self._started)
        tools = sorted({o.call.name for o in self._outcomes if o.call.name not in SECRET_TOOLS})
        saved = [w["summary"] for w in self._resolved if w["status"] == "committed"]
        dropped = [w["summary"] for w in self._resolved if w["status"] == "dropped"]
        caller_lines = [e["text"] for e in self._transcript if e.get("role") == "caller" and e.get("text")]
        verified_by = self._profile.verified_by
        parts = [f"{self._profile.medium}, {seconds // 60} min {seconds % 60} s"]
        parts.append(f"caller verified ({verified_by})" if verified_by else "caller not verified")
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

    async def _finish_tape(self) -> None:
        """The last chunk of the recording, marked final, after every chunk before it."""
        if self._tape_writes:
            await asyncio.gather(*list(self._tape_writes), return_exceptions=True)
        last = self._write_tape(final=True)
        if last is not None:
            await last

    async def _finish(self) -> None:
        if self._outside is not None:
            await self._outside.finish()
            return
        if self._commits:  # a commit the hang-up interrupted: it finishes before the call is recorded
            await asyncio.gather(*list(self._commits), return_exceptions=True)
        db, turn_id, profile = self.deps.db, self._turn_id, self._profile
        if turn_id is None:
            return
        if self._live is not None:
            await self._live.finish()
        summary = ""
        try:  # each step retried through a database restart: the call's record is written once it is back
            dropped = await when_reachable(lambda: drop_turn_writes(db, profile.registry, turn_id),
                                           what="a call's staged writes")  # fmt: skip
            for write in dropped:
                self._resolved.append(write.as_record())
            summary = self.summary()
            calls = self._call_records()
            transcript = list(self._transcript)
            for record in calls:
                transcript.append({"role": "tool", "name": record["name"], "status": record["status"]})
            stats = self.stats.as_record() | profile.stats() | (self._live.stats() if self._live else {})
            finished_at = self.deps.clock()
            await when_reachable(lambda: update_turn(
                db,
                turn_id,
                status="failed" if self.end_reason in ("model-failed", "error") else "delivered",
                trust=self.trust,
                model=getattr(self.model, "model", None) or getattr(self.model, "name", None),
                session=profile.session_context().as_record() | {"verified_by": profile.verified_by},
                prompt={"notice": profile.notice},
                rounds=transcript,
                tool_calls=calls,
                gate_decisions=[
                    {"call_id": o.call.id, "name": o.call.name, **o.gate.as_record()} for o in self._outcomes if o.gate
                ],
                staged_writes=[r for r in self._resolved],
                committed_writes=[r for r in self._resolved if r["status"] == "committed"],
                timings={"total_ms": round((time.monotonic() - self._started) * 1000, 3)},
                delivery={"end_reason": self.end_reason, "stats": stats},
                reply=summary,
                finished_at=finished_at,
            ), what="a call's turn record")  # fmt: skip
            await when_reachable(lambda: call_records.call_completed(db, self._call.call_sid, reason=self.end_reason,
                                 summary=summary, verified_by=profile.verified_by, stats=stats),
                                 what="a call's record")  # fmt: skip
        except Exception:
            log.exception("could not record the end of a call")
        try:
            await profile.finish(summary or self.summary(), self.end_reason)
        except Exception:
            log.exception("could not finish a call's profile")
