"""Phone calls under load: what the media relay adds per 20 ms frame, in both directions, beside a
stock pipecat Twilio + OpenAI Realtime pipeline driven by the same loopback peers in the same run.

Processes: the server under test (Pepper as ``pepper serve`` builds it, on uvloop, over an
embedded Postgres; or the pipecat baseline under uvicorn, as pipecat's runner hosts its Twilio
example); the loopback OpenAI Realtime model; the loopback Twilio callers (worker processes, at
most 100 calls each). The model and the callers are ``bench/call_load.py``: uvloop and picows,
frames pre-encoded, no JSON work per audio frame. No peer shares the server's process or event loop.

Two measures, both taken on arrival with the machine-wide monotonic clock:

* Per frame (pass-through only): every 20 ms frame starts with 12 near-silent mu-law bytes that
  carry the call and the send time. Pepper passes payloads through, so each frame's latency is
  read where it lands. pipecat decodes and resamples, which erases them.
* Onsets (both servers): every 400 ms a 40 ms tone burst; its rising edge is detected by level
  where it lands (decoded from mu-law, or 24 kHz PCM for pipecat) and joined with the latest burst
  sent on that call. This is the like-for-like figure the ratio uses. (Latencies above 400 ms
  would alias; they only occur long after the targets are missed.)

Barge-in: the model reports ``speech_started`` on every socket while a reply streams; Pepper's
time from that event to ``clear`` sent is read from its call stats, and the full hop (model ->
server -> caller's ``clear``) is measured for both servers.

Cost: server CPU from /proc over the window, as ms of CPU per call-second and us per relayed frame;
RSS growth per call while the calls opened. The load side's own CPU (model + callers) and how late
its 2 ms send slots fired are printed beside them, so a reader can tell a slow server from a
starved generator. The load side runs at ``--load-nice`` (default +10): it stands in for Twilio's
and OpenAI's machines, which take no CPU from the server, so when both want a core the server is
served first (on this 2-core machine, 100 calls gave p99 18.4 and 7.3 ms with the load at the
server's priority, 4.7 and 3.7 ms at +10, run alternately). Latency is still read where the load
side receives a frame, so any delay of its own is counted against the server. Every level is
bounded (opening, measuring, collecting): a level that cannot be sustained says what it got and
the run goes on.

GPT-Live (``--engines openai-realtime,gpt-live``, the default): a second Pepper server whose calls
run on the gpt-live engine against the same model process (which speaks GPT-Live too), measured
at the same levels in the same run: the same per-frame figures both ways, the barge-in hop, and
the delegation turnaround (``session.delegation.created`` sent -> the first result appended for
it, read where it lands in the model process; and Pepper's own time for it from the call stats)
with the delegated Pepper turns answered at once by a loopback text model.

Pepper holds its calls in the web server's event loop (``--media-processes 1``) or in N media
processes as ``pepper serve`` runs them (``--media-processes 2``); ``--media-processes 1,2`` runs
both, side by side at each level, so the comparison is made under the same machine load. Server
CPU and memory are those of the server and its media processes together.

Capacity per server core (``--pin``): the server under test (its web server, media processes and
the embedded Postgres it uses) is pinned to core 0 and everything else (the model, the callers and
this driver) to core 1 (``sched_setaffinity``), so neither side takes CPU from the other and the
figure is what one server core holds. Both servers, Pepper's and pipecat's, are pinned the same
way in the same run. The closing lines give, per server, the most calls one core held with p99 at
or under 20 ms (per frame both ways for Pepper, onsets for pipecat) and no audio lost, its CPU
seconds per call-minute and its RSS per call there, and how busy the load side's core was (a load
side near 100 % is the limit, not the server), with the CPU per 20 ms relayed of both sides, and
for the first level that missed, why (p99, or audio lost). Pinned, the load side runs at the
server's priority (``--load-nice 0``: on its own core it takes nothing from the server) and in
fewer caller processes (250 calls each: on one core more processes only add wake-ups).

``--against TREE[,TREE]``: the Pepper servers of other source trees (an export of main, say,
``git archive main | tar -x -C /tmp/main``) run beside this tree's at every level with the same
load side, so a change's CPU per frame is compared in one run on one machine's load.
``PEPPER_BENCH_PROFILE=PREFIX`` writes a cProfile of each server and load process
(``PREFIX.<role>.<pid>.prof``).

    PYTHONPATH=. .venv/bin/python bench/calls.py [--calls 1,50,100,300] [--seconds 5] [--baseline 1,50]
                                                 [--media-processes 1,2] [--load-nice 10] [--pin]
                                                 [--against TREE]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from core.testing.figures import percentile as _pct

TOKEN = "bench-twilio-token"
PUBLIC = "https://pepper.bench.example"
OWNER = "+14155552671"
LINE = "+14155550100"
PIN = "2468"
BURST_EVERY = 20  # frames: a burst each 400 ms (as in bench/call_load.py)
CALLS_PER_WORKER = 100
# Pinned, every load process shares one core: more of them only adds wake-ups and switches.
CALLS_PER_WORKER_PINNED = 250
LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "call_load.py")


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


def _fmt(values: list[float]) -> str:
    if not values:
        return "         n/a"
    return f"{statistics.median(values):7.2f} / {_pct(values, 0.99):8.2f} ms (n={len(values)})"


# --- The servers under test ------------------------------------------------------------------


async def _serve_pepper(
    dsn: str, realtime_url: str, media_processes: int, engine: str = "openai-realtime", text_url: str | None = None
) -> None:
    """Pepper as ``pepper serve`` runs it: with ``media_processes`` > 1 the calls are held by that
    many media processes (``gateway.media_procs``), else by the web server's own event loop."""
    import logging

    from core.settings import Settings
    from core.store import Database
    from gateway.composition import freeze_startup_objects
    from gateway.media_server import media_port
    from gateway.server import running_app

    logging.basicConfig(level=logging.ERROR)
    # "openai-realtime-untaped": the same engine with the calls' replay recording off, to show its cost.
    taped = not engine.endswith("-untaped")
    engine = engine.removesuffix("-untaped")
    settings = Settings(
        database_url=dsn, public_url=PUBLIC, twilio_account_sid="AC" + "1" * 32, twilio_auth_token=TOKEN,
        openai_api_key="sk-bench", openai_realtime_url=realtime_url, port=0,
        voice_max_call_seconds=3600, log_level="ERROR", voice_engine=engine, gpt_live_url=realtime_url,
        openai_base_url=text_url, memory_jobs_interval=0, voice_record_calls=taped,
        voice_notice_audio="model",  # the notice is off the frame path
    )  # fmt: skip
    db = await Database.open(dsn, max_size=20)
    async with running_app(settings, db, media_processes=media_processes) as (app, port):
        await freeze_startup_objects()  # as ``pepper serve`` does once started
        services = app.extensions["pepper"]
        media = services.settings.media_port if services.media is None else media_port(services.media)
        print(f"ready http://127.0.0.1:{port} ws://127.0.0.1:{media}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await db.close()


class ServerGroup:
    """The server's process and its children (the media processes), summed: CPU and memory of
    Pepper as a whole, however many processes hold its calls."""

    def __init__(self, pid: int):
        import psutil

        self._root = psutil.Process(pid)

    def _members(self) -> list[Any]:
        return [self._root, *self._root.children(recursive=True)]

    def cpu_times(self) -> Any:
        import types

        user = system = 0.0
        for p in self._members():
            try:
                t = p.cpu_times()
            except Exception:  # a child that just exited
                continue
            user, system = user + t.user, system + t.system
        return types.SimpleNamespace(user=user, system=system)

    def memory_info(self) -> Any:
        import types

        rss = 0
        for p in self._members():
            try:
                rss += p.memory_info().rss
            except Exception:
                continue
        return types.SimpleNamespace(rss=rss)


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


# --- The load processes and one level ----------------------------------------------------------


class Proc:
    """A load process (``bench/call_load.py``) driven by JSON lines; every question has a time limit."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.owed = 0  # answers still to come for questions that timed out

    @classmethod
    async def start(cls, env: dict[str, str], role: str, nice: int) -> tuple[Proc, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, LOAD, role, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=2**28, preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )  # fmt: skip
        self = cls(proc)
        first = await self._line(60)
        if role == "--model":
            url = first.decode().strip()
            await self._line(60)
            return self, url
        return self, ""

    async def _line(self, within: float) -> bytes:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), within)
        if not line:
            raise RuntimeError("a load process died")
        return line

    async def ask(self, within: float = 30.0, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        while self.owed:
            await self._line(within)
            self.owed -= 1
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        try:
            return json.loads(await self._line(within))
        except TimeoutError:
            self.owed += 1
            raise

    @property
    def cpu(self) -> float:
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    async def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def _keyed(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def _cpu_pressure() -> str:
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        return some[1].split("=")[1] + " %"
    except (OSError, IndexError):
        return "n/a"


async def run_level(
    mode: str,
    count: int,
    seconds: float,
    model: Proc,
    workers: list[Proc],
    server: Any,
    http: str,
    media: str,
    *,
    delegate: bool = False,
) -> dict[str, Any]:
    r: dict[str, Any] = {"mode": mode, "calls": count, "notes": [], "in_frame": [], "out_frame": [],
                         "in_onset": [], "out_onset": [], "hop": [], "lag": [], "failed": count,
                         "turnaround": []}  # fmt: skip
    open_within = 20 + 0.2 * count  # seconds for every call of the level to dial, connect and hear its opening
    left = (await model.ask(op="level", mode=mode))["left_open"]
    if left:
        r["notes"].append(f"{left} model socket(s) of the previous level were still open (closed now)")
    rss0 = server.memory_info().rss
    share = [list(range(count))[w :: len(workers)] for w in range(len(workers))]
    busy = [(w, s) for w, s in zip(workers, share, strict=True) if s]
    cmd = {"op": "open", "mode": mode, "http": http, "media": media, "token": TOKEN, "public": PUBLIC,
           "from": OWNER, "to": LINE, "open_within": open_within}  # fmt: skip
    t_open = time.monotonic()
    try:
        opened = await asyncio.gather(*(w.ask(within=open_within + 30, calls=s, **cmd) for w, s in busy))
    except TimeoutError:
        r["notes"].append(f"the callers did not answer within {open_within + 30:.0f} s of opening: level abandoned")
        return r
    r["open_s"] = time.monotonic() - t_open
    r["failed"] = sum(o["failed"] for o in opened)
    r["ok"] = count - r["failed"]
    r["rss_per_call_kb"] = (server.memory_info().rss - rss0) / 1e3 / max(1, r["ok"])
    if not r["ok"]:
        r["notes"].append(f"no call heard its opening within {open_within:.0f} s")
        await asyncio.gather(*(w.ask(op="hangup") for w, _ in busy), return_exceptions=True)
        return r
    generator = [model, *(w for w, _ in busy)]
    try:
        await asyncio.sleep(1.0)  # every call streaming both ways before the window opens
        gen0, cpu0, t0 = sum(p.cpu for p in generator), server.cpu_times(), time.perf_counter()
        await asyncio.gather(*(p.ask(op="measure", on=True) for p in generator))
        await asyncio.sleep(seconds)
        await asyncio.gather(*(p.ask(op="measure", on=False) for p in generator))
        cpu1, t1, gen1 = server.cpu_times(), time.perf_counter(), sum(p.cpu for p in generator)
        r["load"], r["pressure"] = os.getloadavg(), _cpu_pressure()
        before = [await w.ask(op="clears") for w, _ in busy]
        side = await model.ask(op="collect")
        emitted = {int(k): v for k, v in (await model.ask(op="speech_started"))["emitted"].items()}
        got = await asyncio.gather(*(w.ask(within=40, op="collect", clears_before=b["clears"], clear_within=10)
                                     for (w, _), b in zip(busy, before, strict=True)))  # fmt: skip
        if delegate:
            r["turnaround"] = await _delegations(model)
    except TimeoutError:
        r["notes"].append("a load process stopped answering while measuring: level abandoned")
        return r
    finally:
        try:
            await asyncio.gather(*(w.ask(within=60, op="hangup") for w, _ in busy))
        except TimeoutError:
            r["notes"].append("hanging up took over 60 s")
    window = t1 - t0
    busy_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    sent = sum(g["frames_sent"] for g in got) * 20
    heard = sum(g["ms_heard"] for g in got)
    callers_sent = {int(k): v for g in got for k, v in g["sent"].items()}
    callers_seen = {int(k): v for g in got for k, v in g["seen"].items()}
    r.update(
        in_frame=side["in"],
        out_frame=[v for g in got for v in g["out"]],
        in_onset=join_onsets(callers_sent, _keyed(side["seen"])),
        out_onset=join_onsets(_keyed(side["sent"]), callers_seen),
        hop=[(g["clears"][k] - emitted[int(k)]) * 1000 for g in got for k in g["clears"] if int(k) in emitted],
        lag=side["lag"] + [v for g in got for v in g["lag"]],
        cpu_ms_per_call_s=busy_cpu / window / r["ok"] * 1000,
        server_cores=busy_cpu / window,
        us_per_frame=busy_cpu / max(1, (side["ms_in"] + heard) / 20) * 1e6,
        rss_mb=server.memory_info().rss / 1e6,
        generator=(gen1 - gen0) / window,
        generator_us_per_frame=(gen1 - gen0) / max(1, (side["ms_in"] + heard) / 20) * 1e6,
        expected=r["ok"] * window * 1000,
        ms_sent=sent,
        ms_in=side["ms_in"],
        ms_heard=heard,
    )
    short = [(what, n) for what, n in (("sent by the callers", sent), ("reached the model", side["ms_in"]),
                                       ("reached the callers", heard)) if n < 0.9 * r["expected"]]  # fmt: skip
    if short:
        r["notes"].append(f"NOT SUSTAINED: of {r['expected'] / 1000:.0f} s of audio due each way, "
                          + ", ".join(f"{n / 1000:.0f} s {what}" for what, n in short))  # fmt: skip
    r["sustained"] = not short and r["failed"] == 0
    if r["lag"] and _pct(r["lag"], 0.99) > 20:
        r["notes"].append(f"the load generator fell behind: its send slots fired {_pct(r['lag'], 0.99):.0f} ms"
                          " late at p99, so latencies include its own queueing")  # fmt: skip
    return r


async def _delegations(model: Proc, within: float = 20.0) -> list[float]:
    """One delegation on every GPT-Live socket at once: each one's time to its first result."""
    sent = (await model.ask(op="delegate"))["delegated"]
    deadline = time.monotonic() + within
    while True:
        got = (await model.ask(op="delegations"))["turnaround"]
        if len(got) >= sent or time.monotonic() > deadline:
            return list(got)
        await asyncio.sleep(0.1)


async def _pepper_clear_ms(db: Any, count: int, since: Any, key: str = "clear_ms") -> list[float]:
    """The ``clear`` times (or another list of the call stats: ``key``) of the calls of the level
    that started at ``since`` (the database's clock)."""
    stats: list[dict[str, Any]] = []
    for _ in range(200):
        rows = await db.fetch(
            "SELECT stats FROM calls WHERE route = 'owner' AND ended_at IS NOT NULL AND started_at >= $2"
            " ORDER BY started_at DESC LIMIT $1",
            count,
            since,
        )
        stats = [json.loads(r["stats"]) for r in rows if r["stats"]]
        if len(stats) == count and all(s.get(key) for s in stats):
            break
        await asyncio.sleep(0.05)
    return [v for s in stats for v in s.get(key, ())]


def _name(media_processes: int, engine: str = "openai-realtime", tree: str = "") -> str:
    on = ("" if engine == "openai-realtime" else f" on {engine}") + (f" from {tree}" if tree else "")
    if media_processes == 1:
        return f"Pepper{on}, calls in the web server"
    return f"Pepper{on}, {media_processes} media processes"


SERVER_CORE, LOAD_CORE = 0, 1


def _pin_tree(pid: int, core: int) -> None:
    """Pin a process and its children (the media processes) to one core."""
    import psutil

    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            proc.cpu_affinity([core])


def _pin_postgres(dsn: str, core: int) -> None:
    """The embedded Postgres serves the server under test: it goes on the server's core (found by
    the port it listens on; pg_ctl detaches it from this driver)."""
    from urllib.parse import urlsplit

    import psutil

    port = urlsplit(dsn).port or 5432
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            _pin_tree(conn.pid, core)


def _capacity(name: str, runs: list[dict[str, Any]]) -> str:
    """What one pinned server core held: the largest count with p99 <= 20 ms and no audio lost,
    before the first count that missed; and why that one missed, with the load side's core use
    there (a load side near 100 % is the limit, not the server)."""
    missed = next((r for r in runs if _p99_both(r) > 20.0 or not r.get("sustained")), None)
    limit = missed["calls"] if missed is not None else math.inf
    held = [r for r in runs if _p99_both(r) <= 20.0 and r.get("sustained") and r["calls"] < limit]
    why = ""
    if missed is not None:
        p99 = _p99_both(missed)
        how = "not sustained" if not missed.get("sustained") else f"p99 {p99:.1f} ms"
        if not missed.get("sustained") and math.isfinite(p99):
            how += f", p99 {p99:.1f} ms"
        cost = f"; there {_cost(missed)}" if "generator" in missed else ""
        why = f" (missed at {missed['calls']}: {how}{cost})"
    if not held:
        return f"{name}: one server core held no level at p99 <= 20 ms" + why
    best = max(held, key=lambda r: r["calls"])
    return (
        f"{name}: one server core held {best['calls']} calls at p99 {_p99_both(best):.1f} ms, no audio lost;"
        f" {_cost(best)}" + (why or " (the highest level run)")
    )


def _cost(r: dict[str, Any]) -> str:
    return (
        f"{r['cpu_ms_per_call_s'] * 60 / 1000:.2f} CPU-s per call-minute, {r['us_per_frame']:.0f} us per 20 ms"
        f" relayed, {r['rss_per_call_kb']:+.0f} kB RSS per call; load side {r['generator'] * 100:.0f} % of its core,"
        f" {r['generator_us_per_frame']:.0f} us per 20 ms relayed"
    )


def report(
    r: dict[str, Any], base: dict[str, Any] | None, clear_ms: list[float] | None, own_ms: list[float] | None = None
) -> None:
    name = (
        _name(r["media_processes"], r.get("engine", "openai-realtime"), r.get("tree", ""))
        if r["mode"] == "pepper"
        else "pipecat baseline"
    )
    print(f"\n{r['calls']} concurrent call(s), {name}  (median / p99)")
    if r.get("open_s") is not None:
        print(f"  opened {r['ok']} of {r['calls']} in {r['open_s']:.1f} s"
              + (f"; {r['failed']} never heard their opening and were left out" if r["failed"] else ""))  # fmt: skip
    for note in r["notes"]:
        print(f"  {note}")
    if "generator" not in r:
        return
    if r["mode"] == "pepper":
        print(f"  caller -> model, per frame   {_fmt(r['in_frame'])}")
        print(f"  model -> caller, per frame   {_fmt(r['out_frame'])}")
    print(f"  caller -> model, onsets      {_fmt(r['in_onset'])}")
    print(f"  model -> caller, onsets      {_fmt(r['out_onset'])}")
    if clear_ms is not None:
        print(f"  speech_started -> clear      {_fmt(clear_ms)}  (inside Pepper)")
    print(f"  barge-in, full hop           {_fmt(r['hop'])}  (model -> server -> caller's clear)")
    if r.get("engine") == "gpt-live":
        print(f"  delegation -> first result   {_fmt(r['turnaround'])}  (model -> Pepper turn -> model)")
        print(f"  delegation, Pepper's own     {_fmt(own_ms or [])}  (inside Pepper, from the call stats)")
    due, sent, into, out = (r[k] / 1000 for k in ("expected", "ms_sent", "ms_in", "ms_heard"))
    print(f"  audio in the window: {due:.1f} s due each way; {sent:.1f} s sent by the callers,"
          f" {into:.1f} s reached the model, {out:.1f} s the callers")  # fmt: skip
    print(f"  server CPU {r['cpu_ms_per_call_s']:.1f} ms per call-second ({r['server_cores'] * 100:.0f} % of a core"
          f" in all), {r['us_per_frame']:.0f} us per 20 ms of audio relayed; RSS {r['rss_mb']:.0f} MB,"
          f" {r['rss_per_call_kb']:+.0f} kB per call")  # fmt: skip
    lag = f"{statistics.median(r['lag']):.1f} / {_pct(r['lag'], 0.99):.1f} ms" if r["lag"] else "n/a"
    print(f"  load generator (model + callers) {r['generator'] * 100:.0f} % of a core"
          f" ({r['generator'] * 1000 / r['ok']:.1f} ms per call-second, {r['generator_us_per_frame']:.0f} us per"
          f" 20 ms relayed), send slots late by {lag};"
          f" load average {r['load'][0]:.1f} / {r['load'][1]:.1f}, CPU pressure {r['pressure']}")  # fmt: skip
    if base is not None:
        for key, label in (("in_onset", "caller -> model"), ("out_onset", "model -> caller")):
            mine, theirs = r[key], base[key]
            if mine and theirs:
                print(f"  {label}: baseline / Pepper = {statistics.median(theirs) / statistics.median(mine):.1f}x"
                      f" at the median, {_pct(theirs, 0.99) / _pct(mine, 0.99):.1f}x at p99")  # fmt: skip


def _p99_both(r: dict[str, Any]) -> float:
    keys = ("in_frame", "out_frame") if r["mode"] == "pepper" else ("in_onset", "out_onset")
    return max(_pct(r[k], 0.99) if r[k] else math.inf for k in keys)


async def _start_server(argv: list[str], env: dict[str, str]) -> tuple[asyncio.subprocess.Process, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().split()
    assert line[:1] == ["ready"], line
    return proc, line[1], line[2]


async def _stop_server(proc: asyncio.subprocess.Process, within: float) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()


@asynccontextmanager
async def owner_database() -> AsyncIterator[tuple[str, Any, Any]]:
    """A fresh database on an embedded Postgres with the owner (their phone, PIN and line):
    ``(dsn, db, account)``; dropped afterwards."""
    from core import identity
    from core.store import Database
    from core.testing.postgres import DatabaseFactory, test_server

    with test_server() as admin:
        factory = DatabaseFactory(admin)
        await factory.prepare_template()
        dsn = await factory.create()
        db = await Database.open(dsn, max_size=4)
        try:
            ada = await identity.create_account(db, "Ada")
            await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
            await identity.set_pin(db, ada.id, PIN)
            await identity.assign_line(db, LINE, "personal", ada.id)
            yield dsn, db, ada
        finally:
            await db.close()
            await factory.drop(dsn)


def _trees(spec: str) -> list[str]:
    return [os.path.abspath(t) for t in spec.split(",") if t]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="1,50,100,300")
    parser.add_argument("--baseline", default="1,50", help="call counts for the pipecat baseline")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--load-nice",
        type=int,
        default=None,
        help="CPU niceness of the load side (0: the server's); default +10, and 0 with --pin (on its own core it"
        " takes nothing from the server, and at +10 any other process on that core would starve it)",
    )
    parser.add_argument(
        "--media-processes", default="1", help="media process counts to compare (1: calls in the web server)"
    )
    parser.add_argument(
        "--engines",
        default="openai-realtime,gpt-live",
        help="Pepper's engines, side by side (openai-realtime-untaped: without the calls' replay recording)",
    )
    parser.add_argument("--pin", action="store_true", help="server on core 0, the load side on core 1")
    parser.add_argument(
        "--against",
        default="",
        help="other source trees (comma-separated paths, e.g. an export of main): their Pepper servers run"
        " beside this tree's, each engine, at every level, with this tree's load side",
    )
    args = parser.parse_args()
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2 or not {SERVER_CORE, LOAD_CORE} <= os.sched_getaffinity(0):
            raise SystemExit("--pin needs cores 0 and 1")
        os.sched_setaffinity(0, {LOAD_CORE})  # this driver, and every process it starts, unless moved
    if args.load_nice is None:
        args.load_nice = 0 if args.pin else 10
    levels = [int(c) for c in args.calls.split(",")]
    args.against = _trees(args.against)
    base_levels = {int(c) for c in args.baseline.split(",") if c}
    media_counts = [int(c) for c in args.media_processes.split(",")]
    engines = args.engines.split(",")

    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONWARNINGS="ignore")
    async with owner_database() as (dsn, db, _owner):
        procs: list[asyncio.subprocess.Process] = []
        loads: list[Proc] = []
        try:
            model, urls = await Proc.start(env, "--model", args.load_nice)
            model_url, text_url = urls.split()
            loads.append(model)
            peppers: dict[tuple[str, int, str], tuple[asyncio.subprocess.Process, str, str]] = {}
            trees = ["", *args.against]
            for engine in engines:  # all up at once, so each level runs them back to back
                # GPT-Live beside Realtime at the first media process count.
                for n in media_counts if engine.startswith("openai-realtime") else media_counts[:1]:
                    for tree in trees:  # this tree's server, then the same from each other source tree
                        key = (engine, n, tree)
                        peppers[key] = await _start_server(["--serve", dsn, model_url, str(n), engine, text_url],
                                                           dict(env, PYTHONPATH=tree) if tree else env)  # fmt: skip
                        procs.append(peppers[key][0])
                        if args.pin:
                            _pin_tree(peppers[key][0].pid, SERVER_CORE)
            if args.pin:
                _pin_postgres(dsn, SERVER_CORE)
            per_worker = CALLS_PER_WORKER_PINNED if args.pin else CALLS_PER_WORKER
            n_workers = max(1, math.ceil(max(levels + list(base_levels)) / per_worker))
            workers = [
                p
                for p, _ in await asyncio.gather(
                    *(Proc.start(env, "--callers", args.load_nice) for _ in range(n_workers))
                )
            ]
            loads.extend(workers)
            print(f"{os.cpu_count()} cores; server, model and {n_workers} caller process(es) apart;"
                  f" {args.seconds:.0f} s windows; media processes {media_counts}; load side at nice"
                  f" +{args.load_nice}", flush=True)  # fmt: skip
            results: dict[tuple[str, int, str], list[dict[str, Any]]] = {key: [] for key in peppers}
            baseline_runs: list[dict[str, Any]] = []

            async def baseline(count: int) -> dict[str, Any]:
                # A fresh pipecat server per level, stopped after it: pipelines of calls that never
                # started go on resampling after the caller hung up and would load the next level.
                base, b_http, b_media = await _start_server(["--pipecat", model_url], env)
                if args.pin:
                    _pin_tree(base.pid, SERVER_CORE)
                try:
                    theirs = await run_level("pipecat", count, args.seconds, model, workers, ServerGroup(base.pid),
                                             b_http, b_media)  # fmt: skip
                finally:
                    await _stop_server(base, 5)
                baseline_runs.append(theirs)
                return theirs

            # A baseline level that is not a Pepper level runs on its own (pipecat's capacity is far lower).
            for count in sorted(set(levels) | base_levels):
                if count not in levels:
                    report(await baseline(count), None, None)
                    sys.stdout.flush()
                    continue
                for (engine, n, tree), (pepper, http, media) in peppers.items():
                    since = await db.fetchval("SELECT now()")
                    live = engine == "gpt-live"
                    mine = await run_level("pepper", count, args.seconds, model, workers, ServerGroup(pepper.pid),
                                           http, media, delegate=live)  # fmt: skip
                    mine["media_processes"], mine["engine"], mine["tree"] = n, engine, tree
                    theirs = None
                    if count in base_levels and n == media_counts[0] and not live and not tree:
                        theirs = await baseline(count)
                    own = await _pepper_clear_ms(db, mine.get("ok", 0), since, "delegation_ms") if live else None
                    report(mine, theirs, await _pepper_clear_ms(db, mine.get("ok", 0), since), own)
                    if theirs is not None:
                        report(theirs, None, None)
                    sys.stdout.flush()
                    results[engine, n, tree].append(mine)
            for (engine, n, tree), runs in results.items():
                held = [r["calls"] for r in runs if _p99_both(r) <= 20.0 and r.get("sustained")]
                passed = next((r["calls"] for r in runs if _p99_both(r) > 20.0 or not r.get("sustained")), None)
                print(f"\n{_name(n, engine, tree)}: largest call count run before p99 passed 20 ms (per frame, both"
                      " ways,"
                      f" sustained): {max((c for c in held if passed is None or c < passed), default=0)}"
                      + (f" (not met at {passed})" if passed else " (never passed)"))  # fmt: skip
            if args.pin:
                print("\nPinned: server on core 0, load on core 1")
                for (engine, n, tree), runs in results.items():
                    print("  " + _capacity(_name(n, engine, tree), runs))
                print("  " + _capacity("pipecat baseline", baseline_runs))
        finally:
            for load in loads:
                await load.stop()
            for proc in procs:
                await _stop_server(proc, 20)


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--serve":
        import uvloop  # as ``pepper serve`` runs

        serve = lambda: uvloop.run(_serve_pepper(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:7]))  # noqa: E731
        profile_to = os.environ.get("PEPPER_BENCH_PROFILE")  # a path prefix: the server's cProfile, as the load's
        if profile_to:
            import cProfile

            cProfile.run("serve()", f"{profile_to}.serve-{sys.argv[5]}.{os.getpid()}.prof")
        else:
            serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "--pipecat":
        _serve_pipecat(sys.argv[2])
    else:
        asyncio.run(main())
