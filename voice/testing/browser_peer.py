"""A loopback browser for browser-call tests and benchmarks: an aiortc peer that offers audio as
Chrome does (Opus 48 kHz, a ``transcript`` data channel, every ICE candidate in the offer).

    async with BrowserPeer() as browser:
        answer = await post_offer(await browser.offer())
        await browser.accept(answer["sdp"])
        browser.say(pcm_8k)              # 16-bit 8 kHz mono: resampled to 48 kHz, sent in 20 ms frames
        await browser.wait_for(lambda: browser.heard_energy() > 0)

``received`` keeps (arrival time, RMS) for every decoded 20 ms frame of Pepper's voice;
``messages`` the data channel's messages (transcript lines, the end of the call).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, AudioResampler

from voice.adapters.webrtc import FrameClock, low_latency, pcm_frame
from voice.codec import audioop

RATE = 48000
FRAME = 960  # 20 ms at 48 kHz


class MicTrack(MediaStreamTrack):
    """The microphone: what was said (``say``), else silence, 20 ms each 20 ms at 48 kHz mono.
    ``sent`` gets the send time of the first frame of each utterance, and ``on_frame`` (if set)
    may rewrite each frame's samples before it is sent (benchmarks mark their bursts with it)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending: deque[bytes] = deque()
        self._clock = FrameClock(FRAME, RATE)
        self.sent: list[float] = []
        self.on_frame: Callable[[int], bytes | None] | None = None

    def say(self, pcm_8k: bytes) -> None:
        resampler = AudioResampler(format="s16", layout="mono", rate=RATE, frame_size=FRAME)
        frames = [*resampler.resample(pcm_frame(pcm_8k, 8000, 0)), *resampler.resample(None)]
        for out in frames:
            self._pending.append(bytes(out.planes[0])[: out.samples * 2])

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pts = await self._clock.tick()
        pcm = None
        if self.on_frame is not None:
            pcm = self.on_frame(pts // FRAME)
        if pcm is None and self._pending:
            pcm = self._pending.popleft()
        pcm = (pcm or b"")[: FRAME * 2]
        return pcm_frame(pcm + bytes(FRAME * 2 - len(pcm)), RATE, pts)


class BrowserPeer:
    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = MicTrack()
        self.received: list[tuple[float, int]] = []
        self.messages: list[dict[str, Any]] = []
        self.on_audio: Callable[[float, bytes], None] | None = None  # (arrival, 48 kHz mono PCM)
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BrowserPeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def offer(self) -> dict[str, str]:
        """The offer to POST, as the page sends it (``type`` and ``sdp``, every candidate in)."""
        self.pc.addTrack(self.mic)
        channel = self.pc.createDataChannel("transcript")

        @channel.on("message")
        def on_message(text: str) -> None:
            self.messages.append(json.loads(text))

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._reader = asyncio.get_running_loop().create_task(self._read(track))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        # A browser's own jitter buffer adapts to the network (tens of ms on loopback); aiortc's
        # fixed 80 ms would be counted against the server in bench/webrtc.py.
        low_latency(self.pc)
        return {"type": "offer", "sdp": self.pc.localDescription.sdp}

    async def accept(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    def say(self, pcm_8k: bytes) -> None:
        self.mic.say(pcm_8k)

    async def _read(self, track: MediaStreamTrack) -> None:
        resampler = AudioResampler(format="s16", layout="mono", rate=RATE)
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, AudioFrame):
                    continue
                now = time.monotonic()
                for out in resampler.resample(frame):
                    pcm = bytes(out.planes[0])[: out.samples * 2]
                    self.received.append((now, audioop.rms(pcm, 2)))
                    if self.on_audio is not None:
                        self.on_audio(now, pcm)

    def heard(self, level: int = 300) -> int:
        """How many received 20 ms frames were louder than ``level``."""
        return sum(1 for _, rms in self.received if rms > level)

    def lines(self) -> list[tuple[str, str]]:
        return [(m["who"], m["text"]) for m in self.messages if m.get("type") == "line"]

    async def wait_for(self, predicate: Callable[[], Any], within: float = 10.0, what: str = "it") -> Any:
        deadline = time.monotonic() + within
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the browser never saw {what}")
            await asyncio.sleep(0.02)
        return value

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
