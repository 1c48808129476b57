"""Deterministic replay of a recorded call (``pepper replay-call CALL``).

The recording (``voice.call_tape``) is run against this build's :class:`~voice.engine.CallEngine`:
the engine's own code for the frame path, marks, barge-in, responses, tools and staged writes,
with its outside replaced by the recording:

* the **model** is scripted: it gives the recorded events (audio as silence of the recorded
  sizes), drops where the model dropped, and takes whatever the engine sends;
* **Twilio** is the recorded frames (caller audio as silence, marks, keys, stop, hang-up);
* **tools** return their recorded results at the point they came back; nothing runs, and staged
  writes are neither committed nor dropped in the store (what the engine decided is compared);
* the **profile** is the recorded one: its instructions and tools as recorded, and what it asked
  of the engine (tell the model, reconfigure, close) at the recorded points; timers fire where
  they fired.

Each input is given once the replaying engine has produced as many outputs as the original had
before it (or has gone quiet), so the order of inputs and outputs is reproduced without
wall-clock timing. The outputs of both are then compared: what reached the model, frames to the
caller (audio, marks, clears), truncations, tools started and staged writes resolved. Nothing is
stored.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

from core.adapters.twilio import media_streams as media
from core.errors import InvalidInput
from core.models.types import ToolCall
from core.store.queries import Queries
from core.tools.context import TRUST_LEVELS, SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolContext, ToolOutcome, ToolRegistry
from core.tools.runner import CallOutcome
from voice.call_tape import RECORDED
from voice.deps import VoiceConfig, VoiceDeps
from voice.engine import CallEngine
from voice.profile import AdmittedCall, CallControls, CallProfile
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    Other,
    RealtimeDisconnected,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)

NEVER = 10.0**9  # a timer that never fires by itself in a replay: the recording says when it did
SPINS = 50  # event-loop turns with no new output before the replay gives the next input anyway
SILENCE = base64.b64encode(b"\xff" * 160).decode()  # one 20 ms frame of mu-law silence
_DROP = object()
_END = object()  # the recording is over: whatever still waits for it goes on


async def _next(queue: asyncio.Queue[Any]) -> Any:
    """The next thing the recording gives here; None once it is over."""
    item = await queue.get()
    if item is _END:
        queue.put_nowait(_END)  # for the next waiter too
        return None
    return item


@dataclass
class ReplayResult:
    call_sid: str
    complete: bool  # the recording had its final chunk
    identical: bool
    recorded_outputs: int
    replayed_outputs: int
    differences: list[str] = field(default_factory=list)
    replayed: list[list[Any]] = field(default_factory=list)  # the replay's own tape


# --- The scripted outside -------------------------------------------------------------------------


class _Connection:
    """The model as the recording has it: events from the driver's queue; sends go nowhere."""

    def __init__(self, queue: asyncio.Queue[Any]):
        self.queue = queue
        self.waiting = False

    async def configure(self, config: SessionConfig) -> None:
        return None

    async def append_audio(self, payload: str) -> None:
        return None

    def append_audio_nowait(self, payload: str) -> bool:
        return True

    def deliver_audio_to(self, sink: Callable[[AudioDelta], bool]) -> None:
        return None  # every event comes through events(), in order

    async def send_tool_output(self, call_id: str, output: str) -> None:
        return None

    async def add_note(self, text: str) -> None:
        return None

    async def create_response(self, instructions: str | None = None) -> None:
        return None

    async def cancel_response(self) -> None:
        return None

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        return None

    async def events(self) -> AsyncIterator[Any]:
        while True:
            self.waiting = True
            event = await self.queue.get()
            self.waiting = False
            if event is _DROP:
                raise RealtimeDisconnected("the recorded model dropped here")
            yield event


class _Model:
    name = "replay"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.conn: _Connection | None = None

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[_Connection]:
        self.conn = _Connection(self.queue)
        yield self.conn

    def connect(self) -> Any:
        return self._session()


class _Link:
    backed_up = False

    def send(self, text: str) -> None:
        return None

    def send_many(self, texts: Any) -> None:
        return None

    async def drained(self) -> None:
        return None

    async def close(self, code: int = 1000) -> None:
        return None


async def _nothing(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome.ok("")


class _Profile(CallProfile):
    """The recorded profile: its configurations in order; what it asked of the engine is replayed
    by the driver."""

    def __init__(self, header: dict[str, Any]):
        self.trust = header.get("trust", "unknown")
        self.route = header.get("route", "owner")
        self.medium = header.get("medium", "Phone call")
        self.notice = header.get("notice", "")
        self.registry = ToolRegistry()
        self.gate = Gate()
        self._account = _profile_account(header)
        self.configs: asyncio.Queue[Any] = asyncio.Queue()  # the driver puts each at its point
        self._tools: list[str] = []

    def attach(self, call: CallControls) -> None:
        return None

    def session_context(self) -> SessionContext:
        trust = self.trust if self.trust in TRUST_LEVELS else "owner_unverified"
        return SessionContext("call", trust, "voice", self._account)  # type: ignore[arg-type]

    def visible_tools(self) -> list[Tool]:
        return [Tool(name, "", {"type": "object"}, _nothing, area="replay") for name in self._tools]

    async def instructions(self) -> str:
        # The next configuration as recorded, once the recording reaches it: its instructions by
        # digest, its tools by name.
        entry = await _next(self.configs)
        if entry is None:
            return RECORDED + "none"
        self._tools = list(entry[3])
        return RECORDED + entry[2]

    async def record(self, direction: str, item_id: str, text: str) -> None:
        return None

    def caller_text(self, item_id: str, text: str) -> str:
        return text


class _Outside:
    """The engine's store and tools as the recording has them (``voice.engine.CallOutside``): a
    tool's result and the store's answer to staged writes come at their recorded points."""

    def __init__(self) -> None:
        self.results: dict[str, asyncio.Future[CallOutcome]] = {}
        self.settled: asyncio.Queue[Any] = asyncio.Queue()

    def result(self, call_id: str) -> asyncio.Future[CallOutcome]:
        return self.results.setdefault(call_id, asyncio.get_running_loop().create_future())

    async def open_records(self, engine: CallEngine) -> None:
        return None  # nothing is stored

    async def execute(self, ctx: ToolContext, call: ToolCall, visible: set[str]) -> CallOutcome:
        return await self.result(call.id)

    async def settle_writes(self, ids: list[int], *, commit: bool) -> list[dict[str, Any]]:
        await _next(self.settled)
        return []

    async def finish(self) -> None:
        return None


def _outcome(record: dict[str, Any]) -> CallOutcome:
    arguments = record.get("arguments") or {}
    return CallOutcome(
        ToolCall(record["id"], record["name"], arguments),
        record["status"],
        record["content"],
        record.get("gated_arguments", arguments),
        writes=bool(record.get("writes")),
        write=record.get("write"),
    )


def _model_events(entry: list[Any]) -> list[Any]:
    code = entry[0]
    if code == "ad":
        payload = base64.b64encode(b"\xff" * entry[4]).decode()
        return [AudioDelta(entry[2], entry[3], payload) for _ in range(entry[5])]
    if code == "ss":
        return [SpeechStarted(entry[2], entry[3])]
    if code == "se":
        return [SpeechStopped(entry[2])]
    if code == "rc":
        return [ResponseCreated(entry[2])]
    if code == "rd":
        return [ResponseDone(entry[2], entry[3], entry[4])]
    if code == "fc":
        return [FunctionCall(entry[2], entry[3], entry[4], entry[5])]
    if code == "ut":
        return [UserTranscript(entry[2], entry[3])]
    if code == "at":
        return [AssistantTranscript(entry[2], entry[3], entry[4])]
    if code == "er":
        return [ModelErrorEvent(entry[2], entry[3])]
    if code == "ox":
        return [Other(entry[2])]
    if code == "drop":
        return [_DROP]
    return []


def _marks_in(entry: list[Any]) -> list[Any]:
    """The audio marks sent inside a model-audio run, ``[relayed before it, name]`` (recordings
    of version 1 kept them as entries of their own)."""
    return entry[7] if len(entry) > 7 else []


MODEL_CODES = frozenset({"ad", "ss", "se", "rc", "rd", "fc", "ut", "at", "er", "ox", "drop"})


def _units(entry: list[Any]) -> int:
    """How many outputs an entry holds (an audio run counts its frames; model audio the frames it
    was relayed as); 0 for an input."""
    code = entry[0]
    if code == "ad":
        return int(entry[6]) + len(_marks_in(entry))
    if not code.startswith("o") or code in ("oa", "ox"):
        return 0
    return int(entry[3]) if code == "op" else 1


# --- Driving it -----------------------------------------------------------------------------------


async def replay_call(
    db: Queries, entries: list[list[Any]], *, complete: bool = True, change: Callable[[CallEngine], None] | None = None
) -> ReplayResult:
    """Replay a recording (``core.records.calls.load_recording``) on this build's engine and
    compare. ``change`` may alter the replaying engine first (a test's deliberate change)."""
    if not entries or entries[0][0] != "hdr":
        raise InvalidInput("not a call recording")
    header = entries[0][2]
    if header.get("version") not in (1, 2):
        raise InvalidInput(f"a call recording of version {header.get('version')}: this build reads versions 1 and 2")
    if header.get("full_duplex"):
        raise InvalidInput("this call ran on a full-duplex model (GPT-Live): replay covers turn-based engines")
    model = _Model()
    config = VoiceConfig(notice=header.get("notice", ""), max_call_seconds=NEVER, filler_after=NEVER,
                         notice_timeout=NEVER, closing_grace=NEVER, tape_flush_s=NEVER,
                         model_reconnects=int(header.get("model_reconnects", 1)))  # fmt: skip
    deps = VoiceDeps(db=db, model=model, registry=ToolRegistry(), gate=Gate(), config=config)  # type: ignore[arg-type]
    sid = str(header.get("stream_sid") or "MZreplay")
    call_sid = str(header.get("call_sid") or "")
    start = media.StreamStart(sid, f"replay:{call_sid}", "", {}, "audio/x-mulaw")
    admitted = AdmittedCall(f"replay:{call_sid}", _profile_account(header), None, None, None)
    profile = _Profile(header)
    outside = _Outside()
    engine = CallEngine(deps, _Link(), start, admitted, profile, outside=outside)
    if change is not None:
        change(engine)
    task = asyncio.get_running_loop().create_task(engine.run(), name="replay-call")
    try:
        await _drive(engine, model, profile, outside, entries)
        profile.configs.put_nowait(_END)
        outside.settled.put_nowait(_END)
        for future in outside.results.values():
            if not future.done():
                future.cancel()  # a tool the original never saw come back
        for _ in range(SPINS * 4):
            if task.done():
                break
            await asyncio.sleep(0)
        if not task.done():
            engine.end_reason = engine.end_reason or ("replay-ended" if complete else "recording-incomplete")
            engine._ended.set()
        await asyncio.wait_for(task, 10)
    finally:
        if not task.done():
            task.cancel()
    replayed = engine.tape.take()[1] if engine.tape is not None else []
    return compare(call_sid, entries, replayed, complete=complete)


def _profile_account(header: dict[str, Any]) -> UUID:
    return UUID(header["account_id"]) if header.get("account_id") else uuid4()


async def _drive(engine: CallEngine, model: _Model, profile: _Profile, outside: _Outside,
                 entries: list[list[Any]]) -> None:  # fmt: skip
    for _ in range(SPINS):
        if engine.tape is not None:
            break
        await asyncio.sleep(0)
    tape = engine.tape
    if tape is None:
        raise InvalidInput("the replaying engine did not start")
    # Entries counted (all before the last and before the model-audio run still open, which may
    # still grow), and their outputs.
    seen = [0, 0]

    def outputs() -> int:
        entries = tape.entries
        growing = tape.open_model_run()
        while seen[0] < len(entries) - 1 and entries[seen[0]] is not growing:
            seen[1] += _units(entries[seen[0]])
            seen[0] += 1
        return seen[1] + sum(_units(entry) for entry in entries[seen[0] :])

    before = 0  # the original's outputs before this entry
    for entry in entries[1:]:
        code = entry[0]
        if code.startswith("o") and code not in ("oa", "ox"):
            before += _units(entry)
            continue
        await _catch_up(outputs, before, model)
        await _give(engine, model, profile, outside, entry)
        if code == "ad":
            before += _units(entry)  # the frames it was relayed as came after it


async def _catch_up(outputs: Callable[[], int], target: int, model: _Model) -> None:
    """Until the replaying engine has made ``target`` outputs and its model loop waits, or nothing
    changes for SPINS turns of the event loop (it went another way: the comparison shows where)."""
    last, idle = -1, 0
    while idle < SPINS:
        count = outputs()
        quiet = model.conn is None or (model.conn.waiting and model.queue.empty())
        if count >= target and quiet:
            return
        idle = idle + 1 if count == last else 0
        last = count
        await asyncio.sleep(0)


async def _give(engine: CallEngine, model: _Model, profile: _Profile, outside: _Outside, entry: list[Any]) -> None:
    code = entry[0]
    sid = engine.start.stream_sid
    if code in MODEL_CODES:
        for event in _model_events(entry):
            model.queue.put_nowait(event)
    elif code == "a":
        for _ in range(entry[2]):
            pending = engine.feed_audio(SILENCE)
            if pending is not None:
                await pending
    elif code == "mk":
        for name in entry[2:]:  # one mark, or the audio marks echoed in a row
            engine.feed(json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": name}}))
    elif code == "dt":
        digit = "0" if entry[2] == "d" else entry[2]
        engine.feed(json.dumps({"event": "dtmf", "streamSid": sid, "dtmf": {"digit": digit}}))
    elif code == "stop":
        engine.feed(json.dumps({"event": "stop", "streamSid": sid}))
    elif code == "bad":
        engine.feed("{")
    elif code == "hup":
        engine.hang_up(entry[2])
    elif code == "td":
        record = entry[2]
        future = outside.result(record["id"])
        if not future.done():
            future.set_result(_outcome(record))
    elif code == "tmr":
        engine._timer_fired(entry[2])
    # What the profile or a timer asked of the engine ran in a task of its own (it may wait for a
    # later point of the recording, as the configuration it asks the profile for).
    elif code == "fl":
        engine.spawn("replay-filler", engine._play_filler())
    elif code == "cl":
        engine.spawn("replay-closing", engine.begin_closing(entry[2], entry[3]))
    elif code == "tm":
        engine.spawn("replay-note", engine.tell_model(entry[2], respond=bool(entry[3]), instructions=entry[4]))
    elif code == "rf":
        engine.spawn("replay-reconfigure", engine.reconfigure())
    elif code == "ra":
        engine.reconfigure_after_tools()
    elif code == "cf":
        profile.configs.put_nowait(entry)
    elif code == "wd":
        outside.settled.put_nowait(None)


# --- Comparing ------------------------------------------------------------------------------------

DESCRIBE = {
    "op": "audio to the caller", "om": "mark", "oc": "clear", "ocf": "configure", "ocr": "response.create",
    "ocx": "response.cancel", "otr": "truncate", "oto": "tool output", "on": "note to the model",
    "otool": "tool started", "ow": "staged writes", "oe": "end", "to_model": "caller audio to the model",
}  # fmt: skip


def outputs_of(entries: list[list[Any]]) -> list[tuple[tuple[Any, ...], float, str]]:
    """The outputs of a tape in order, runs merged: ``(output, t_ms, the input before it)``."""
    out: list[tuple[tuple[Any, ...], float, str]] = []
    last_input = "the start"
    for entry in entries:
        code = entry[0]
        if code == "a":
            if entry[5]:
                _merge(out, ("to_model",), entry[5], entry[1], last_input)
            last_input = f"{entry[2]} caller frames at {entry[1]} ms"
            continue
        if code == "oa":
            _merge(out, ("to_model",), 1, entry[1], last_input)
            continue
        if code == "op":
            _merge(out, ("op", entry[2]), entry[3], entry[1], last_input)
            continue
        if code == "ad":
            last_input = f"ad {json.dumps(entry[2:4])} at {entry[1]} ms"
            relayed = 0
            for before, name in _marks_in(entry):
                if before > relayed:
                    _merge(out, ("op", entry[4]), before - relayed, entry[1], last_input)
                    relayed = before
                out.append((("om", name), entry[1], last_input))
            if entry[6] > relayed:
                _merge(out, ("op", entry[4]), entry[6] - relayed, entry[1], last_input)
            continue
        if code.startswith("o") and code != "ox":
            args = tuple(json.dumps(a, sort_keys=True) if isinstance(a, list | dict) else a for a in entry[2:])
            out.append(((code, *args), entry[1], last_input))
            continue
        if code not in ("hdr", "cf", "wd"):
            last_input = f"{code} {json.dumps(entry[2:])[:60]} at {entry[1]} ms"
    return _caller_audio_first(out)


def _streaming(output: tuple[Any, ...]) -> bool:
    """Outputs of a streaming stretch: caller audio to the model, audio to the caller, audio marks."""
    return output[0] in ("to_model", "op") or (output[0] == "om" and str(output[1])[:1] == "a")


def _caller_audio_first(out: list[Any]) -> list[Any]:
    """Each stretch of streaming outputs with the caller's audio to the model counted once, at its
    start: a caller frame and the model's audio do not depend on each other, so where a run of
    one was cut by the other is not behaviour (the tape keeps the caller's run open across the
    model's audio; recordings of version 1 cut it at each audio mark echoed)."""
    result: list[Any] = []
    stretch: list[Any] = []

    def close() -> None:
        to_model = [o for o in stretch if o[0][0] == "to_model"]
        if to_model:
            result.append((("to_model", sum(o[0][1] for o in to_model)), to_model[0][1], to_model[0][2]))
        for o in stretch:
            if o[0][0] == "op":
                _merge(result, o[0][:2], o[0][2], o[1], o[2])
            elif o[0][0] != "to_model":
                result.append(o)
        stretch.clear()

    for o in out:
        if _streaming(o[0]):
            stretch.append(o)
        else:
            close()
            result.append(o)
    close()
    return result


def _merge(out: list[Any], key: tuple[Any, ...], n: int, t: float, before: str) -> None:
    if out and out[-1][0][: len(key)] == key and len(out[-1][0]) == len(key) + 1:
        prev = out[-1]
        out[-1] = ((*key, prev[0][-1] + n), prev[1], prev[2])
    else:
        out.append(((*key, n), t, before))


def _say(output: tuple[Any, ...]) -> str:
    return f"{DESCRIBE.get(output[0], output[0])} {' '.join(str(a) for a in output[1:])}".strip()


def compare(call_sid: str, recorded: list[list[Any]], replayed: list[list[Any]], *, complete: bool) -> ReplayResult:
    old, new = outputs_of(recorded), outputs_of(replayed)
    a, b = [o[0] for o in old], [o[0] for o in new]
    differences: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        at = old[i1] if i1 < len(old) else (old[-1] if old else ((), 0.0, "the start"))
        where = f"at {at[1]} ms (after {at[2]})"
        was = "; ".join(_say(x) for x in a[i1:i2]) or "nothing"
        now = "; ".join(_say(x) for x in b[j1:j2]) or "nothing"
        differences.append(f"{where}: recorded {was} | replay {now}")
    return ReplayResult(call_sid, complete, not differences, sum(1 for _ in a), sum(1 for _ in b), differences,
                        replayed)  # fmt: skip
