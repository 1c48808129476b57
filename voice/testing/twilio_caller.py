"""A loopback Twilio caller: places a call through Pepper's voice webhook and plays the media leg.

    caller = TwilioCaller(auth_token, local="http://127.0.0.1:PORT", public="https://pepper.example",
                          media_local="ws://127.0.0.1:MEDIA_PORT")  # the media listener, if not PORT
    answer = await caller.dial(from_="+15551230001", to="+15559870000")    # signed webhook, TwiML parsed
    async with caller.media(answer) as call:                                  # signed wss upgrade
        call.say(speech_mulaw)          # queued behind 20 ms pacing; silence (0xFF) otherwise
        await call.dtmf("1")
        await call.wait_heard(ms=500)   # what the playback clock consumed
        await call.hang_up()            # stop, then close

What it emulates (wire-protocols.md sections 1.3, 1.4, 2.4): ``connected`` then ``start`` with the
TwiML ``<Parameter>`` values; ``media`` every 20 ms (160 bytes of mu-law); a playback clock of
8000 bytes/s over the audio Pepper sends, echoing each mark when the clock passes it; ``clear``
empties the queue and echoes the waiting marks at once. Webhooks are signed over the public URL
and the upgrade over the public ``wss://`` URL, while requests go to the loopback address.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from core.adapters.twilio.signatures import sign

FRAME = 160
TICK = 0.02
SILENCE_FRAME = b"\xff" * FRAME
MULAW_ZEROS = b"\xff\x7f"  # mu-law codes of (positive and negative) zero: silence


def new_sid(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


@dataclass
class Answer:
    status: int
    twiml: str
    call_sid: str
    stream_url: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    says: list[str] = field(default_factory=list)
    action: str | None = None
    digits: list[str] = field(default_factory=list)  # each <Play digits> before the stream, in order

    @property
    def connected(self) -> bool:
        return self.stream_url is not None


def parse_twiml(text: str) -> dict[str, Any]:
    root = ET.fromstring(text)
    out: dict[str, Any] = {"says": [e.text or "" for e in root.iter("Say")], "hangup": root.find("Hangup") is not None}
    out["digits"] = [e.get("digits") for e in root.iter("Play") if e.get("digits")]
    connect_el = root.find("Connect")
    if connect_el is not None:
        out["action"] = connect_el.get("action")
        stream = connect_el.find("Stream")
        if stream is not None:
            out["stream_url"] = stream.get("url")
            out["parameters"] = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    return out


def answer_of(status: int, text: str, call_sid: str) -> Answer:
    answer = Answer(status, text, call_sid)
    if status == 200:
        parsed = parse_twiml(text)
        answer.stream_url = parsed.get("stream_url")
        answer.parameters = parsed.get("parameters", {})
        answer.says = parsed["says"]
        answer.action = parsed.get("action")
        answer.digits = parsed["digits"]
    return answer


class TwilioCaller:
    def __init__(
        self,
        auth_token: str,
        *,
        local: str,
        public: str,
        account_sid: str = "AC" + "1" * 32,
        media_local: str | None = None,
    ):
        self.auth_token = auth_token
        self.local = local.rstrip("/")
        self.media_local = (media_local or local).rstrip("/")
        self.public = public.rstrip("/")
        self.account_sid = account_sid

    def sign(self, url: str, params: dict[str, str]) -> str:
        return sign(self.auth_token, url, params)

    async def post(self, path: str, params: dict[str, str], *, signature: str | None = None) -> tuple[int, str]:
        headers = {"X-Twilio-Signature": signature or self.sign(self.public + path, params)}
        async with aiohttp.ClientSession() as session, session.post(self.local + path, data=params,
                                                                    headers=headers) as response:  # fmt: skip
            return response.status, await response.text()

    async def dial(
        self,
        *,
        from_: str,
        to: str,
        path: str = "/twilio/voice",
        call_sid: str | None = None,
        signature: str | None = None,
        **extra: str,
    ) -> Answer:
        call_sid = call_sid or new_sid("CA")
        params = {"CallSid": call_sid, "AccountSid": self.account_sid, "From": from_, "To": to,
                  "CallStatus": "ringing", "Direction": "inbound", "ApiVersion": "2010-04-01", "Caller": from_,
                  "Called": to, **extra}  # fmt: skip
        status, text = await self.post(path, params, signature=signature)
        return answer_of(status, text, call_sid)

    async def stream_ended(self, answer: Answer, **form: str) -> Answer:
        """Twilio's request for the ``<Connect action>`` once the stream of ``answer`` ended (Pepper
        closed the socket): the next TwiML, as an :class:`Answer` (its ``digits`` are the keys
        ``<Play digits>`` presses before a new stream)."""
        assert answer.action and answer.action.startswith(self.public), answer.action
        params = {"CallSid": answer.call_sid, "AccountSid": self.account_sid, "CallStatus": "in-progress",
                  "ApiVersion": "2010-04-01", **form}  # fmt: skip
        status, text = await self.post(urlsplit(answer.action).path, params)
        return answer_of(status, text, answer.call_sid)

    async def status(self, call_sid: str, status: str, path: str = "/twilio/voice/status") -> int:
        params = {"CallSid": call_sid, "AccountSid": self.account_sid, "CallStatus": status}
        code, _ = await self.post(path, params)
        return code

    async def follow_dial(self, twiml: str, form: dict[str, str], *, answers: bool) -> DialLeg:
        """Twilio running the ``<Dial>`` in ``twiml`` for the call of ``form``: the second leg
        rings; when it ``answers``, its ``<Number url>`` is asked for the whisper (a child call with
        ``ParentCallSid``), which plays to it alone, then the legs are bridged (``completed`` once
        they hang up); otherwise it rings out (``no-answer``). Then the ``<Dial action>`` is posted
        with ``DialCallStatus``, on the parent call."""
        dial = ET.fromstring(twiml).find("Dial")
        assert dial is not None, twiml
        number = dial.find("Number")
        assert number is not None and number.text, twiml
        whisper: list[str] = []
        bridged, child = False, None
        if answers:
            child = new_sid("CA")
            url = number.get("url")
            if url:
                leg = {**form, "CallSid": child, "ParentCallSid": form["CallSid"], "Direction": "outbound-dial",
                       "To": number.text, "From": dial.get("callerId") or form.get("From", ""),
                       "CallStatus": "in-progress"}  # fmt: skip
                status, text = await self.post(urlsplit(url).path, leg)
                assert status == 200, (status, text)
                parsed = parse_twiml(text)
                whisper, bridged = parsed["says"], not parsed["hangup"]
            else:
                bridged = True
        dial_status = "completed" if bridged else "no-answer"
        action = dial.get("action")
        assert action, twiml
        params = {**form, "DialCallStatus": dial_status, **({"DialCallSid": child} if child else {})}
        status, text = await self.post(urlsplit(action).path, params)
        return DialLeg(number.text, dial.get("callerId"), whisper, bridged, dial_status, status, text, child)

    def local_ws_url(self, public_ws_url: str) -> str:
        local = urlsplit(self.media_local)
        return f"ws://{local.netloc}{urlsplit(public_ws_url).path}"

    @asynccontextmanager
    async def media(
        self,
        answer: Answer,
        *,
        signature: str | None = None,
        parameters: dict[str, str] | None = None,
        call_sid: str | None = None,
        send_start: bool = True,
    ) -> AsyncIterator[MediaCall]:
        assert answer.stream_url, "the call was not connected to a stream"
        sig = signature if signature is not None else self.sign(answer.stream_url, {})
        headers = {"X-Twilio-Signature": sig} if sig else {}
        # A generous handshake timeout: under load (the benchmark) a busy server still answers.
        ws = await connect(self.local_ws_url(answer.stream_url), additional_headers=headers, compression=None,
                           max_size=None, open_timeout=60)  # fmt: skip
        call = MediaCall(ws, call_sid or answer.call_sid, self.account_sid,
                         answer.parameters if parameters is None else parameters)  # fmt: skip
        try:
            if send_start:
                await call.start()
            else:
                call.listen()
            yield call
        finally:
            await call.aclose()


@dataclass
class HeardMark:
    name: str
    at: float
    cleared: bool


class MediaCall:
    def __init__(self, ws: ClientConnection, call_sid: str, account_sid: str, parameters: dict[str, str]):
        self.ws = ws
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.parameters = parameters
        self.stream_sid = new_sid("MZ")
        self.seq = 0
        self.chunk = 0
        self.outgoing = bytearray()
        self.frames_sent = 0
        self.speech_sent_at: list[float] = []
        self.heard = bytearray()
        self.received_media_bytes = 0
        self.sounds: list[float] = []  # time.monotonic() of each media frame received that is not silence
        self.marks: list[HeardMark] = []
        self.clears: list[float] = []
        self.received: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.closed = asyncio.Event()
        self.frame_hook: Any = None  # bench: called with (frame_index) -> bytes | None
        self.media_hook: Any = None  # bench: called with decoded bytes of each media frame received
        self._queue: deque[tuple[str, Any]] = deque()  # ("audio", bytearray) | ("mark", name)
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = time.monotonic()
        self._stopped = False

    def _next_seq(self) -> str:
        self.seq += 1
        return str(self.seq)

    async def send_json(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps(frame))

    async def send_raw(self, text: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(text)

    async def start(self) -> None:
        await self.send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self.send_json({
            "event": "start", "sequenceNumber": self._next_seq(), "streamSid": self.stream_sid,
            "start": {"streamSid": self.stream_sid, "accountSid": self.account_sid, "callSid": self.call_sid,
                      "tracks": ["inbound"], "customParameters": self.parameters,
                      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}},
        })  # fmt: skip
        loop = asyncio.get_running_loop()
        self._t0 = time.monotonic()
        self._tasks = [
            loop.create_task(self._pump(), name=f"caller-pump-{self.call_sid[-6:]}"),
            loop.create_task(self._listen(), name=f"caller-listen-{self.call_sid[-6:]}"),
            loop.create_task(self._playback(), name=f"caller-playback-{self.call_sid[-6:]}"),
        ]

    def listen(self) -> None:
        """Only read what Pepper sends (a socket that never starts its stream)."""
        self._tasks.append(
            asyncio.get_running_loop().create_task(self._listen(), name=f"caller-listen-{self.call_sid[-6:]}")
        )

    def say(self, mulaw: bytes) -> None:
        """Queue speech; it goes out in 20 ms frames after what is already queued."""
        self.speech_sent_at.append(time.monotonic())
        self.outgoing += mulaw

    async def dtmf(self, digit: str) -> None:
        await self.send_json({"event": "dtmf", "sequenceNumber": self._next_seq(), "streamSid": self.stream_sid,
                              "dtmf": {"track": "inbound_track", "digit": digit}})  # fmt: skip

    async def keypad(self, digits: str, gap: float = 0.05) -> None:
        for digit in digits:
            await self.dtmf(digit)
            await asyncio.sleep(gap)

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while not self._stopped:
            n += 1
            frame = None
            if self.frame_hook is not None:
                frame = self.frame_hook(n)
            if frame is None:
                if self.outgoing:
                    frame = bytes(self.outgoing[:FRAME]).ljust(FRAME, b"\xff")
                    del self.outgoing[:FRAME]
                else:
                    frame = SILENCE_FRAME
            self.chunk += 1
            await self.send_raw(
                '{"event":"media","sequenceNumber":"' + self._next_seq() + '","streamSid":"' + self.stream_sid
                + '","media":{"track":"inbound","chunk":"' + str(self.chunk) + '","timestamp":"'
                + str(self.chunk * 20) + '","payload":"' + base64.b64encode(frame).decode() + '"}}'
            )  # fmt: skip
            self.frames_sent += 1
            delay = start + n * TICK - loop.time()
            await asyncio.sleep(max(0.0, delay))

    async def _listen(self) -> None:
        try:
            async for raw in self.ws:
                frame = json.loads(raw)
                event = frame.get("event")
                if event == "media":
                    audio = base64.b64decode(frame["media"]["payload"])
                    self.received_media_bytes += len(audio)
                    if audio.strip(MULAW_ZEROS):
                        self.sounds.append(time.monotonic())
                    if self.media_hook is not None:
                        self.media_hook(audio)
                    if self._queue and self._queue[-1][0] == "audio":
                        self._queue[-1][1].extend(audio)
                    else:
                        self._queue.append(("audio", bytearray(audio)))
                else:
                    self.received.append(frame)
                    if event == "mark":
                        self._queue.append(("mark", frame["mark"]["name"]))
                        await self._echo_due_marks()
                    elif event == "clear":
                        self.clears.append(time.monotonic())
                        waiting = [name for kind, name in self._queue if kind == "mark"]
                        self._queue.clear()
                        for name in waiting:
                            await self._echo(name, cleared=True)
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self._stopped = True
            self.closed.set()

    async def _echo(self, name: str, *, cleared: bool = False) -> None:
        self.marks.append(HeardMark(name, time.monotonic(), cleared))
        await self.send_json({"event": "mark", "sequenceNumber": self._next_seq(), "streamSid": self.stream_sid,
                              "mark": {"name": name}})  # fmt: skip

    async def _echo_due_marks(self) -> None:
        while self._queue and self._queue[0][0] == "mark":
            await self._echo(self._queue.popleft()[1])

    async def _playback(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while not self._stopped:
            n += 1
            budget = FRAME
            while budget and self._queue:
                kind, value = self._queue[0]
                if kind == "mark":
                    self._queue.popleft()
                    await self._echo(value)
                    continue
                take = value[:budget]
                self.heard += take
                del value[:budget]
                budget -= len(take)
                if not value:
                    self._queue.popleft()
            await self._echo_due_marks()
            delay = start + n * TICK - loop.time()
            await asyncio.sleep(max(0.0, delay))

    def first_sound_after(self, at: float) -> float | None:
        """When the first media frame that is not silence arrived after ``at`` (``time.monotonic``)."""
        return next((t for t in self.sounds if t >= at), None)

    @property
    def heard_ms(self) -> int:
        return len(self.heard) // 8

    async def wait(self, predicate: Any, within: float = 10.0, what: str = "the condition") -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    async def hang_up(self) -> None:
        await self.send_json({"event": "stop", "sequenceNumber": self._next_seq(), "streamSid": self.stream_sid,
                              "stop": {"accountSid": self.account_sid, "callSid": self.call_sid}})  # fmt: skip
        self._stopped = True
        await self.ws.close()

    async def aclose(self) -> None:
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self.ws.close()
        if self.close_code is None:
            self.close_code = self.ws.close_code


@dataclass
class DialLeg:
    """What Twilio did with a ``<Dial><Number url=...>``: the number rung, the caller ID shown,
    what the second leg heard before the bridge (its whisper), whether the legs were bridged, and
    the ``<Dial action>``'s answer."""

    number: str
    caller_id: str | None
    whisper: list[str]
    bridged: bool
    dial_status: str
    status: int
    twiml: str
    child_sid: str | None = None
