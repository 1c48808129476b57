"""Browser calls over WebRTC (aiortc): the browser's microphone into the one call engine, the
model's voice back to the page.

The engine (:class:`voice.engine.CallEngine`) speaks Twilio Media Streams to its link: ``media``
frames out, ``mark`` frames out and back once the audio before them has played, ``clear`` on a
barge-in. A browser call's link plays Twilio's part, so a browser call has the same notice, gate,
barge-in, staged writes and records as a phone call:

* **Caller -> model.** aiortc decodes the browser's Opus (48 kHz stereo, 20 ms) as each packet
  arrives (no jitter-buffer hold: :class:`_PacketJitterBuffer`); each frame is resampled once, by
  libswresample (PyAV), to 8 kHz mono (20 ms in, 20 ms out), mu-law encoded and handed to
  :meth:`CallEngine.feed_audio`, as a Twilio ``media`` frame's payload is.
* **Model -> caller.** The engine's ``media`` frames are queued as mu-law; an outgoing track paced
  by the event loop's clock takes 20 ms of it every 20 ms (silence when there is none), resampled
  once to 48 kHz mono for aiortc's Opus encoder. A ``mark`` is echoed to the
  engine when the audio queued before it has been handed to the encoder (the caller heard it, as
  far as the server can tell); ``clear`` empties the queue and echoes every mark waiting, as
  Twilio does.
* **Transcript.** Each line the engine records goes to the page over a data channel
  (``transcript``), with the end of the call.

ICE is not trickled: the answer carries every candidate gathered (host candidates; no STUN or
TURN server is configured, so the browser must reach the server directly).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fractions
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, AudioResampler

from core.adapters.twilio import media_streams as media
from voice.codec import audioop

log = logging.getLogger(__name__)

FRAME_SECONDS = 0.02
FRAME_SAMPLES = 160  # 20 ms at 8 kHz: what the engine takes, one mu-law byte a sample
SILENCE = b"\xff" * FRAME_SAMPLES
OPUS_SAMPLES = 960  # 20 ms at 48 kHz, the browser's side
MAX_OFFER_CHARS = 20_000


class _PacketJitterBuffer(JitterBuffer):
    """Each Opus packet is a whole 20 ms frame: decoded as it arrives. aiortc's audio receiver
    holds four frames (80 ms) before it decodes any (``prefetch=4``, fixed in ``RTCRtpReceiver``),
    and even without prefetch releases a frame only when the next packet shows it complete: 20 to
    80 ms on every frame, most of a browser call's caller -> model latency in ``bench/webrtc.py``.
    A packet that comes after a later one is dropped (the decoder conceals the gap); voice from
    a browser is rarely reordered, and a late frame played out of order would be worse."""

    def __init__(self) -> None:
        super().__init__(capacity=16)
        self._last: int | None = None

    def add(self, packet: Any) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._last is not None and not 0 < (seq - self._last) % 65536 < 32768:
            return False, None  # a duplicate, or older than a frame already decoded
        self._last = seq
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def low_latency(pc: RTCPeerConnection) -> None:
    """Decode each received audio packet as it arrives (see :class:`_PacketJitterBuffer`)."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            # Name-mangled: RTCRtpReceiver keeps it private and offers no setting.
            vars(transceiver.receiver)["_RTCRtpReceiver__jitter_buffer"] = _PacketJitterBuffer()


class BadOffer(ValueError):
    """The SDP offer cannot start a call (not SDP, no audio, or aiortc refused it)."""


class _Playback:
    """The model's audio waiting to be played to the browser, with the engine's marks at their
    places in it (byte offsets in the whole call's mu-law stream)."""

    __slots__ = ("_buffer", "_marks", "played", "written")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._marks: deque[tuple[int, str]] = deque()
        self.written = 0
        self.played = 0

    def audio(self, ulaw: bytes) -> None:
        self._buffer += ulaw
        self.written += len(ulaw)

    def mark(self, name: str) -> None:
        self._marks.append((self.written, name))

    def clear(self) -> list[str]:
        """Drop what has not played; the marks waiting, to echo."""
        self._buffer.clear()
        self.played = self.written
        names = [name for _, name in self._marks]
        self._marks.clear()
        return names

    def take(self) -> tuple[bytes, list[str]]:
        """The next 20 ms (padded with silence) and the marks it played past."""
        chunk = bytes(self._buffer[:FRAME_SAMPLES])
        del self._buffer[:FRAME_SAMPLES]
        self.played += len(chunk)
        reached: list[str] = []
        while self._marks and self._marks[0][0] <= self.played:
            reached.append(self._marks.popleft()[1])
        if len(chunk) < FRAME_SAMPLES:
            chunk += SILENCE[len(chunk) :]
        return chunk, reached


class BrowserLink:
    """The engine's link (``voice.engine.TwilioLink``) for a browser call: the engine's Twilio
    frames, played to the browser's track. ``echo`` takes the mark frames back to the engine."""

    backed_up = False  # the outgoing track takes what is queued at its own pace; nothing backs up

    def __init__(self, stream_sid: str, on_close: Callable[[], None]):
        self.stream_sid = stream_sid
        self.playback = _Playback()
        self.echo: Callable[[str], object] | None = None
        self.frames_cleared = 0
        self._on_close = on_close
        self.closed = False

    def send(self, text: str) -> None:
        if self.closed:
            return
        frame = media.parse(text)
        event = frame["event"]
        if event == "media":
            self.playback.audio(base64.b64decode(media.media_payload(frame)))
        elif event == "mark":
            self.playback.mark(media.mark_name(frame))
        elif event == "clear":
            self.frames_cleared += (self.playback.written - self.playback.played) // FRAME_SAMPLES
            # Echoed after the engine's barge-in has marked them cancelled (it sends ``clear``
            # first), as Twilio's echo comes back over the network: never taken for played.
            asyncio.get_running_loop().call_soon(self._echo, self.playback.clear())

    def send_many(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.send(text)

    async def drained(self) -> None:
        return None

    async def close(self, code: int = 1000) -> None:
        self.close_now()

    def close_now(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()

    def _echo(self, names: list[str]) -> None:
        if self.echo is not None:
            for name in names:
                self.echo(media.mark_frame(self.stream_sid, name))

    def next_frame(self) -> bytes:
        """20 ms of mu-law to play now; the marks it played past go back to the engine."""
        chunk, reached = self.playback.take()
        if reached:
            self._echo(reached)
        return chunk


class FrameClock:
    """A media track's pace: the next frame's pts (in samples) once its time has come, by the
    event loop's clock from the first frame on (aiortc sends a track's frames as fast as it
    returns them)."""

    def __init__(self, samples: int, rate: int):
        self._samples, self._rate = samples, rate
        self._start: float | None = None
        self.pts = 0

    async def tick(self) -> int:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
            return 0
        self.pts += self._samples
        wait = self._start + self.pts / self._rate - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        return self.pts


class _PlaybackTrack(MediaStreamTrack):
    """The model's voice, 20 ms each 20 ms as 8 kHz mono frames (aiortc's encoder makes Opus 48 kHz)."""

    kind = "audio"

    def __init__(self, link: BrowserLink):
        super().__init__()
        self._link = link
        self._clock = FrameClock(OPUS_SAMPLES, 48000)
        self._resampler = AudioResampler(format="s16", layout="mono", rate=48000)
        self._out = bytearray()

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pts = await self._clock.tick()
        return pcm_frame(self.upsampled(self._link.next_frame()), 48000, pts)

    def upsampled(self, ulaw: bytes) -> bytes:
        """20 ms of mu-law as exactly 20 ms at 48 kHz. Resampled here, once, rather than by aiortc's
        encoder: its resampler emits only whole 20 ms frames, so the few samples libswresample
        holds back would delay every frame by nearly a frame. The first frame is padded to size
        with silence at its start; from then on each 160 samples in give 960 out."""
        for out in self._resampler.resample(pcm_frame(audioop.ulaw2lin(ulaw, 2), 8000, 0)):
            self._out += bytes(out.planes[0])[: out.samples * 2]
        if len(self._out) < OPUS_SAMPLES * 2:
            self._out[:0] = bytes(OPUS_SAMPLES * 2 - len(self._out))
        pcm = bytes(self._out[: OPUS_SAMPLES * 2])
        del self._out[: OPUS_SAMPLES * 2]
        return pcm


def pcm_frame(pcm: bytes, rate: int, pts: int) -> AudioFrame:
    """16-bit mono ``pcm`` as a frame for aiortc's encoder."""
    frame = AudioFrame(format="s16", layout="mono", samples=len(pcm) // 2)
    frame.planes[0].update(pcm)
    frame.sample_rate = rate
    frame.time_base = fractions.Fraction(1, rate)
    frame.pts = pts
    return frame


class Timings:
    """Per-frame server time of a browser call, for ``bench/webrtc.py``: caller -> model (a
    decoded frame's resampling and encoding up to the engine's append) in seconds."""

    def __init__(self) -> None:
        self.inbound: list[float] = []


class BrowserCall:
    """One browser's peer connection bridged to a call engine. ``answer`` takes the offer; then
    :meth:`attach` hands it the engine, whose run the gateway drives."""

    def __init__(self, stream_sid: str, *, timings: Timings | None = None):
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.link = BrowserLink(stream_sid, self._closed_by_engine)
        self.timings = timings
        self.engine: Any = None
        self._channel: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._track = _PlaybackTrack(self.link)
        self._gone = asyncio.Event()
        self._lines: list[str] = []  # transcript lines before the data channel opened

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._spawn(self._read_caller(track))

        @self.pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label == "transcript" and self._channel is None:
                self._channel = channel
                for line in self._lines:
                    channel.send(line)
                self._lines.clear()

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                self._hang_up()

    async def answer(self, sdp: str) -> str:
        """The SDP answer (with every ICE candidate) to the browser's offer; raises BadOffer."""
        if not isinstance(sdp, str) or not sdp.startswith("v=0") or len(sdp) > MAX_OFFER_CHARS or "m=audio" not in sdp:
            raise BadOffer("not an SDP offer with audio")
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            audio = [t for t in self.pc.getTransceivers() if t.kind == "audio"]
            if not audio:
                raise BadOffer("the offer has no audio")
            audio[0].sender.replaceTrack(self._track)
            low_latency(self.pc)
            audio[0].direction = "sendrecv"
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except BadOffer:
            raise
        except Exception as exc:  # aiortc raises ValueError, KeyError... on SDP it cannot use
            raise BadOffer(f"aiortc refused the offer: {type(exc).__name__}") from exc
        return str(self.pc.localDescription.sdp)

    def attach(self, engine: Any) -> None:
        self.engine = engine
        self.link.echo = engine.feed

    def line(self, direction: str, text: str) -> None:
        """A transcript line to the page (``in``: the caller's words, ``out``: Pepper's)."""
        self._message({"type": "line", "who": "you" if direction == "in" else "pepper", "text": text})

    def ended(self, reason: str | None) -> None:
        self._message({"type": "ended", "reason": reason})

    def _message(self, payload: dict[str, Any]) -> None:
        text = json.dumps(payload)
        channel = self._channel
        if channel is None:
            self._lines.append(text)
        elif channel.readyState == "open":
            channel.send(text)

    async def _read_caller(self, track: MediaStreamTrack) -> None:
        """Every decoded 20 ms frame from the browser, resampled once to 8 kHz mono 20 ms frames."""
        # No fixed frame size: each 20 ms in gives what libswresample has for it (160 samples, but
        # for the few its filter holds back at the start), so no frame waits for the next one.
        resampler = AudioResampler(format="s16", layout="mono", rate=8000)
        timings = self.timings
        try:
            while True:
                frame = await track.recv()
                if not isinstance(frame, AudioFrame):
                    continue
                began = time.perf_counter()
                engine = self.engine
                for out in resampler.resample(frame):
                    if engine is None:
                        continue
                    payload = base64.b64encode(audioop.lin2ulaw(bytes(out.planes[0])[: out.samples * 2], 2))
                    rest = engine.feed_audio(payload.decode())
                    if rest is not None:
                        await rest
                if timings is not None:
                    timings.inbound.append(time.perf_counter() - began)
        except MediaStreamError:
            self._hang_up()  # the browser's track ended

    def _hang_up(self) -> None:
        self._gone.set()
        if self.engine is not None and not self.engine.ended:
            self.engine.hang_up("hangup")

    def _closed_by_engine(self) -> None:
        self._spawn(self.close())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.link.closed = True
        with contextlib.suppress(Exception):
            await self.pc.close()
        self._track.stop()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
