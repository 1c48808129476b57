"""A call's recording for deterministic replay (``pepper replay-call``, ``voice.replay_call``).

The tape keeps, in arrival order, everything that reached the call engine from outside and
everything the engine did about it, compactly (no audio: sizes, counts and a CRC-32 of the
caller's frames):

* **inputs**: Twilio's side (caller audio as runs of frames, marks echoed, keypad presses with the
  digit withheld, stop, hang-up), the model's events (audio deltas as runs of equal size,
  transcripts with digits withheld, function calls with a secret tool's arguments withheld,
  responses, errors, drops), each tool's result as the model got it, the timers that fired and
  what the profile asked of the engine (tell the model, reconfigure, close);
* **outputs**: frames to the caller (audio as runs, marks, clears), what reached the model
  (configure, response.create, cancel, truncate, tool outputs, notes; caller audio is counted on
  its run), the tools started, and staged writes committed or dropped.

Entries are short lists ``[code, t_ms, ...]`` (t: ms since the call started); output codes begin
with ``o``. While a reply streams, a call takes three entries, not one per frame or per mark: the
caller's audio run, the model's audio run (with the audio marks sent inside it, each at the count
of frames relayed before it: ``[relayed, name]``) and the audio marks the caller echoed (one
entry, by name). Both runs stay open across the audio marks, sent and echoed, since an audio mark
changes nothing for a caller frame or a model delta (it only says how much of an item played,
which barge-in reads, and barge-in is an entry of its own, after them). Recording costs the frame
path a counter, one CRC-32 and no allocation per frame (:meth:`CallTape.audio_in`); entries are
written in chunks (every ``flush_s`` and at the end) by the engine's recorder, off the frame
path. Each chunk is its own row, so a process that dies mid-call leaves every chunk written so
far readable, and no ``final`` chunk: the recording is then marked incomplete.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from core.adapters.twilio import media_streams as media
from core.records import calls as call_records
from core.store import when_reachable
from core.store.queries import Queries
from voice.profile import withhold_digits
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    RealtimeConnection,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)

log = logging.getLogger(__name__)

VERSION = 2  # 1: a mark sent or echoed was an entry of its own; replay reads both
# Arguments never written to records: a PIN or code the caller gave (as voice.engine.SECRET_TOOLS).
_SECRET = frozenset({"verify_pin", "check_code"})
# The fixed parts of an outgoing media frame (voice.engine sends media.media_frame(sid, payload)).
_MEDIA_HEAD = '{"event":"media"'
_MEDIA_TAIL = len('"}}')


# Instructions a replay stands in with: the recorded digest itself (voice.replay_call).
RECORDED = "\x00recorded instructions "


def digest(text: str) -> str:
    if text.startswith(RECORDED):
        return text[len(RECORDED) :]
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


class CallTape:
    """One call's recording, in memory until :meth:`take` hands the new entries to be written.

    Times are kept as raw ``perf_counter`` readings and made ms since the start in :meth:`take`,
    off the frame path. A run of model audio (``_model``) grows across the caller's audio and the
    audio marks, sent (kept in the run, where they were sent) and echoed; a run of caller audio
    (``_caller``) also across the model's audio, its relay and every mark sent. Any other entry
    ends both (a mark sent, other than an audio mark inside a model run, ends only the model's)."""

    __slots__ = ("_caller", "_echoes", "_media_overhead", "_model", "_seq", "_t0", "entries")

    def __init__(self, header: dict[str, Any]):
        self._t0 = time.perf_counter()
        self.entries: list[list[Any]] = [["hdr", self._t0, {"version": VERSION, **header}]]
        self._seq = 0  # chunks taken so far
        self._caller: list[Any] | None = None  # the caller-audio run still open
        self._model: list[Any] | None = None  # the model-audio run still open
        self._echoes: list[Any] | None = None  # the audio marks echoed since the last other entry
        # An outgoing media frame's length beyond its base64 payload (voice.engine sends media.media_frame).
        self._media_overhead = len(media.media_frame(str(header.get("stream_sid", "")), ""))

    def add(self, *entry: Any) -> None:
        if entry[0] != "om":
            self._caller = None
        self._model = self._echoes = None
        self.entries.append([entry[0], time.perf_counter(), *entry[1:]])

    # --- The frame path ------------------------------------------------------------------------

    def audio_in(self, payload: str) -> None:
        """One caller frame: ``["a", t, frames, crc, t_last, to_model]``."""
        run = self._caller
        if run is not None:
            run[2] += 1
            run[3] = zlib.crc32(payload.encode(), run[3])
            run[4] = time.perf_counter()
        else:
            now = time.perf_counter()
            self._caller = run = ["a", now, 1, zlib.crc32(payload.encode()), now, 0]
            self.entries.append(run)
            self._echoes = None  # echoes after this run are a new entry (their order with it is kept)

    def to_model(self) -> None:
        """The frame just fed reached the model (counted on its run)."""
        if self._caller is not None:
            self._caller[5] += 1
        else:
            self.add("oa")

    def model_audio(self, event: AudioDelta) -> None:
        """``["ad", t, response, item, bytes, deltas, relayed, marks]``: equal deltas of one item
        run together, with how many were relayed to the caller as they came (outputs) and the
        audio marks sent among them (``[relayed before it, name]``)."""
        payload = event.payload
        size = len(payload) * 3 // 4 - payload.count("=", -2)  # as media.decoded_length
        run = self._model
        if run is not None and run[4] == size and run[3] == event.item_id and run[2] == event.response_id:
            run[5] += 1
            return
        self._model = run = ["ad", time.perf_counter(), event.response_id, event.item_id, size, 1, 0, []]
        self.entries.append(run)
        self._echoes = None

    def sent(self, text: str) -> None:
        """A frame to the caller: audio counted on the model audio it relays, else
        ``["op", t, bytes, frames]``; a mark or a clear (``{"event":"media"``, ``{"event":"mark"``,
        ``{"event":"clear"``)."""
        kind = text[11]
        if kind == "e":
            end = len(text)
            encoded = end - self._media_overhead
            size = encoded * 3 // 4 - text.count("=", end - 5, end - 3)  # as media.decoded_length
            run = self._model
            if run is not None and run[4] == size and run[6] < run[5]:
                run[6] += 1
                return
            self._model = self._echoes = None
            entries = self.entries
            if entries and (last := entries[-1])[0] == "op" and last[2] == size:
                last[3] += 1
            else:
                entries.append(["op", time.perf_counter(), size, 1])
        elif kind == "a":
            name = text[text.rindex('"name":"') + 8 : -3]
            run = self._model
            if run is not None and name[0] == "a":
                run[7].append([run[6], name])
            else:
                self.add("om", name)
        else:
            self.add("oc")

    def mark_echoed(self, name: str) -> None:
        """A mark Twilio echoed: an audio mark (``a…``) joins the echoes entry ``["mk", t, name,
        ...]`` and leaves the runs open; any other mark is an entry of its own."""
        if name[:1] != "a":
            self.add("mk", name)
            return
        echoes = self._echoes
        if echoes is not None:
            echoes.append(name)
        else:
            self._echoes = echoes = ["mk", time.perf_counter(), name]
            self.entries.append(echoes)

    def open_model_run(self) -> list[Any] | None:
        """The model-audio run that may still grow (it need not be the last entry)."""
        return self._model

    # --- The rest ------------------------------------------------------------------------------

    def frame_in(self, event: str, frame: dict[str, Any]) -> None:
        if event == "mark":
            self.mark_echoed(media.mark_name(frame))
        elif event == "dtmf":
            digit = media.dtmf_digit(frame)
            self.add("dt", digit if digit in "#*" else "d")  # the digit itself is withheld
        elif event == "stop":
            self.add("stop")

    def model_event(self, event: Any) -> None:
        kind = type(event)
        if kind is AudioDelta:
            self.model_audio(event)
        elif kind is SpeechStarted:
            self.add("ss", event.item_id, event.audio_start_ms)
        elif kind is SpeechStopped:
            self.add("se", event.item_id)
        elif kind is ResponseCreated:
            self.add("rc", event.response_id)
        elif kind is ResponseDone:
            self.add("rd", event.response_id, event.status, event.function_calls)
        elif kind is FunctionCall:
            arguments = '{"digits": "[withheld]"}' if event.name in _SECRET else event.arguments
            self.add("fc", event.response_id, event.call_id, event.name, arguments)
        elif kind is UserTranscript:
            self.add("ut", event.item_id, withhold_digits(event.text))
        elif kind is AssistantTranscript:
            self.add("at", event.response_id, event.item_id, event.text)
        elif kind is ModelErrorEvent:
            self.add("er", event.code, event.message[:200])
        else:
            self.add("ox", type(event).__name__)

    def tool_done(self, record: dict[str, Any]) -> None:
        if record.get("name") in _SECRET:
            record = record | {"arguments": {"digits": "[withheld]"}}
            record.pop("gated_arguments", None)
        self.add("td", record)

    def config(self, config: SessionConfig) -> None:
        self.add("cf", digest(config.instructions), [t.name for t in config.tools])

    def wrap(self, conn: RealtimeConnection) -> RealtimeConnection:
        return TapedConnection(conn, self)

    def wrap_link(self, link: Any) -> Any:
        return TapedLink(link, self)

    def take(self) -> tuple[int, list[list[Any]]]:
        """The entries added since the last take (times made ms since the start), and their
        chunk number."""
        taken, self.entries = self.entries, []
        self._caller = self._model = self._echoes = None
        t0 = self._t0
        for entry in taken:
            entry[1] = round((entry[1] - t0) * 1000, 1)
            if entry[0] == "a":
                entry[4] = round((entry[4] - t0) * 1000, 1)
        seq = self._seq
        self._seq += 1
        return seq, taken


class TapeWriter:
    """The chunks of every call's recording written together: those handed in within ``batch_s``
    go in one statement (``call_records.store_recordings``), so 400 calls flushing every 5 s make
    a few writes a second, not 80 round trips and commits, on the core that relays their audio.
    :meth:`write` returns once its chunk's batch is written; a failed batch is logged, not raised
    (the calls go on; their recordings read as incomplete)."""

    def __init__(self, db: Queries, batch_s: float = 0.25):
        self._db = db
        self._batch_s = batch_s
        self._chunks: list[call_records.Chunk] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's
        self._writes: set[asyncio.Task[None]] = set()

    async def write(self, call_sid: str, account_id: UUID | None, seq: int, entries: list[list[Any]],
                    *, final: bool, stream_sid: str = "") -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (the old one closed with a batch due: it is gone with it)
            self._chunks, self._waiting, self._timer, self._loop = [], [], None, loop
        done = loop.create_future()
        self._chunks.append((call_sid, stream_sid, seq, account_id, call_records.recording_chunk(entries), final))
        self._waiting.append(done)
        if self._timer is None:
            self._timer = loop.call_later(self._batch_s, self._flush)
        await asyncio.shield(done)  # a caller cancelled meanwhile leaves the batch to the others

    def _flush(self) -> None:
        self._timer = None
        chunks, waiting, self._chunks, self._waiting = self._chunks, self._waiting, [], []
        task = asyncio.get_running_loop().create_task(self._store(chunks, waiting), name="tape-chunks")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store(self, chunks: list[call_records.Chunk], waiting: list[asyncio.Future[None]]) -> None:
        try:  # each chunk is written once (a repeat changes nothing): retried through a database restart
            await when_reachable(call_records.store_recordings, self._db, chunks, what="recording chunks")
        except Exception:
            log.exception("could not store chunks of calls' recordings")
        finally:
            for done in waiting:
                if not done.done():
                    done.set_result(None)


class TapedConnection:
    """A model connection whose calls go on the tape as outputs (the model's events are taped by
    the engine's loop, which also sees those delivered to its audio sink)."""

    def __init__(self, conn: RealtimeConnection, tape: CallTape):
        self._conn = conn
        self._tape = tape

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)  # an adapter's own extras (break_output, append_context)

    async def configure(self, config: SessionConfig) -> None:
        self._tape.add("ocf", digest(config.instructions), [t.name for t in config.tools])
        await self._conn.configure(config)

    async def append_audio(self, payload: str) -> None:
        self._tape.to_model()
        await self._conn.append_audio(payload)

    def append_audio_nowait(self, payload: str) -> bool:
        if self._conn.append_audio_nowait(payload):
            run = self._tape._caller
            if run is not None:
                run[5] += 1
            else:
                self._tape.to_model()
            return True
        return False

    def deliver_audio_to(self, sink: Callable[[AudioDelta], bool]) -> None:
        self._conn.deliver_audio_to(sink)  # the engine's sink tapes what it takes

    async def send_tool_output(self, call_id: str, output: str) -> None:
        self._tape.add("oto", call_id, crc(output))
        await self._conn.send_tool_output(call_id, output)

    async def add_note(self, text: str) -> None:
        self._tape.add("on", crc(text))
        await self._conn.add_note(text)

    async def create_response(self, instructions: str | None = None) -> None:
        self._tape.add("ocr", None if instructions is None else instructions[:80])
        await self._conn.create_response(instructions)

    async def cancel_response(self) -> None:
        self._tape.add("ocx")
        await self._conn.cancel_response()

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self._tape.add("otr", item_id, audio_end_ms)
        await self._conn.truncate(item_id, audio_end_ms)

    def events(self) -> Any:
        return self._conn.events()


class TapedLink:
    """The media socket (``voice.engine.TwilioLink``) with every frame sent going on the tape."""

    def __init__(self, link: Any, tape: CallTape):
        self._link = link
        self._tape = tape

    @property
    def backed_up(self) -> bool:
        return bool(self._link.backed_up)

    def send(self, text: str) -> None:
        self._tape.sent(text)
        self._link.send(text)

    def send_many(self, texts: Sequence[str]) -> None:
        for text in texts:
            self._tape.sent(text)
        self._link.send_many(texts)

    async def drained(self) -> None:
        await self._link.drained()

    async def close(self, code: int = 1000) -> None:
        await self._link.close(code)
