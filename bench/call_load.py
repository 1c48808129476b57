"""The load side of ``bench/calls.py``: fake Twilio callers and a fake OpenAI Realtime model, each
in its own process on uvloop, written for throughput so that they are not what saturates first.

    python bench/call_load.py --callers     # one caller worker (many calls), driven over stdin/stdout
    python bench/call_load.py --model       # the loopback Realtime server, driven the same way

The model process also speaks GPT-Live on ``/v1/live/sessions`` (``session.start``, pcmu audio
both ways, the notice asked for as commentary, caller words and delegations on command, the
delegation turnaround read where the first result for it lands), and serves a loopback OpenAI
text model (``core.testing.peers.OpenAIPeer``) for the Pepper turns those delegations run.

Both speak JSON lines with ``bench/calls.py`` on stdin/stdout (one command, one answer) and use
picows (Cython websockets) instead of the ``websockets`` library, whose per-message cost in Python
is what saturated the old generator. Per frame they do no JSON work: outbound frames are built
once per call (or response) and only the fields that must differ are stamped (sequence number,
chunk, timestamp, the 12-byte tag); inbound audio frames are recognised by a byte prefix and the
tag is read from the first 16 base64 characters. Everything else (marks, clears, session events,
and all of pipecat's frames, whose JSON has other spacing) is parsed with orjson.

Frames go out on a 2 ms slot schedule (a call's frames every 20 ms, calls spread over the slots as
real calls are), so the server sees a steady stream rather than a burst per 20 ms. How late each
slot fired is recorded: a generator that cannot keep up shows it in its own lag, not only in the
server's figures. Latency is read with ``time.monotonic_ns`` (one clock for every process on the
machine) in the frame callback, before anything else is done with the frame.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import secrets
import sys
import time
from collections import deque
from typing import Any

import orjson
from picows import WSFrame, WSListener, WSMsgType, WSTransport, WSUpgradeRequest, ws_connect, ws_create_server

from voice.ws_frames import text_frame_head

FRAME = 160  # 20 ms of mu-law
TICK = 0.02
SLOTS = 10  # frames of different calls go out 2 ms apart
BURST_EVERY = 20  # frames: a tone burst each 400 ms
BURST_FRAMES = 2  # 40 ms of tone
LOUD = 1000  # RMS of 16-bit samples: the tone is ~5,600, silence plus tags under 100
TAG_BYTES = 12  # 4 nibbles call index + 8 nibbles send time (us mod 2**32), each as 0xF0 | nibble
TAG_B64 = 16  # 12 bytes are exactly 16 base64 characters, so the rest of the payload encodes alone
_TO_TAG = bytes.maketrans(b"0123456789abcdef", bytes(range(0xF0, 0x100)))
# 0xF0..0xFF back to hex digits; any other byte becomes "x", which int(..., 16) refuses.
_FROM_TAG = bytes(
    (b"0123456789abcdef"[b - 0xF0] if b >= 0xF0 else ord("x")) for b in range(256)
)  # fmt: skip


_monotonic_ns = time.monotonic_ns
_b2a, _a2b = binascii.b2a_base64, binascii.a2b_base64  # base64's own wrappers cost more than the work


def now_us() -> int:
    return _monotonic_ns() // 1000


def tag_b64(call: int, us: int) -> bytes:
    """The tag as the 16 base64 characters that start a payload."""
    return _b2a((b"%04x%08x" % (call & 0xFFFF, us & 0xFFFFFFFF)).translate(_TO_TAG), newline=False)


def untag_value(payload_b64: bytes) -> int | None:
    """The tag's value (call << 32 | send time) from the first 16 base64 characters, or None."""
    try:
        return int(_a2b(payload_b64[:TAG_B64]).translate(_FROM_TAG), 16)
    except (ValueError, binascii.Error):
        return None


def untag_b64(payload_b64: bytes, now: int) -> tuple[int, float] | None:
    """(call, latency in ms) from the first 16 base64 characters of a payload, or None."""
    value = untag_value(payload_b64)
    if value is None:
        return None
    lat = ((now - value) & 0xFFFFFFFF) / 1000
    return (value >> 32, lat) if lat < 10_000 else None


_ZERO_KEY = b"\0\0\0\0"


def client_text_frame(data: bytes) -> bytes:
    """One final, masked text frame as a client sends it (RFC 6455 5.2), masked with a zero key so
    that no byte of it is touched here: the server unmasks it all the same. The callers write
    their frames of a 20 ms slot (audio and the marks echoed with it) in one write with these."""
    return text_frame_head(len(data), masked=True) + _ZERO_KEY + data


def tone_frames() -> tuple[bytes, bytes]:
    """20 ms of the 700 Hz burst tone as mu-law, and as 24 kHz PCM (pipecat's default format)."""
    from voice.codec import audioop
    from voice.testing.realtime_peer import tone

    ulaw = tone(20, hz=700)
    pcm24, _ = audioop.ratecv(audioop.ulaw2lin(ulaw, 2), 2, 1, 8000, 24000, None)
    return ulaw, pcm24[:960].ljust(960, b"\0")


def _rest_b64(body: bytes) -> bytes:
    return base64.b64encode(body[TAG_BYTES:])


_TEXT_MSG = WSMsgType.TEXT


def _text(transport: WSTransport, frame: WSFrame) -> bytes | None:
    """A text message's bytes; a close is answered, anything else ignored."""
    if frame.msg_type is WSMsgType.TEXT:
        return frame.get_payload_as_bytes()
    if frame.msg_type is WSMsgType.CLOSE:
        transport.send_close(frame.get_close_code())
        transport.disconnect()
    return None


class Onsets:
    """Rising edges of the burst level, per stream."""

    __slots__ = ("audioop", "loud")

    def __init__(self) -> None:
        from voice.codec import audioop

        self.audioop = audioop
        self.loud: dict[Any, bool] = {}

    def rising(self, key: Any, pcm16: bytes) -> bool:
        loud = self.audioop.rms(pcm16, 2) > LOUD if pcm16 else False
        was = self.loud.get(key, False)
        self.loud[key] = loud
        return loud and not was


class Lag:
    """How late the slot schedule fired (ms), while measuring."""

    def __init__(self) -> None:
        self.values: list[float] = []


async def slot_schedule(groups: list[list[Any]], state: dict[str, Any], lag: Lag, stop: asyncio.Event) -> None:
    """Call ``tick()`` on each group's members, group k at k * 2 ms within every 20 ms."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    step = TICK / SLOTS
    k = 0
    while not stop.is_set():
        due = start + k * step
        late = loop.time() - due
        if state["measuring"]:
            lag.values.append(late * 1000)
        for member in list(groups[k % SLOTS]):
            member.tick()
        k += 1
        await asyncio.sleep(max(0.0, start + k * step - loop.time()))


async def serve_commands(run: Any) -> None:
    """One JSON command per stdin line, one JSON answer per stdout line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    out.write(b'{"ready":true}\n')
    out.flush()
    while line := await reader.readline():
        out.write(orjson.dumps(await run(orjson.loads(line)), option=orjson.OPT_NON_STR_KEYS) + b"\n")
        out.flush()


# --- Callers ---------------------------------------------------------------------------------


class Call(WSListener):
    """One Twilio media stream: sends a frame each 20 ms, plays what it hears at 8000 bytes/s and
    echoes each mark when playback passes it; ``clear`` echoes the waiting marks at once."""

    # Slots: an attribute of a picows listener without them is ~5x slower to read (per frame, many).
    __slots__ = ("_mark_at", "_mark_head", "_mark_in_head", "_mark_mid", "_media_at", "_media_head", "_tail",
                 "call_sid", "chunk", "clears", "closed", "echoed", "first_audio", "index", "marks", "parameters",
                 "played", "received", "seq", "sid", "t", "w")  # fmt: skip

    def __init__(self, worker: CallerWorker, index: int, call_sid: str, parameters: dict[str, str]):
        self.w = worker
        self.index = index
        self.call_sid = call_sid
        self.sid = "MZ" + secrets.token_hex(16)
        self.parameters = parameters
        self.t: WSTransport | None = None
        self.seq = 0
        self.chunk = 0
        self.received = 0  # bytes of audio heard so far
        self.played = 0
        self.marks: deque[tuple[int, str]] = deque()  # (received position, name)
        self.echoed: list[str] = []
        self.clears: list[float] = []
        self.first_audio = False
        self.closed = asyncio.Event()
        sid = self.sid.encode()
        self._media_head = b'{"event":"media","streamSid":"' + sid + b'","media":{"payload":"'
        self._tail = b'"},"streamSid":"' + sid + b'"}'
        self._mark_head = b'{"event":"mark","sequenceNumber":"'
        self._mark_mid = b'","streamSid":"' + sid + b'","mark":{"name":"'
        self._media_at = len(self._media_head)
        # A mark as Pepper writes it (core.adapters.twilio.media_streams.mark_frame).
        self._mark_in_head = b'{"event":"mark","streamSid":"' + sid + b'","mark":{"name":"'
        self._mark_at = len(self._mark_in_head)

    # Twilio -> server
    def on_ws_connected(self, transport: WSTransport) -> None:
        self.t = transport

    def start(self) -> None:
        assert self.t is not None
        self._send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        self.seq += 1
        self._send_json({
            "event": "start", "sequenceNumber": str(self.seq), "streamSid": self.sid,
            "start": {"streamSid": self.sid, "accountSid": "AC" + "1" * 32, "callSid": self.call_sid,
                      "tracks": ["inbound"], "customParameters": self.parameters,
                      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}},
        })  # fmt: skip

    def _send_json(self, frame: dict[str, Any]) -> None:
        if self.t is not None and not self.t.is_disconnected:
            self.t.send(WSMsgType.TEXT, orjson.dumps(frame))

    def tick(self) -> None:
        """This call's 20 ms: its audio frame and the marks playback passed, in one write."""
        t = self.t
        if t is None or t.is_disconnected:
            return
        w = self.w
        self.seq += 1
        self.chunk += 1
        n = self.chunk
        now = _monotonic_ns() // 1000
        phase = n % BURST_EVERY
        if w.state["measuring"]:
            w.frames_sent += 1
            if phase == 0:
                w.burst_sent.setdefault(self.index, []).append(now / 1e6)
        body = b"".join((
            b'{"event":"media","sequenceNumber":"', b"%d" % self.seq,
            b'","media":{"track":"inbound","chunk":"', b"%d" % n, b'","timestamp":"', b"%d" % (n * 20),
            b'","payload":"', tag_b64(self.index, now), w.tone_rest if phase < BURST_FRAMES else w.silence_rest,
            self._tail,
        ))  # fmt: skip
        out = text_frame_head(len(body), masked=True) + _ZERO_KEY + body
        # The playback clock: 160 bytes per 20 ms; marks echo when it passes them.
        self.played = played = min(self.received, self.played + FRAME)
        marks = self.marks
        while marks and marks[0][0] <= played:
            out += client_text_frame(self._echo_body(marks.popleft()[1]))
        t.underlying_transport.write(out)

    def _echo_body(self, name: str) -> bytes:
        self.echoed.append(name)
        self.seq += 1
        return b"".join((self._mark_head, b"%d" % self.seq, self._mark_mid, name.encode(), b'"}}'))

    def _echo(self, name: str) -> None:
        body = self._echo_body(name)
        if self.t is not None and not self.t.is_disconnected:
            self.t.send(WSMsgType.TEXT, body)

    # server -> Twilio
    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        now = _monotonic_ns() // 1000
        if frame.msg_type is not _TEXT_MSG:
            _text(transport, frame)  # a close is answered
            return
        data = frame.get_payload_as_bytes()
        w = self.w
        if data.startswith(self._media_head):  # Pepper's media frames: no JSON work
            payload = data[self._media_at : -3]
        elif data.startswith(self._mark_in_head):  # and its marks
            self.marks.append((self.received, data[self._mark_at : -3].decode()))
            return
        else:
            event = orjson.loads(data)
            kind_ = event.get("event")
            if kind_ == "media":
                payload = event["media"]["payload"].encode()
            elif kind_ == "mark":
                self.marks.append((self.received, event["mark"]["name"]))
                return
            elif kind_ == "clear":
                self.clears.append(now / 1e6)
                self.played = self.received  # the queued audio is dropped
                while self.marks:
                    self._echo(self.marks.popleft()[1])
                return
            else:
                return
        self.first_audio = True
        size = len(payload) * 3 // 4 - payload.count(b"=", -2)
        self.received += size
        if not w.state["measuring"]:
            return
        w.ms_heard += size / 8
        value = untag_value(payload)
        if value is not None:
            lat = ((now - value) & 0xFFFFFFFF) / 1000
            if lat < 10_000:
                w.out_lat.append(lat)
        if w.onsets.rising(self.index, w.ulaw2lin(_a2b(payload), 2)):
            w.burst_seen.setdefault(self.index, []).append(now / 1e6)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.closed.set()

    def hang_up(self) -> None:
        self.seq += 1
        self._send_json({"event": "stop", "sequenceNumber": str(self.seq), "streamSid": self.sid,
                         "stop": {"accountSid": "AC" + "1" * 32, "callSid": self.call_sid}})  # fmt: skip
        if self.t is not None:
            self.t.send_close()
            self.t.disconnect()


class CallerWorker:
    def __init__(self) -> None:
        from voice.codec import audioop

        self.audioop = audioop
        self.ulaw2lin = audioop.ulaw2lin
        tone, _ = tone_frames()
        self.tone_rest, self.silence_rest = _rest_b64(tone), _rest_b64(b"\xff" * FRAME)
        self.state: dict[str, Any] = {"measuring": False}
        self.onsets = Onsets()
        self.lag = Lag()
        self.calls: dict[int, Call] = {}
        self.groups: list[list[Call]] = [[] for _ in range(SLOTS)]
        self.stop = asyncio.Event()
        self.schedule: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        self.out_lat: list[float] = []
        self.burst_sent: dict[int, list[float]] = {}
        self.burst_seen: dict[int, list[float]] = {}
        self.lag.values = []
        self.frames_sent = 0
        self.ms_heard = 0.0  # audio that reached the callers

    async def open_one(self, i: int, cmd: dict[str, Any], limit: asyncio.Semaphore, deadline: float) -> bool:
        """Dial, connect and wait for the opening; False (and the call dropped) if any of it fails
        or is not done by ``deadline``."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._open(i, cmd, limit)
        except Exception:  # refused, reset or out of time: this call did not open
            self._drop(i)
            return False

    async def _open(self, i: int, cmd: dict[str, Any], limit: asyncio.Semaphore) -> bool:
        from voice.testing.twilio_caller import Answer, TwilioCaller, new_sid

        pepper = cmd["mode"] == "pepper"
        twilio = TwilioCaller(cmd["token"], local=cmd["http"], public=cmd["public"], media_local=cmd["media"])
        async with limit:
            if pepper:
                answer = await twilio.dial(from_=cmd["from"], to=cmd["to"])
            else:
                answer = Answer(200, "", new_sid("CA"), stream_url=cmd["public"].replace("https", "wss") + "/media",
                                parameters={"bench_call": str(i)})  # fmt: skip
            if answer.stream_url is None:
                return False
            headers = {"X-Twilio-Signature": twilio.sign(answer.stream_url, {})} if pepper else None
            call = Call(self, i, answer.call_sid, answer.parameters)
            call.t, _ = await ws_connect(lambda: call, twilio.local_ws_url(answer.stream_url), extra_headers=headers,
                                         websocket_handshake_timeout=60)  # fmt: skip
            call.start()
        self.calls[i] = call
        self.groups[i % SLOTS].append(call)
        # Pepper: the opening notice was heard (its mark echoed); pipecat: the first audio arrived.
        while not (any(n.startswith("n") for n in call.echoed) if pepper else call.first_audio):
            if call.closed.is_set():
                self._drop(i)
                return False
            await asyncio.sleep(0.02)
        return True

    def _drop(self, i: int) -> None:
        call = self.calls.pop(i, None)
        if call is not None:
            self.groups[i % SLOTS].remove(call)
            call.hang_up()

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "open":
            if self.schedule is None:
                self.schedule = asyncio.get_running_loop().create_task(
                    slot_schedule(self.groups, self.state, self.lag, self.stop), name="caller-slots"
                )
            limit = asyncio.Semaphore(max(10, len(cmd["calls"]) // 10))  # dialling at once, as 10 per 100 calls
            deadline = asyncio.get_running_loop().time() + cmd["open_within"]
            ok = await asyncio.gather(*(self.open_one(i, cmd, limit, deadline) for i in cmd["calls"]))
            return {"ok": sum(ok), "failed": len(ok) - sum(ok)}
        if op == "measure":
            if cmd["on"]:
                self.reset()
            self.state["measuring"] = cmd["on"]
            return {"ok": True}
        if op == "clears":
            return {"clears": {i: len(c.clears) for i, c in self.calls.items()}}
        if op == "collect":
            before = {int(k): v for k, v in cmd["clears_before"].items()}
            deadline = time.monotonic() + cmd["clear_within"]
            waiting = lambda: any(len(c.clears) <= before.get(i, 0) for i, c in self.calls.items())  # noqa: E731
            while time.monotonic() < deadline and waiting():  # noqa: ASYNC110 (a poll across many calls)
                await asyncio.sleep(0.02)
            clears = {i: c.clears[before.get(i, 0)] for i, c in self.calls.items() if len(c.clears) > before.get(i, 0)}
            return {"out": self.out_lat, "sent": self.burst_sent, "seen": self.burst_seen, "clears": clears,
                    "lag": self.lag.values, "frames_sent": self.frames_sent,
                    "ms_heard": self.ms_heard}  # fmt: skip
        if op == "hangup":
            for i in list(self.calls):
                self._drop(i)
            self.reset()
            return {"ok": True}
        raise ValueError(op)


# --- The model ---------------------------------------------------------------------------------

APPEND = b'{"type":"input_audio_buffer.append","audio":"'  # exactly as Pepper's adapter writes it
APPEND_LIVE = b'{"type":"session.input_audio.append","audio":"'  # GPT-Live's, likewise
_APPEND_AT, _APPEND_LIVE_AT = len(APPEND), len(APPEND_LIVE)


class ModelConn(WSListener):
    """One Realtime socket: the GA events Pepper and pipecat use, audio streamed on the slot schedule."""

    __slots__ = ("call", "chunk", "delegated", "delta_head", "events", "index", "item", "left", "level", "live",
                 "path", "pcmu_in", "pcmu_out", "peer", "responses", "streaming", "t", "t0", "user_item")  # fmt: skip

    def __init__(self, peer: ModelPeer, path: str):
        self.peer = peer
        self.path = path
        self.index = peer.sockets
        peer.sockets += 1
        self.level = peer.level
        # pipecat's sockets name their call in the path; Pepper's are known by the tags they carry,
        # except a browser call's (Opus erases tags): ``bench/webrtc.py`` opens those one at a time,
        # so the level's n-th socket is its n-th call.
        self.call: int | None = int(path.split("/c", 1)[1].split("?")[0]) if "/realtime/c" in path else None
        if self.level["mode"] == "browser":
            self.call = self.index - peer.level_base
        self.live = path.startswith("/v1/live/")  # GPT-Live: no responses, delegations instead
        self.t0 = time.monotonic()
        self.delegated: dict[str, float] = {}  # delegation id -> when it was sent (until its first result)
        self.t: WSTransport | None = None
        self.pcmu_in = self.pcmu_out = False
        self.responses = 0
        self.streaming: str | None = None  # response id
        self.left: int | None = None  # chunks left (None: until cancelled)
        self.chunk = 0
        self.events = 0
        self.delta_head = b""
        self.user_item = 0

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.t = transport
        self.peer.conns.append(self)
        if not self.live:  # GPT-Live speaks once session.start came
            session = {"type": "realtime", "id": f"sess_{self.index}", "object": "realtime.session",
                       "model": "gpt-realtime-2", "output_modalities": ["audio"]}  # fmt: skip
            self.emit({"type": "session.created", "session": session})

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.stop_stream()
        if self in self.peer.conns:
            self.peer.conns.remove(self)

    def emit(self, event: dict[str, Any]) -> None:
        self.events += 1
        event.setdefault("event_id", f"ev_{self.index}_{self.events}")
        if self.t is not None and not self.t.is_disconnected:
            self.t.send(WSMsgType.TEXT, orjson.dumps(event))

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        now = _monotonic_ns() // 1000
        if frame.msg_type is not _TEXT_MSG:
            _text(transport, frame)  # a close is answered
            return
        data = frame.get_payload_as_bytes()
        if data.startswith(APPEND):
            self.audio_in(data[_APPEND_AT:-2], now)
            return
        if data.startswith(APPEND_LIVE):
            self.audio_in(data[_APPEND_LIVE_AT:-2], now)
            return
        event = orjson.loads(data)
        kind_ = event.get("type")
        if self.live:
            self.on_live(event, kind_, now)
            return
        if kind_ == "input_audio_buffer.append":
            self.audio_in(event.get("audio", "").encode(), now)
        elif kind_ == "session.update":
            audio = (event.get("session") or {}).get("audio") or {}
            fmt = lambda d: ((audio.get(d) or {}).get("format") or {}).get("type")  # noqa: E731
            self.pcmu_in, self.pcmu_out = fmt("input") == "audio/pcmu", fmt("output") == "audio/pcmu"
            self.emit({"type": "session.updated", "session": event.get("session") or {}})
        elif kind_ == "response.create":
            self.start_response()
        elif kind_ == "response.cancel":
            if self.streaming is not None:
                self.end_response("cancelled")
            else:
                self.emit({"type": "error", "error": {"type": "invalid_request_error",
                           "code": "response_cancel_not_active", "message": "no active response"}})  # fmt: skip
        elif kind_ == "conversation.item.create":
            self.emit({"type": "conversation.item.added", "item": event.get("item") or {}})
        elif kind_ == "conversation.item.truncate":
            self.emit({"type": "conversation.item.truncated", "item_id": event.get("item_id"), "content_index": 0,
                       "audio_end_ms": event.get("audio_end_ms")})  # fmt: skip

    def on_live(self, event: dict[str, Any], kind_: Any, now: int) -> None:
        if kind_ == "session.start":
            session = event.get("session") or {}
            fmt = ((session.get("audio") or {}).get("format") or {}).get("type")
            self.pcmu_in = self.pcmu_out = fmt == "audio/pcmu"
            self.t0 = time.monotonic()
            self.emit({"type": "session.started", "session": {"id": f"sess_{self.index}", "expires_at": 0,
                       "model": session.get("model"), "status": "active"}})  # fmt: skip
        elif kind_ in ("session.commentary.append", "session.thinking.append", "session.instructions.append"):
            self.emit({"type": kind_ + "ed", "client_event_id": event.get("event_id"), "start_ms": self.now_ms(),
                       "end_ms": self.now_ms()})  # fmt: skip
            sent = self.delegated.pop(event.get("delegation_id") or "", None)
            if sent is not None and self.peer.state["delegating"]:
                self.peer.turnaround.append((now / 1e6 - sent) * 1000)
            if kind_ == "session.commentary.append" and self.responses == 0:
                self.start_response()  # the notice

    def now_ms(self) -> int:
        return round((time.monotonic() - self.t0) * 1000)

    def delegate(self) -> None:
        """The caller asks, the model delegates (GPT-Live sockets only)."""
        end = self.now_ms()
        self.emit({"type": "session.input_transcript.delta", "delta": "what's on my list ", "start_ms": end - 600,
                   "end_ms": end})  # fmt: skip
        ident = f"dlg_{self.index}_{len(self.delegated)}_{end}"
        self.delegated[ident] = now_us() / 1e6
        self.emit({"type": "session.delegation.created", "offset_ms": end,
                   "delegation": {"id": ident, "target": "client", "type": "delegation"}})  # fmt: skip

    def audio_in(self, payload: bytes, now: int) -> None:
        peer = self.peer
        measuring = peer.state["measuring"]
        if self.pcmu_in:
            if self.call is None or measuring:  # the tag is read to learn the call, then only to time it
                value = untag_value(payload)
                if value is not None:
                    if self.call is None:
                        self.call = value >> 32
                    lat = ((now - value) & 0xFFFFFFFF) / 1000
                    if measuring and lat < 10_000:
                        peer.in_lat.append(lat)
            if not measuring:
                return
            peer.ms_in += len(payload) * 3 / 4 / 8
            pcm = peer.ulaw2lin(_a2b(payload), 2)
        else:
            if not measuring:
                return
            pcm = _a2b(payload)
            peer.ms_in += len(pcm) / 48  # 24 kHz, 16-bit
        if peer.onsets.rising(self.index, pcm) and self.call is not None:
            peer.seen.setdefault(self.call, []).append(now / 1e6)

    def start_response(self) -> None:
        if self.streaming is not None:
            self.emit({"type": "error", "error": {"type": "invalid_request_error",
                       "code": "conversation_already_has_active_response", "message": "busy"}})  # fmt: skip
            return
        self.responses += 1
        rid, item = f"resp_{self.index}_{self.responses}", f"item_{self.index}_{self.responses}"
        if not self.live:
            self.emit({"type": "response.created", "response": {"id": rid, "object": "realtime.response",
                       "status": "in_progress", "output": []}})  # fmt: skip
        # Pepper's first response is its opening notice (100 ms); every other one streams until cancelled.
        self.left = 5 if self.responses == 1 and self.level["mode"] != "pipecat" else None
        self.streaming, self.item, self.chunk = rid, item, 0
        if self.live:
            self.delta_head = b'{"type":"session.output_audio.delta","event_id":"d_' + str(self.index).encode() + b"_"
        else:
            self.delta_head = (b'{"type":"response.output_audio.delta","response_id":"' + rid.encode()
                               + b'","item_id":"' + item.encode() + b'","output_index":0,"content_index":0,'
                               + b'"event_id":"d_' + str(self.index).encode() + b"_")  # fmt: skip
        self.peer.groups[self.index % SLOTS].append(self)

    def stop_stream(self) -> None:
        if self.streaming is not None:
            group = self.peer.groups[self.index % SLOTS]
            if self in group:
                group.remove(self)

    def end_response(self, status: str) -> None:
        rid, item = self.streaming, self.item
        self.stop_stream()
        self.streaming = None
        if self.live:
            # No done events: the output pauses. After the notice a reply streams unprompted, once
            # the pause has told Pepper the notice ended.
            if status == "completed" and self.level["mode"] == "pepper" and self.responses == 1:
                asyncio.get_running_loop().call_later(0.5, self.start_response)
            return
        if status == "completed":
            self.emit({"type": "response.output_audio.done", "response_id": rid, "item_id": item})
            self.emit({"type": "response.output_audio_transcript.done", "response_id": rid, "item_id": item,
                       "transcript": "Hi, this call is transcribed."})  # fmt: skip
        self.emit({"type": "response.done", "response": {"id": rid, "object": "realtime.response", "status": status,
                   "output": [{"type": "message", "id": item, "role": "assistant"}]}})  # fmt: skip
        if status == "completed" and self.level["mode"] != "pipecat" and self.responses == 1:
            self.start_response()  # after the notice, a reply streams unprompted (as after server VAD)

    def tick(self) -> None:
        t = self.t
        if t is None or t.is_disconnected or self.streaming is None:
            return
        peer = self.peer
        self.chunk += 1
        n = self.chunk
        phase = n % BURST_EVERY
        now = now_us()
        if phase == 0 and peer.state["measuring"] and self.call is not None:
            peer.sent.setdefault(self.call, []).append(now / 1e6)
        loud = phase < BURST_FRAMES
        if self.pcmu_out:
            audio = tag_b64(self.call or 0, now) + (peer.tone_rest if loud else peer.silence_rest)
        else:
            audio = peer.tone_pcm_b64 if loud else peer.silence_pcm_b64
        t.send(WSMsgType.TEXT, b"".join((self.delta_head, b"%d" % n, b'","delta":"', audio, b'"}')))
        if self.left is not None:
            self.left -= 1
            if self.left <= 0:
                self.end_response("completed")

    def speech_started(self) -> None:
        if self.live:  # caller words while it speaks: the model stops itself
            end = self.now_ms()
            self.emit({"type": "session.input_transcript.delta", "delta": "wait ", "start_ms": end - 200,
                       "end_ms": end})  # fmt: skip
            if self.streaming is not None:
                self.end_response("cancelled")
            return
        self.user_item += 1
        self.emit({"type": "input_audio_buffer.speech_started", "item_id": f"item_u{self.index}_{self.user_item}",
                   "audio_start_ms": 0})  # fmt: skip
        if self.streaming is not None:
            self.end_response("cancelled")  # interrupt_response


class ModelPeer:
    def __init__(self) -> None:
        from voice.codec import audioop

        self.audioop = audioop
        self.ulaw2lin = audioop.ulaw2lin
        tone, pcm = tone_frames()
        self.tone_rest, self.silence_rest = _rest_b64(tone), _rest_b64(b"\xff" * FRAME)
        self.tone_pcm_b64, self.silence_pcm_b64 = base64.b64encode(pcm), base64.b64encode(b"\0" * len(pcm))
        self.state: dict[str, Any] = {"measuring": False, "delegating": False}
        self.turnaround: list[float] = []
        self.level: dict[str, Any] = {"mode": "pepper"}
        self.sockets = 0
        self.level_base = 0  # sockets opened before this level
        self.conns: list[ModelConn] = []
        self.groups: list[list[ModelConn]] = [[] for _ in range(SLOTS)]
        self.onsets = Onsets()
        self.lag = Lag()
        self.stop = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        self.in_lat: list[float] = []
        self.seen: dict[int, list[float]] = {}
        self.sent: dict[int, list[float]] = {}
        self.lag.values = []
        self.ms_in = 0.0  # audio that reached the model

    def listener(self, request: WSUpgradeRequest) -> ModelConn | None:
        path = request.path.decode()
        if not path.startswith(("/v1/realtime", "/v1/live/sessions")) or "authorization" not in request.headers:
            return None
        return ModelConn(self, path)

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "level":
            # Sockets a previous level left open would be streamed to during this one: close them.
            left = [c for c in self.conns if c.t is not None and not c.t.is_disconnected]
            for conn in left:
                conn.stop_stream()
                conn.t.send_close()  # type: ignore[union-attr]
                conn.t.disconnect()  # type: ignore[union-attr]
            self.level = {"mode": cmd["mode"]}
            self.level_base = self.sockets
            return {"left_open": len(left)}
        if op == "measure":
            if cmd["on"]:
                self.reset()
            self.state["measuring"] = cmd["on"]
            return {"ok": True}
        if op == "speech_started":
            emitted = {}
            for conn in list(self.conns):
                if conn.call is not None:
                    emitted[conn.call] = now_us() / 1e6
                conn.speech_started()
            return {"emitted": emitted}
        if op == "delegate":
            self.turnaround, self.state["delegating"] = [], True
            live = [c for c in self.conns if c.live and c.t is not None and not c.t.is_disconnected]
            for conn in live:
                conn.delegate()
            return {"delegated": len(live)}
        if op == "delegations":
            return {"turnaround": self.turnaround}
        if op == "collect":
            return {"in": self.in_lat, "seen": self.seen, "sent": self.sent, "lag": self.lag.values,
                    "ms_in": self.ms_in, "sockets": len(self.conns)}  # fmt: skip
        raise ValueError(op)


async def _model_main() -> None:
    peer = ModelPeer()
    server = await ws_create_server(peer.listener, "127.0.0.1", 0, websocket_handshake_timeout=60)
    port = server.sockets[0].getsockname()[1]
    schedule = asyncio.get_running_loop().create_task(
        slot_schedule(peer.groups, peer.state, peer.lag, peer.stop), name="model-slots"
    )
    # The text model behind the delegated Pepper turns: one short answer per turn, at once.
    from core.testing.peers import OpenAIPeer, reply_text

    text = OpenAIPeer()
    await text.start()
    text.script(*[reply_text("You have two todos.")] * 20000)
    sys.stdout.write(f"ws://127.0.0.1:{port}/v1 {text.base_url}\n")
    sys.stdout.flush()
    try:
        await serve_commands(peer.run)
    finally:
        peer.stop.set()
        schedule.cancel()
        server.close()
        await text.close()


async def _callers_main() -> None:
    worker = CallerWorker()
    try:
        await serve_commands(worker.run)
    finally:
        worker.stop.set()


# --- The load side's own cost, without sockets (``--cost``) ----------------------------------------


class _Transport:
    """A picows transport that takes frames and drops them (its underlying transport too)."""

    is_disconnected = False

    def __init__(self) -> None:
        self.underlying_transport = self
        self.frames: list[bytes] = []

    def send(self, msg_type: Any, data: bytes) -> None:
        self.frames.append(data)

    def write(self, data: bytes) -> None:
        self.frames.append(data)


class _Frame:
    __slots__ = ("data", "msg_type")

    def __init__(self, data: bytes):
        self.msg_type = WSMsgType.TEXT
        self.data = data

    def get_payload_as_bytes(self) -> bytes:
        return self.data


def load_cost(module: Any, steps: int) -> float:
    """CPU (us) the load side's Python spends per 20 ms frame relayed, one way, measuring: per step
    a caller's frame sent and taken by the model, the model's frame sent and heard by the caller,
    a mark every 5th frame heard and echoed; the server's side replaced by frames built once."""
    worker, peer = module.CallerWorker(), module.ModelPeer()
    worker.state["measuring"] = peer.state["measuring"] = True
    call = module.Call(worker, 7, "CA" + "0" * 32, {})
    call.t = caller_t = _Transport()
    conn = module.ModelConn(peer, "/v1/realtime?model=gpt-realtime")
    conn.t = model_t = _Transport()
    conn.pcmu_in = conn.pcmu_out = True
    conn.call, conn.responses = 7, 1
    conn.start_response()  # streams until cancelled
    call.tick()
    conn.tick()
    sent = orjson.loads(caller_t.frames[-1].split(b"{", 1)[1].join((b"{", b"")))  # the caller's frame
    delta = orjson.loads(model_t.frames[-1])
    append = _Frame(APPEND + sent["media"]["payload"].encode() + b'"}')
    sid = call.sid.encode()
    media = _Frame(b'{"event":"media","streamSid":"' + sid + b'","media":{"payload":"' + delta["delta"].encode()
                   + b'"}}')  # fmt: skip
    marks = [_Frame(b'{"event":"mark","streamSid":"' + sid + b'","mark":{"name":"a%d"}}' % i) for i in range(steps)]
    start = time.process_time()
    for i in range(steps):
        call.tick()
        conn.on_ws_frame(model_t, append)
        conn.tick()
        call.on_ws_frame(caller_t, media)
        if i % 5 == 4:
            call.on_ws_frame(caller_t, marks[i])
        if i % 1000 == 999:
            caller_t.frames.clear()
            model_t.frames.clear()
    return (time.process_time() - start) / (2 * steps) * 1e6


def _module_at(rev: str) -> Any:
    import importlib.util
    import subprocess
    import types

    source = subprocess.run(["git", "show", f"{rev}:bench/call_load.py"], capture_output=True, text=True, check=True)
    module = types.ModuleType(f"call_load_{rev}")
    sys.modules[module.__name__] = module  # its dataclass-free classes still look themselves up
    exec(compile(source.stdout, f"{rev}:bench/call_load.py", "exec"), module.__dict__)  # our own file, as it was
    del importlib
    return module


def _cost_main(argv: list[str]) -> None:
    """``--cost [--against REV] [--steps N]``: :func:`load_cost` here and at a git revision, the
    best of 5 rounds each, interleaved."""
    rev = argv[argv.index("--against") + 1] if "--against" in argv else None
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 20_000
    cases = [("this tree", sys.modules[__name__])] + ([(rev, _module_at(rev))] if rev else [])
    best: dict[str, float] = {}
    for _ in range(5):
        for name, module in cases:
            best[name] = min(best.get(name, float("inf")), load_cost(module, steps))
    for name, _ in cases:
        print(f"{name:>12}: {best[name]:5.2f} us of the load side's Python per 20 ms frame relayed (no sockets)")


def _run() -> None:
    import uvloop

    uvloop.run(_model_main() if sys.argv[1:] == ["--model"] else _callers_main())


if __name__ == "__main__" and sys.argv[1:2] == ["--cost"]:
    _cost_main(sys.argv[2:])
elif __name__ == "__main__":
    profile_to = os.environ.get("PEPPER_BENCH_PROFILE")  # a path prefix: each load process's cProfile
    if profile_to:
        import cProfile

        cProfile.run("_run()", f"{profile_to}.{sys.argv[1].strip('-')}.{os.getpid()}.prof")
    else:
        _run()
