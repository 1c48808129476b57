"""A call on a full-duplex model (GPT-Live): the call engine's model side when the model decides
itself when to speak and holds no tools.

The engine still relays the audio both ways (the same hot path), keeps the marks, the records
and the profile; this module replaces what is response-based there:

* **Opening.** The notice is Pepper's own recording (``voice.notice``) played as the session's
  audio fixture (``session.output_audio.fixture.play``: the model's speech is interrupted and its
  input muted while it plays); without a recording it is asked for as the session's first
  commentary ("say exactly"). The first stretch of output is the notice, it ends at
  ``…fixture.played``, and caller audio reaches the model only once the Twilio mark after it came
  back. A drop before the fixture finished plays it again on the new session.
* **Delegation.** On ``session.delegation.created`` (metadata only) the task is what the caller
  said since the previous delegation, up to its ``offset_ms`` (from the raw input transcript kept
  here, never recorded with its digits). It runs as a **Pepper turn** of the call's session kind
  (``VoiceDeps.delegate``: the text harness, its gate, the restricted tool set before proof, the
  owner session after it, staged writes, records, round and time caps). The reply goes back as
  commentary for that delegation id, in ~500-token chunks. Several may run at once; a barge-in
  does not cancel them.
* **The PIN is never the model's.** Keypad digits go to the profile's verifier as on every engine.
  A delegation whose words hold a run of digits from a caller not yet verified is a verify task:
  the digits go to the profile's verifier and the model gets only "verified" or "not verified".
  Later delegations run in the owner session, on the same model session.
* **Staged writes** of a delegated turn are committed on the mark after the stretch of speech that
  followed the result (the caller heard the confirmation); a barge-in during it, a drop of the
  model or the end of the call drops them, and the model is told.
* **Barge-in.** The model stops itself; when the caller's words arrive while Pepper's audio is
  still queued at Twilio, Pepper sends ``clear``, cancels the marks of what was not played, and
  drops what that speech was confirming.
* **Drops** reconnect with the transcript so far as the new session's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from core.adapters.twilio import media_streams as media
from core.persona import NEVER_PRETEND, runtime_note_rule
from core.tools.context import SessionKind, Trust
from core.untrusted import CALLER_LABEL, neutralise_labels, quoted
from voice.notice import fixture_pcm
from voice.profile import labelled, spoken_digits, withhold_digits
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    Delegated,
    ModelErrorEvent,
    Other,
    RealtimeDisconnected,
    RealtimeServerFailed,
    SessionConfig,
    TranscriptFragment,
    UserTranscript,
)

log = logging.getLogger(__name__)

FRONT = f"""You are the voice of Pepper, a personal assistant, on a phone call. Speak briefly and
naturally: one or two short sentences at a time, no lists. {NEVER_PRETEND}
You have no tools and no memory of your own: delegate every request to look something up, to change
something, and every PIN or code the caller says, and tell the caller what the delegated result
says. Never judge a PIN or code yourself and never repeat one aloud. Before saying a change was
made, say it as the result states it, in one sentence. {runtime_note_rule("caller")}"""

VERIFIED = "verified"
NOT_VERIFIED = "not verified"
# How often the end of the model's speech is looked for (it has no done event).
WATCH_S = 0.05
# A result with staged writes that no speech followed within this long is dropped.
CONFIRM_WITHIN_S = 20.0


@dataclass(frozen=True)
class DelegatedTask:
    """A delegated task as Pepper runs it: ``text`` is what the model is asked for (the caller's
    words, labelled as theirs when they have not proved who they are), for the account's person at
    ``trust``, as a turn of session kind ``kind``."""

    account_id: UUID
    text: str
    trust: Trust
    kind: SessionKind = "call"


@dataclass(frozen=True)
class DelegatedResult:
    reply: str
    turn_id: UUID | None
    staged_writes: int = 0
    status: str = "replied"


Delegate = Callable[[DelegatedTask], Awaitable[DelegatedResult]]
# Commit (True) or drop (False) a delegated turn's staged writes: their records.
Settle = Callable[[UUID, bool], Awaitable[list[dict[str, Any]]]]


@dataclass
class _Pending:
    """A delegated turn whose staged writes wait for the caller to hear them confirmed."""

    turn_id: UUID
    delegation_id: str
    event_ids: tuple[str, ...]
    at: float = field(default_factory=time.monotonic)
    segment: str | None = None  # the speech that says it
    acked_at: float | None = None  # when the last of its commentary reached the model's timeline


class LiveCall:
    """The model side of one call on a full-duplex model; ``engine`` is the call's
    :class:`voice.engine.CallEngine` (its marks, link, transcript and profile)."""

    def __init__(self, engine: Any):
        self.e = engine
        self._caller: list[TranscriptFragment] = []  # the raw input transcript, digits and all
        self._taken = 0  # fragments already handed to a delegation
        self._utterance: list[str] = []
        self._utterance_id: str | None = None
        self._utterances = 0
        self._pepper: dict[str, list[str]] = {}
        self._seen: set[str] = set()
        self._segment: str | None = None  # the stretch of model speech playing now
        self._segment_ms = 0  # when it began, on the session's timeline
        self._last_audio = 0.0
        self._notice_asked = False
        self._notice_segment: str | None = None
        self._fixture: str | None = None  # the event id of the notice's fixture.play, until it played
        self._notice_noted = False
        self._transcribed = 0  # stretches of speech known only from the transcript (SIP direct)
        self._waiting: dict[str, _Pending] = {}  # by the event id of its commentary
        self._acks: dict[str, float] = {}  # commentary acknowledged before its pending was known
        self._pending: list[_Pending] = []
        self._segment_at = 0.0
        self._t0 = time.monotonic()
        self._usage_done = 0.0  # billable seconds of earlier sessions of this call
        self._usage = 0.0
        self.delegation_ms: list[float] = []
        self._results: list[str] = []
        self.duplicates = 0
        self.malformed = 0

    # --- The session ---------------------------------------------------------------------------

    def config(self) -> SessionConfig:
        history: list[tuple[str, str]] = []
        said = [e for e in self.e.transcript if e.get("text")]
        if said or self._results:
            history.append(("developer", "The line to the model dropped; this is the call so far. Carry on."))
            for entry in said[-60:]:
                role = "assistant" if entry["role"] == "pepper" else "user"
                history.append((role, neutralise_labels(str(entry["text"]))))
        if self._results:
            # What earlier tasks came back with, said or not yet said when the line dropped.
            history.append(("developer", "Results of tasks delegated earlier on this call:\n" + "\n".join(
                self._results[-10:])))  # fmt: skip
        return SessionConfig(FRONT, (), voice=self.e.deps.config.voice, history=tuple(history))

    def opened(self) -> None:
        self._t0 = time.monotonic()

    async def start(self) -> None:
        """Play the notice (the session's first words): Pepper's recording as the audio fixture,
        else asked of the model."""
        self._notice_asked = True
        conn, audio = self.e._conn, self.e.notice_mulaw
        play = getattr(conn, "play_fixture", None)
        if audio and play is not None:
            self._fixture = await play(fixture_pcm(audio))
            if not self._notice_noted:
                self._notice_noted = True
                self.e.notice_heard_as_said()
            return
        await conn.create_response(self.e._notice_instructions())

    def now_ms(self) -> int:
        return round((time.monotonic() - self._t0) * 1000)

    @property
    def usage_seconds(self) -> float:
        return self._usage_done + self._usage

    def stats(self) -> dict[str, Any]:
        return {"live_seconds": self.usage_seconds, "delegations": len(self.delegation_ms),
                "delegation_ms": [round(v, 3) for v in self.delegation_ms],
                "delegations_duplicate": self.duplicates, "live_malformed": self.malformed}  # fmt: skip

    # --- Model -> caller -----------------------------------------------------------------------

    def audio_now(self, event: AudioDelta) -> bool:
        """The adapter's read callback (``deliver_audio_to``), as the engine's own."""
        if self.e.link.backed_up:
            return False
        self._audio(event)
        return True

    def _audio(self, event: AudioDelta) -> None:
        if event.item_id != self._segment:
            if event.item_id in self.e._cancelled_responses:
                return  # the rest of speech the caller talked over
            self._begin_segment(event.item_id)
        self._last_audio = time.monotonic()
        self.e._relay_audio(event)

    def _begin_segment(self, item: str) -> None:
        if self._segment is not None:
            self._end_segment()
        self._segment, self._segment_ms, self._segment_at = item, self.now_ms(), time.monotonic()
        if self._notice_asked and self._notice_segment is None and not self.e.listening:
            self._notice_segment = item
        for pending in self._pending:
            if pending.segment is None and pending.acked_at is not None:
                pending.segment = item  # its commentary reached the timeline: this speech says it

    def _end_segment(self) -> None:
        item, self._segment = self._segment, None
        if item is None:
            return
        e = self.e
        sent = e._sent_bytes.get(item, 0)
        if sent > e._marked_bytes.get(item, 0):
            e._marked_bytes[item] = sent
            e._send_mark(e._new_mark("audio", item, sent))
        if item == self._notice_segment and not e.listening:
            e._send_mark(e._new_mark("notice"))
        words = "".join(self._pepper.pop(item, ())).strip()
        if words:
            e._on_model_nowait(AssistantTranscript(item, item, words))
        heard = [p for p in self._pending if p.segment == item]
        if heard:
            self._pending = [p for p in self._pending if p.segment != item]
            e._send_mark(e._new_mark("settle", turns=tuple(heard)))

    async def watch(self) -> None:
        """Ends a stretch of model speech once its audio pauses; drops confirmations never spoken."""
        while True:
            await asyncio.sleep(WATCH_S)
            if self._segment is not None and time.monotonic() - self._last_audio > WATCH_S * 6:
                self._end_segment()
            now = time.monotonic()
            stale = [p for p in self._pending if p.segment is None and now - p.at > CONFIRM_WITHIN_S]
            if stale:
                self._pending = [p for p in self._pending if p not in stale]
                await self._drop(stale)

    # --- Events --------------------------------------------------------------------------------

    async def on_event(self, event: Any) -> None:
        kind = type(event)
        if kind is AudioDelta:
            self._audio(event)
            if self.e.link.backed_up:
                await self.e.link.drained()
        elif kind is TranscriptFragment:
            if event.role == "caller":
                await self._caller_words(event)
            else:
                if getattr(self.e.link, "audio_free", False):
                    # SIP direct: no audio reaches Pepper; the model's transcript marks its speech.
                    if self._segment is None:
                        self._transcribed += 1
                        self._begin_segment(f"t{self._transcribed}")
                    self._last_audio = time.monotonic()
                if self._segment is not None:
                    self._pepper.setdefault(self._segment, []).append(event.text)
        elif kind is Delegated:
            if event.delegation_id in self._seen:
                self.duplicates += 1
                return
            self._seen.add(event.delegation_id)
            self.e.spawn("delegation", self._delegation(event, self.e._generation))
        elif kind is ModelErrorEvent:
            log.warning("GPT-Live reported an error: code=%s", event.code)
            if event.server_side:
                raise RealtimeServerFailed(f"GPT-Live reported a server error: {event.code}")
        elif kind is Other:
            self._other(event)

    def _other(self, event: Other) -> None:
        data = event.data
        if event.type == "session.output_audio.fixture.played" and self._fixture is not None:
            if data.get("client_event_id") in (None, self._fixture):
                # The notice drained from the model's mixer: its speech ends here, whatever follows.
                self._fixture = None
                heard = self._notice_segment is not None
                self._end_segment()
                if not heard and not self.e.listening:
                    self.e._send_mark(self.e._new_mark("notice"))  # no audio came through Pepper (SIP direct)
                if self.e._conn is not None:
                    self.e._conn.break_output()
        elif event.type == "session.commentary.appended":
            ident = str(data.get("client_event_id") or "")
            pending = self._waiting.pop(ident, None)
            if pending is None:
                if len(self._acks) > 256:
                    self._acks.clear()  # acknowledgements of notes no write waits on
                self._acks[ident] = time.monotonic()
            elif not any(i in self._waiting for i in pending.event_ids):
                pending.acked_at = time.monotonic()
        elif event.type == "session.closed" and data.get("reason") == "remote_hangup":
            self.e._end("hangup")  # SIP direct: the caller hung up
        elif event.type == "session.usage.updated":
            usage = data.get("usage")
            seconds = usage.get("seconds") if isinstance(usage, dict) else None
            if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= self._usage:
                self._usage = float(seconds)  # cumulative for the session: never summed
        elif event.type == "malformed":
            self.malformed += 1

    async def _caller_words(self, fragment: TranscriptFragment) -> None:
        e = self.e
        if not e.listening:
            return  # words from before the notice played: not the caller's turn yet
        self._caller.append(fragment)
        if self._utterance_id is None:
            self._utterances += 1
            self._utterance_id = f"in{self._utterances}"
            e._profile.on_speech_started(self._utterance_id)
        self._utterance.append(fragment.text)
        if self._talked_over(fragment):
            await self._barge_in()

    def _talked_over(self, fragment: TranscriptFragment) -> bool:
        e = self.e
        playing = self._segment is not None or any(
            not m.cancelled and m.kind in ("audio", "settle") for m in e._marks.values()
        )
        return playing and fragment.end_ms >= self._segment_ms

    def flush_caller(self) -> None:
        """The caller's words so far become one transcript line (GPT-Live has no turns)."""
        item, words = self._utterance_id, "".join(self._utterance).strip()
        self._utterance, self._utterance_id = [], None
        if item is not None and words:
            self.e._on_model_nowait(UserTranscript(item, words))

    async def _barge_in(self) -> None:
        e = self.e
        started = time.perf_counter()
        e.link.send(media.clear_frame(e._sid))
        e.stats.clear_ms.append((time.perf_counter() - started) * 1000)
        e.stats.barge_ins += 1
        if self._segment is not None:
            e._cancelled_responses.add(self._segment)
            e._sent_bytes[self._segment] = e._marked_bytes[self._segment] = e._played_bytes.get(self._segment, 0)
            self._pepper.pop(self._segment, None)
        item, self._segment = self._segment, None
        if e._conn is not None:
            e._conn.break_output()  # what the model says next is new speech, not the rest of this
        dropped: list[_Pending] = [p for p in self._pending if p.segment is not None and p.segment == item]
        for mark in list(e._marks.values()):
            if not mark.cancelled and mark.kind in ("audio", "settle"):
                mark.cancelled = True
                dropped.extend(mark.turns)
        self._pending = [p for p in self._pending if p not in dropped]
        if dropped:
            e.spawn("drop", self._drop(dropped))

    # --- Delegation ----------------------------------------------------------------------------

    def _task_words(self, offset_ms: int) -> str:
        """What the caller said since the last delegation, up to ``offset_ms``."""
        upto = self._taken
        while upto < len(self._caller) and self._caller[upto].start_ms <= offset_ms:
            upto += 1
        words = "".join(f.text for f in self._caller[self._taken : upto]).strip()
        self._taken = upto
        return words

    async def _delegation(self, event: Delegated, generation: int) -> None:
        e = self.e
        started = time.perf_counter()
        words = self._task_words(event.offset_ms)
        item = self._utterance_id or ""
        self.flush_caller()
        profile = e._profile
        trust = profile.trust
        digits = spoken_digits(words) if trust != "owner_verified" else None
        if digits is not None:
            verdict = await profile.verify_spoken(digits)
            if verdict is not None:
                e.note("delegation", event="verify", result=VERIFIED if verdict else NOT_VERIFIED)
                await self._reply(event.delegation_id, VERIFIED if verdict else NOT_VERIFIED, generation, started)
                return
        if not words:
            await self._reply(event.delegation_id, "Nothing was asked: ask the caller what they need.", generation,
                              started, kind="thinking")  # fmt: skip
            return
        # A task the profile answers itself (putting the caller through), as the records keep the words.
        answered = await profile.delegated(profile.caller_text(item, words))
        if answered is not None:
            e.note("delegation", event="profile")
            await self._reply(event.delegation_id, answered, generation, started)
            return
        delegate = e.deps.delegate
        if delegate is None:
            await self._reply(event.delegation_id, "That cannot be done on this call: no text model is set up.",
                              generation, started)  # fmt: skip
            return
        # As the records keep it: a PIN or code the caller used never reaches a text model.
        said = profile.caller_text(item, words)
        result = await delegate(DelegatedTask(e.call.account_id, self._task_text(said, trust), trust))
        e.note("delegation", event="turn", trust=trust, status=result.status, staged=result.staged_writes,
               turn_id=str(result.turn_id) if result.turn_id else None)  # fmt: skip
        reply = result.reply
        if result.staged_writes and result.turn_id is not None:
            reply += " (This is saved once the caller has heard you confirm it: say it in one sentence.)"
        sent = await self._reply(event.delegation_id, reply, generation, started)
        if result.staged_writes and result.turn_id is not None:
            pending = _Pending(result.turn_id, event.delegation_id, tuple(sent))
            if not sent:
                await self._drop([pending])
                return
            self._await_confirmation(pending)

    def _await_confirmation(self, pending: _Pending) -> None:
        """The speech that says this result confirms its writes: the first to begin once the
        result's commentary reached the model's timeline (which may be the speech playing now)."""
        acked: list[float] = []
        for event_id in pending.event_ids:
            if event_id in self._acks:
                acked.append(self._acks.pop(event_id))
            else:
                self._waiting[event_id] = pending
        if len(acked) == len(pending.event_ids):
            pending.acked_at = max(acked)
            if self._segment is not None and self._segment_at >= pending.acked_at:
                pending.segment = self._segment
        self._pending.append(pending)

    def _task_text(self, words: str, trust: str) -> str:
        earlier = "\n".join(
            f"{'Caller' if x['role'] == 'caller' else 'Pepper'}: {x['text']}"
            for x in self.e.transcript[-12:]
            if x.get("text") and x["role"] in ("caller", "pepper")
        )[-1500:]
        if trust == "owner_verified":
            lead = f"Earlier on this phone call:\n{earlier}\n\n" if earlier else ""
            return f"{lead}On the phone now, the person asks: {words}\nAnswer in one or two spoken sentences."
        lines = [f"{CALLER_LABEL} {quoted(withhold_digits(words))}"]
        if earlier:
            lines.insert(0, f"Earlier on this call, as transcribed: {quoted(earlier)}")
        return "\n".join([*lines, "Answer in one or two spoken sentences."])

    async def _reply(self, delegation_id: str, text: str, generation: int, started: float,
                     kind: str = "commentary") -> list[str]:  # fmt: skip
        """The result for a delegation; its event ids (none when the model is gone)."""
        conn = self.e._conn
        if conn is None or self.e._ended.is_set():
            return []
        # A delegation of a session since replaced means nothing to the new one: general context.
        ident = delegation_id if generation == self.e._generation else None
        try:
            sent: list[str] = await conn.append_context(kind, text, ident)
        except RealtimeDisconnected:
            return []
        self._results.append(text[:500])
        self.delegation_ms.append((time.perf_counter() - started) * 1000)
        return sent

    def on_settle_mark(self, mark: Any) -> None:
        heard = list(mark.turns)
        if heard:
            self.e._resolving.add(self.e.spawn("commit", self._commit(heard)))

    async def _commit(self, heard: list[_Pending]) -> None:
        settle = self.e.deps.settle
        if settle is None:
            return
        task = asyncio.get_running_loop().create_task(self._settle(heard, True), name="call-live-commit")
        self.e._commits.add(task)
        task.add_done_callback(self.e._commits.discard)
        await asyncio.shield(task)

    async def _settle(self, pending: list[_Pending], ok: bool) -> None:
        settle = self.e.deps.settle
        if settle is None:
            return
        for p in pending:
            records = await settle(p.turn_id, ok)
            self.e._resolved.extend(records)

    async def _drop(self, pending: list[_Pending]) -> None:
        await self._settle(pending, False)
        conn = self.e._conn
        if conn is None or self.e._ended.is_set():
            return
        with contextlib.suppress(RealtimeDisconnected):
            await conn.add_note(labelled("NOT saved, because the caller did not hear it confirmed: the change just"
                                         " described. Ask again if they still want it."))  # fmt: skip

    async def dropped_model(self) -> None:
        """The model socket is being replaced: what it was confirming will never be said."""
        if self._fixture is not None:
            # The notice fixture never finished playing: not heard, so the new session plays it.
            self._fixture, self._notice_segment = None, None
        self._end_segment()  # what it said so far is the call so far
        waiting, self._pending = self._pending, []
        self._waiting.clear()
        self._usage_done += self._usage
        self._usage = 0.0
        if waiting:
            await self._settle(waiting, False)

    async def finish(self) -> None:
        """The call is over: every delegated write not heard confirmed is dropped."""
        self.flush_caller()
        waiting, self._pending = self._pending, []
        for mark in self.e._marks.values():
            if mark.kind == "settle":
                waiting.extend(mark.turns)
        if waiting:
            with contextlib.suppress(Exception):
                await self._settle(waiting, False)
