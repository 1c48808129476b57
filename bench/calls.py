"""Phone calls under load: what the media relay adds per 20 ms frame, in both directions, beside a
stock pipecat Twilio + OpenAI Realtime pipeline driven by the same loopback peers in the same run.

Processes: the server under test (Pepper as ``pepper serve`` builds it, over an embedded Postgres;
or the pipecat baseline under uvicorn, as pipecat's runner hosts its Twilio example), the loopback
OpenAI Realtime server (this process), and the loopback Twilio callers (worker processes, at most
100 calls each). No peer shares the server's process or event loop.

Two measures, both taken on arrival with the machine-wide monotonic clock:

* Per frame (pass-through only): every 20 ms frame starts with 11 near-silent mu-law bytes that
  carry the call and the send time. Pepper passes payloads through, so each frame's latency is
  read where it lands. pipecat decodes and resamples, which erases them.
* Onsets (both servers): every 400 ms a 40 ms tone burst; its rising edge is detected by level
  where it lands (decoded from mu-law, or 24 kHz PCM for pipecat) and joined with the latest burst
  sent on that call. This is the like-for-like figure the ratio uses. (Latencies above 400 ms
  would alias; they only occur long after the targets are missed.)

Barge-in: the model peer reports ``speech_started`` on every socket while a reply streams; Pepper's
time from that event to ``clear`` sent is read from its call stats, and the full hop (peer ->
server -> caller's ``clear``) is measured for both servers. CPU is the server process's over the
window, per call; RSS is the server's growth per call while the calls opened.

    PYTHONPATH=. .venv/bin/python bench/calls.py [--calls 1,50,100,300] [--seconds 5] [--baseline 1,50]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import statistics
import sys
import time
from typing import Any

TOKEN = "bench-twilio-token"
PUBLIC = "https://pepper.bench.example"
OWNER = "+14155552671"
LINE = "+14155550100"
PIN = "2468"
TAG_BYTES = 11  # 3 nibbles call index + 8 nibbles send time (us mod 2**32), each as 0xF0 | nibble
FRAME = 160
BURST_EVERY = 20  # frames: a burst each 400 ms
BURST_FRAMES = 2  # 40 ms of tone
LOUD = 1000  # RMS of 16-bit samples: the tone is ~5,600, silence plus tags under 100
CALLS_PER_WORKER = 100


def _now_us() -> int:
    return time.monotonic_ns() // 1000


def tag(call: int, us: int) -> bytes:
    value = (call & 0xFFF) << 32 | (us & 0xFFFFFFFF)
    return bytes(0xF0 | (value >> (4 * k)) & 0xF for k in range(TAG_BYTES - 1, -1, -1))


def untag(audio: bytes, now_us: int) -> tuple[int, float] | None:
    """(call, latency in ms) from a tagged frame, or None if the frame carries no tag."""
    if len(audio) < TAG_BYTES:
        return None
    value = 0
    for b in audio[:TAG_BYTES]:
        if b & 0xF0 != 0xF0:
            return None
        value = value << 4 | (b & 0xF)
    lat = ((now_us - value) & 0xFFFFFFFF) / 1000
    return (value >> 32, lat) if lat < 10_000 else None


def _tone_frames() -> tuple[bytes, bytes]:
    from voice.codec import audioop
    from voice.testing.realtime_peer import tone

    ulaw = tone(20, hz=700)
    pcm24, _ = audioop.ratecv(audioop.ulaw2lin(ulaw, 2), 2, 1, 8000, 24000, None)
    return ulaw, pcm24[:960].ljust(960, b"\0")


class Onsets:
    """Rising edges of the burst level, per stream."""

    def __init__(self) -> None:
        self.loud: dict[Any, bool] = {}

    def rising(self, key: Any, pcm16: bytes) -> bool:
        from voice.codec import audioop

        loud = audioop.rms(pcm16, 2) > LOUD if pcm16 else False
        was = self.loud.get(key, False)
        self.loud[key] = loud
        return loud and not was


def join_onsets(sent: dict[int, list[float]], seen: dict[int, list[float]]) -> list[float]:
    """Latency (ms) of each detected onset after the latest burst sent on its call, within 400 ms."""
    out: list[float] = []
    window = BURST_EVERY * 0.02
    for call, times in seen.items():
        sends = sorted(sent.get(call, ()))
        for t in times:
            i = bisect.bisect_right(sends, t) - 1
            if i >= 0 and t - sends[i] < window:
                out.append((t - sends[i]) * 1000)
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fmt(values: list[float]) -> str:
    if not values:
        return "         n/a"
    return f"{statistics.median(values):7.2f} / {_pct(values, 0.99):8.2f} ms (n={len(values)})"


# --- The servers under test ------------------------------------------------------------------


async def _serve_pepper(dsn: str, realtime_url: str) -> None:
    import logging

    from core.settings import Settings
    from core.store import Database
    from gateway.media_server import media_port
    from gateway.server import running_app

    logging.basicConfig(level=logging.ERROR)
    settings = Settings(
        database_url=dsn, public_url=PUBLIC, twilio_account_sid="AC" + "1" * 32, twilio_auth_token=TOKEN,
        openai_api_key="sk-bench", openai_realtime_url=realtime_url, port=0,
        voice_max_call_seconds=3600,
    )  # fmt: skip
    db = await Database.open(dsn, max_size=20)
    async with running_app(settings, db) as (app, port):
        print(f"ready http://127.0.0.1:{port} ws://127.0.0.1:{media_port(app.extensions['pepper'].media)}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await db.close()


def _serve_pipecat(realtime_url: str) -> None:
    """The baseline: pipecat's Twilio + OpenAI Realtime example as its runner hosts it (FastAPI on
    uvicorn, ``parse_telephony_websocket``, ``TwilioFrameSerializer``), unchanged but for the
    model URL (the loopback peer; the call index in the path tells the peer which call it is)."""
    import logging
    import socket
    import threading

    import uvicorn
    from fastapi import FastAPI, WebSocket
    from loguru import logger
    from pipecat.frames.frames import LLMRunFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.runner.utils import parse_telephony_websocket
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.services.openai.realtime.events import (
        AudioConfiguration,
        AudioInput,
        InputAudioTranscription,
        SemanticTurnDetection,
        SessionProperties,
    )
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
    from pipecat.workers.runner import WorkerRunner

    logger.remove()
    logging.basicConfig(level=logging.ERROR)
    app = FastAPI()

    async def media(websocket: WebSocket) -> None:
        await websocket.accept()
        _, call_data = await parse_telephony_websocket(websocket)
        serializer = TwilioFrameSerializer(
            stream_sid=call_data["stream_id"], call_sid=call_data["call_id"],
            params=TwilioFrameSerializer.InputParams(auto_hang_up=False),  # no Twilio REST here
        )  # fmt: skip
        transport = FastAPIWebsocketTransport(
            websocket=websocket,
            params=FastAPIWebsocketParams(
                audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False, serializer=serializer
            ),
        )
        llm = OpenAIRealtimeLLMService(
            api_key="sk-bench",
            base_url=f"{realtime_url}/realtime/c{call_data['body'].get('bench_call', '0')}",
            settings=OpenAIRealtimeLLMService.Settings(
                system_instruction="You are a helpful and friendly AI. Keep your responses short.",
                session_properties=SessionProperties(
                    audio=AudioConfiguration(
                        input=AudioInput(
                            transcription=InputAudioTranscription(), turn_detection=SemanticTurnDetection()
                        )
                    )
                ),
            ),
        )
        context = LLMContext([{"role": "developer", "content": "Say hello!"}])
        user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
        pipeline = Pipeline([transport.input(), user_aggregator, llm, transport.output(), assistant_aggregator])
        worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True, enable_usage_metrics=True))
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)

        @transport.event_handler("on_client_connected")
        async def on_client_connected(transport, client):  # type: ignore[no-untyped-def]
            await worker.queue_frames([LLMRunFrame()])

        @transport.event_handler("on_client_disconnected")
        async def on_client_disconnected(transport, client):  # type: ignore[no-untyped-def]
            await runner.cancel()

        await runner.run()

    # Starlette's route (no FastAPI dependency injection, which cannot see this function's local imports).
    app.router.add_websocket_route("/media", media)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
    threading.Thread(target=lambda: (sys.stdin.read(), setattr(server, "should_exit", True)), daemon=True).start()
    print(f"ready http://127.0.0.1:{port} ws://127.0.0.1:{port}", flush=True)
    server.run(sockets=[sock])


# --- Caller workers (their own processes) ----------------------------------------------------


async def _caller_worker() -> None:
    from voice.codec import audioop
    from voice.testing.twilio_caller import Answer, TwilioCaller, new_sid

    tone_ulaw, _ = _tone_frames()
    silence = b"\xff" * FRAME
    onsets = Onsets()
    state: dict[str, Any] = {"measuring": False}
    calls: dict[int, Any] = {}
    failed: list[int] = []
    contexts: list[Any] = []
    out_lat: list[float] = []
    burst_sent: dict[int, list[float]] = {}
    burst_seen: dict[int, list[float]] = {}
    clears: dict[int, list[float]] = {}

    def frame_hook(i: int):  # type: ignore[no-untyped-def]
        def frame(n: int) -> bytes:
            now = _now_us()
            phase = n % BURST_EVERY
            if phase == 0 and state["measuring"]:
                burst_sent.setdefault(i, []).append(now / 1e6)
            return tag(i, now) + (tone_ulaw if phase < BURST_FRAMES else silence)[TAG_BYTES:]

        return frame

    def media_hook(i: int):  # type: ignore[no-untyped-def]
        def heard(audio: bytes) -> None:
            now = _now_us()
            if not state["measuring"]:
                onsets.rising(i, audioop.ulaw2lin(audio, 2))
                return
            tagged = untag(audio, now)
            if tagged is not None:
                out_lat.append(tagged[1])
            if onsets.rising(i, audioop.ulaw2lin(audio, 2)):
                burst_seen.setdefault(i, []).append(now / 1e6)

        return heard

    async def open_one(i: int, cmd: dict[str, Any], limit: asyncio.Semaphore) -> None:
        caller = TwilioCaller(TOKEN, local=cmd["http"], public=PUBLIC, media_local=cmd["media"])
        async with limit:
            if cmd["mode"] == "pepper":
                answer = await caller.dial(from_=OWNER, to=LINE)
            else:
                answer = Answer(200, "", new_sid("CA"), stream_url=PUBLIC.replace("https", "wss") + "/media",
                                parameters={"bench_call": str(i)})  # fmt: skip
            ctx = caller.media(answer, signature=None if cmd["mode"] == "pepper" else "")
            call = await ctx.__aenter__()
            contexts.append(ctx)
            call.frame_hook = frame_hook(i)
            call.media_hook = media_hook(i)
            try:
                if cmd["mode"] == "pepper":
                    await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=60, what="notice")
                else:
                    await call.wait(lambda: call.received_media_bytes > 0, within=60, what="first audio")
            except AssertionError:
                failed.append(i)  # reported; the level goes on with the calls that opened
                await call.hang_up()
                return
            calls[i] = call

    async def run(cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "open":
            limit = asyncio.Semaphore(10)
            failed.clear()
            await asyncio.gather(*(open_one(i, cmd, limit) for i in cmd["calls"]))
            return {"ok": len(calls), "failed": len(failed)}
        if op == "measure":
            state["measuring"] = cmd["on"]
            return {"ok": True}
        if op == "marks":
            return {"clears": {i: len(c.clears) for i, c in calls.items()}}
        if op == "collect":
            before = cmd["clears_before"]
            for i, call in calls.items():
                try:
                    await call.wait(lambda c=call, i=i: len(c.clears) > before[str(i)], within=20, what="clear")
                except AssertionError:
                    continue  # never cleared: no hop for this call
                clears[i] = list(call.clears[before[str(i)] :])
            return {"out": out_lat, "sent": burst_sent, "seen": burst_seen, "clears": clears}
        if op == "hangup":
            for call in calls.values():
                await call.hang_up()
            for ctx in contexts:
                await ctx.__aexit__(None, None, None)
            calls.clear(), contexts.clear(), out_lat.clear(), burst_sent.clear(), burst_seen.clear(), clears.clear()
            return {"ok": True}
        raise ValueError(op)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        print(json.dumps(await run(json.loads(line))), flush=True)


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def start(cls, env: dict[str, str]) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--callers", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=env, limit=2**26,
        )  # fmt: skip
        worker = cls(proc)
        await worker.reply()
        return worker

    async def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a caller worker died")
        return json.loads(line)

    async def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.reply()

    async def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self.proc.wait()


# --- The model side and one level ------------------------------------------------------------


class ModelSide:
    """Hooks on the loopback Realtime server: per-frame tags and onsets in, tagged bursts out."""

    def __init__(self, peer: Any):
        from voice.codec import audioop

        self.peer = peer
        self.audioop = audioop
        self.tone_ulaw, self.tone_pcm = _tone_frames()
        self.measuring = False
        self.call_of: dict[int, int] = {}
        self.onsets = Onsets()
        self.in_lat: list[float] = []
        self.seen: dict[int, list[float]] = {}
        self.sent: dict[int, list[float]] = {}
        self.chunks: dict[int, int] = {}
        peer.audio_hook = self.got
        peer.delta_hook = self.sends

    def reset(self) -> None:
        self.in_lat, self.seen, self.sent = [], {}, {}

    def _call(self, index: int) -> int | None:
        if index not in self.call_of:
            path = self.peer.sessions[index].path.split("?", 1)[0]
            if path.startswith("/v1/realtime/c"):
                self.call_of[index] = int(path.rsplit("/c", 1)[1])
        return self.call_of.get(index)

    def got(self, index: int, audio: bytes) -> None:
        now = _now_us()
        rec = self.peer.sessions[index]
        if rec.audio_format("input") == "audio/pcmu":
            tagged = untag(audio, now)
            if tagged is not None:
                self.call_of.setdefault(index, tagged[0])
                if self.measuring:
                    self.in_lat.append(tagged[1])
            pcm = self.audioop.ulaw2lin(audio, 2)
        else:
            pcm = audio
        if self.onsets.rising(index, pcm) and self.measuring and (call := self._call(index)) is not None:
            self.seen.setdefault(call, []).append(now / 1e6)

    def sends(self, index: int, part: bytes) -> bytes:
        now = _now_us()
        n = self.chunks[index] = self.chunks.get(index, -1) + 1
        phase = n % BURST_EVERY
        call = self._call(index)
        if phase == 0 and self.measuring and call is not None:
            self.sent.setdefault(call, []).append(now / 1e6)
        if self.peer.sessions[index].audio_format("output") != "audio/pcmu":
            return self.tone_pcm if phase < BURST_FRAMES else b"\0" * len(self.tone_pcm)
        body = self.tone_ulaw if phase < BURST_FRAMES else b"\xff" * FRAME
        return tag(call or 0, now) + body[TAG_BYTES:]


async def run_level(
    mode: str, count: int, seconds: float, side: ModelSide, workers: list[Worker], server: Any, http: str, media: str
) -> dict[str, Any]:
    import psutil

    from voice.testing.realtime_peer import speak

    peer = side.peer
    side.reset()
    peer._responses.clear()  # nothing left over from the previous level
    first = len(peer.sessions)
    long_reply = speak("reply", ms=int((seconds + 30) * 1000))
    peer.script(*[speak("notice", ms=100) if mode == "pepper" else long_reply for _ in range(count)])
    rss0 = server.memory_info().rss
    share = [list(range(count))[w :: len(workers)] for w in range(len(workers))]
    busy = [(w, s) for w, s in zip(workers, share, strict=True) if s]
    opened = await asyncio.gather(*(w.ask(op="open", mode=mode, calls=s, http=http, media=media) for w, s in busy))
    rss1 = server.memory_info().rss
    sockets = list(range(first, len(peer.sessions)))
    if mode == "pepper":  # after the notice, every model socket streams a reply in real time
        peer.script(*[long_reply for _ in sockets])
        for index in sockets:
            await peer.respond(index)
    await asyncio.sleep(1.0)
    generator = [psutil.Process(), *(psutil.Process(w.proc.pid) for w, _ in busy)]
    gen0 = sum(sum(p.cpu_times()[:2]) for p in generator)
    cpu0, t0 = server.cpu_times(), time.perf_counter()
    side.measuring = True
    await asyncio.gather(*(w.ask(op="measure", on=True) for w, _ in busy))
    await asyncio.sleep(seconds)
    side.measuring = False
    await asyncio.gather(*(w.ask(op="measure", on=False) for w, _ in busy))
    cpu1, t1 = server.cpu_times(), time.perf_counter()
    gen1 = sum(sum(p.cpu_times()[:2]) for p in generator)
    before = [await w.ask(op="marks") for w, _ in busy]
    emitted: dict[int, float] = {}
    for index in sockets:
        call = side._call(index)
        if call is not None:
            emitted[call] = time.monotonic()
        await peer.speech_started(index)
    got = [await w.ask(op="collect", clears_before=b["clears"]) for (w, _), b in zip(busy, before, strict=True)]
    await asyncio.gather(*(w.ask(op="hangup") for w, _ in busy))
    out_lat = [v for g in got for v in g["out"]]
    sent_in = {int(k): v for g in got for k, v in g["sent"].items()}
    seen_out = {int(k): v for g in got for k, v in g["seen"].items()}
    hops = [(g["clears"][k][0] - emitted[int(k)]) * 1000 for g in got for k in g["clears"] if int(k) in emitted]
    busy_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "mode": mode,
        "calls": count,
        "in_frame": list(side.in_lat),
        "out_frame": out_lat,
        "in_onset": join_onsets(sent_in, side.seen),
        "out_onset": join_onsets(side.sent, seen_out),
        "hop": hops,
        "cpu_per_call": busy_cpu / (t1 - t0) / count,
        "rss_per_call_kb": (rss1 - rss0) / 1e3 / count,
        "rss_mb": rss1 / 1e6,
        "load": os.getloadavg()[0],
        "generator": (gen1 - gen0) / (t1 - t0),
        "failed": sum(o["failed"] for o in opened),
    }


async def _pepper_clear_ms(db: Any, count: int) -> list[float]:
    stats: list[dict[str, Any]] = []
    for _ in range(200):
        rows = await db.fetch(
            "SELECT stats FROM calls WHERE route = 'owner' AND ended_at IS NOT NULL ORDER BY started_at DESC LIMIT $1",
            count,
        )
        stats = [json.loads(r["stats"]) for r in rows if r["stats"]]
        if len(stats) == count and all(s.get("clear_ms") for s in stats):
            break
        await asyncio.sleep(0.05)
    return [v for s in stats for v in s.get("clear_ms", ())]


def report(r: dict[str, Any], base: dict[str, Any] | None, clear_ms: list[float] | None) -> None:
    name = "Pepper" if r["mode"] == "pepper" else "pipecat baseline"
    print(f"\n{r['calls']} concurrent call(s), {name}  (median / p99)")
    if r["failed"]:
        print(f"  {r['failed']} call(s) never started (no opening audio within 60 s); measured without them")
    if r["mode"] == "pepper":
        print(f"  caller -> model, per frame   {_fmt(r['in_frame'])}")
        print(f"  model -> caller, per frame   {_fmt(r['out_frame'])}")
    print(f"  caller -> model, onsets      {_fmt(r['in_onset'])}")
    print(f"  model -> caller, onsets      {_fmt(r['out_onset'])}")
    if clear_ms is not None:
        print(f"  speech_started -> clear      {_fmt(clear_ms)}  (inside Pepper)")
    print(f"  barge-in, full hop           {_fmt(r['hop'])}  (peer -> server -> caller's clear)")
    cpu = r["cpu_per_call"]
    print(f"  server CPU {cpu * 1000:.1f} ms per call-second ({cpu * 100:.2f}% of a core); RSS {r['rss_mb']:.0f} MB,"
          f" {r['rss_per_call_kb']:+.0f} kB per call")  # fmt: skip
    print(f"  load generator (callers + model peer) {r['generator'] * 100:.0f}% of a core;"
          f" machine load average {r['load']:.1f}")  # fmt: skip
    if base is not None:
        for key, label in (("in_onset", "caller -> model"), ("out_onset", "model -> caller")):
            mine, theirs = r[key], base[key]
            if mine and theirs:
                print(f"  {label}: baseline / Pepper = {statistics.median(theirs) / statistics.median(mine):.1f}x"
                      f" at the median, {_pct(theirs, 0.99) / _pct(mine, 0.99):.1f}x at p99")  # fmt: skip


def _p99_both(r: dict[str, Any]) -> float:
    keys = ("in_frame", "out_frame") if r["mode"] == "pepper" else ("in_onset", "out_onset")
    return max(_pct(r[k], 0.99) if r[k] else math.inf for k in keys)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="1,50,100,300")
    parser.add_argument("--baseline", default="1,50", help="call counts for the pipecat baseline")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    levels = [int(c) for c in args.calls.split(",")]
    base_levels = {int(c) for c in args.baseline.split(",") if c}

    import psutil

    from core import identity
    from core.store import Database
    from core.testing.postgres import DatabaseFactory, test_server
    from voice.testing.realtime_peer import RealtimePeer

    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONWARNINGS="ignore")
    with test_server() as admin:
        factory = DatabaseFactory(admin)
        await factory.prepare_template()
        dsn = await factory.create()
        db = await Database.open(dsn, max_size=4)
        ada = await identity.create_account(db, "Ada")
        await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
        await identity.set_pin(db, ada.id, PIN)
        await identity.assign_line(db, LINE, "personal", ada.id)
        procs: list[Any] = []
        workers: list[Worker] = []
        async with RealtimePeer(chunk_ms=20, pace=0.02, vad=False) as peer:
            side = ModelSide(peer)
            argv = {
                "pepper": [__file__, "--serve", dsn, peer.websocket_url],
                "pipecat": [__file__, "--pipecat", peer.websocket_url],
            }
            servers: dict[str, Any] = {}
            endpoints: dict[str, tuple[str, str]] = {}
            try:
                for mode in ("pepper", "pipecat") if base_levels else ("pepper",):
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable, *argv[mode], stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        env=env,
                    )  # fmt: skip
                    procs.append(proc)
                    assert proc.stdout is not None
                    line = (await proc.stdout.readline()).decode().split()
                    assert line[:1] == ["ready"], line
                    servers[mode], endpoints[mode] = psutil.Process(proc.pid), (line[1], line[2])
                n_workers = max(1, math.ceil(max(levels) / CALLS_PER_WORKER))
                workers = list(await asyncio.gather(*(Worker.start(env) for _ in range(n_workers))))
                print(f"{os.cpu_count()} cores; server, model peer and {n_workers} caller worker(s) in separate"
                      f" processes; {args.seconds:.0f} s windows")  # fmt: skip
                results: list[dict[str, Any]] = []
                for count in levels:
                    mine = await run_level("pepper", count, args.seconds, side, workers, servers["pepper"],
                                           *endpoints["pepper"])  # fmt: skip
                    theirs = None
                    if count in base_levels:
                        theirs = await run_level("pipecat", count, args.seconds, side, workers, servers["pipecat"],
                                                 *endpoints["pipecat"])  # fmt: skip
                    report(mine, theirs, await _pepper_clear_ms(db, count))
                    if theirs is not None:
                        report(theirs, None, None)
                    results.append(mine)
                held = [r["calls"] for r in results if _p99_both(r) <= 20.0]
                passed = next((r["calls"] for r in results if _p99_both(r) > 20.0), None)
                print(f"\nLargest call count run before p99 passed 20 ms (per frame, both ways): "
                      f"{max((c for c in held if passed is None or c < passed), default=0)}"
                      + (f" (passed at {passed})" if passed else " (never passed)"))  # fmt: skip
            finally:
                for worker in workers:
                    await worker.stop()
                for proc in procs:
                    if proc.stdin is not None:
                        proc.stdin.close()
                    try:
                        await asyncio.wait_for(proc.wait(), 20)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()
        await db.close()
        await factory.drop(dsn)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        asyncio.run(_serve_pepper(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--pipecat":
        _serve_pipecat(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "--callers":
        asyncio.run(_caller_worker())
    else:
        asyncio.run(main())
