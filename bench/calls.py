"""Phone calls under load: what Pepper's media relay adds per 20 ms frame, in both directions.

Pepper runs in its own process (as in production: one server process, here pinned to nothing),
over an embedded Postgres. The loopback Twilio callers and the loopback OpenAI Realtime server run
in this process. Every caller frame carries (call, sequence) in its first bytes; the model peer
reads them on arrival, so caller->model latency is measured per frame without any decoding in
Pepper (the payload passes through). The model peer streams a reply in real time (one 160-byte
delta every 20 ms) tagged the same way, and the caller reads the tag on arrival: model->caller.

The figures include the loopback peers' own event-loop time (they share this process, and at high
call counts they are the bottleneck), so they overstate what Pepper adds. Barge-in: the model
peer reports ``speech_started`` while a reply streams; Pepper's time from that event to ``clear``
sent is taken from its own call stats, and the full hop (peer -> Pepper -> caller) is shown too.
CPU and memory are the server process's, over the steady state, per call.

    PYTHONPATH=. .venv/bin/python bench/calls.py [--calls 1,50,100,300] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import time
from typing import Any

import psutil

TOKEN = "bench-twilio-token"
PUBLIC = "https://pepper.bench.example"
OWNER = "+14155552671"
LINE = "+14155550100"
PIN = "2468"
TAG = struct.Struct("<HI")  # call index, sequence


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fmt(values: list[float]) -> str:
    if not values:
        return "      n/a"
    return f"median {statistics.median(values):7.2f} ms  p99 {_pct(values, 0.99):7.2f} ms  (n={len(values)})"


async def _serve(dsn: str, port: int, realtime_url: str) -> None:
    """The server process: Pepper as ``pepper serve`` would build it."""
    import logging

    from core.settings import Settings
    from core.store import Database
    from gateway.server import running_app

    logging.basicConfig(level=logging.ERROR)
    settings = Settings(
        database_url=dsn, public_url=PUBLIC, twilio_account_sid="AC" + "1" * 32, twilio_auth_token=TOKEN,
        openai_api_key="sk-bench", openai_realtime_url=realtime_url, port=port, voice_max_call_seconds=3600,
    )  # fmt: skip
    db = await Database.open(dsn, max_size=20)
    async with running_app(settings, db):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await db.close()


class Bench:
    def __init__(self, peer: Any, caller: Any, db: Any, server: psutil.Process):
        self.peer = peer
        self.caller = caller
        self.db = db
        self.server = server
        self.sent_in: dict[tuple[int, int], float] = {}
        self.sent_out: dict[tuple[int, int], float] = {}
        self.lat_in: list[float] = []
        self.lat_out: list[float] = []
        self.measuring = False
        self._out_seq = 0
        peer.audio_hook = self._model_got
        peer.delta_hook = self._model_sends

    def _model_got(self, audio: bytes) -> None:
        if len(audio) >= TAG.size and self.measuring:
            key = TAG.unpack_from(audio)
            sent = self.sent_in.pop(key, None)
            if sent is not None:
                self.lat_in.append((time.perf_counter() - sent) * 1000)

    def _model_sends(self, index: int, part: bytes) -> bytes:
        self._out_seq += 1
        seq = self._out_seq
        self.sent_out[(index, seq)] = time.perf_counter()
        return TAG.pack(index, seq) + part[TAG.size :]

    def _caller_frame(self, call_index: int):  # type: ignore[no-untyped-def]
        def frame(n: int) -> bytes:
            if self.measuring:
                self.sent_in[(call_index, n)] = time.perf_counter()
            return TAG.pack(call_index, n) + b"\xff" * (160 - TAG.size)

        return frame

    def _caller_heard(self, audio: bytes) -> None:
        if len(audio) >= TAG.size and self.measuring:
            sent = self.sent_out.pop(TAG.unpack_from(audio), None)
            if sent is not None:
                self.lat_out.append((time.perf_counter() - sent) * 1000)

    async def run_level(self, count: int, seconds: float) -> dict[str, Any]:
        from voice.testing.realtime_peer import speak

        self.lat_in.clear()
        self.lat_out.clear()
        self.sent_in.clear()
        self.sent_out.clear()
        first_socket = len(self.peer.sessions)
        self.peer.script(*[speak("notice", ms=100) for _ in range(count)])
        limit = asyncio.Semaphore(25)
        calls: list[Any] = []
        contexts: list[Any] = []

        async def open_call(i: int) -> None:
            async with limit:
                answer = await self.caller.dial(from_=OWNER, to=LINE)
                ctx = self.caller.media(answer)
                call = await ctx.__aenter__()
                call.frame_hook = self._caller_frame(i)
                call.media_hook = self._caller_heard
                contexts.append(ctx)
                calls.append(call)
                await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=60, what="notice")

        await asyncio.gather(*(open_call(i) for i in range(count)))
        # Every model socket streams a reply in real time for the whole window.
        self.peer.script(*[speak("reply", ms=int((seconds + 3) * 1000)) for _ in range(count)])
        for index in range(first_socket, first_socket + count):
            await self.peer.respond(index)
        await asyncio.sleep(1.0)
        me = psutil.Process()
        mine0 = me.cpu_times()
        cpu0, t0 = self.server.cpu_times(), time.perf_counter()
        rss0 = self.server.memory_info().rss
        self.measuring = True
        await asyncio.sleep(seconds)
        self.measuring = False
        cpu1, t1 = self.server.cpu_times(), time.perf_counter()
        mine1 = me.cpu_times()
        rss1 = self.server.memory_info().rss
        # Barge-in on every call while its reply still streams.
        hops: list[float] = []
        before = {id(c): len(c.clears) for c in calls}
        sent_at = time.monotonic()
        for index in range(first_socket, first_socket + count):
            await self.peer.speech_started(index)
        for call in calls:
            with_clear = lambda c=call: len(c.clears) > before[id(c)]  # noqa: E731
            await call.wait(with_clear, within=30, what="clear")
            hops.append((call.clears[-1] - sent_at) * 1000)
        for call in calls:
            await call.hang_up()
        for ctx in contexts:
            await ctx.__aexit__(None, None, None)
        await asyncio.sleep(0.5)
        clear_ms: list[float] = []
        for _ in range(200):
            rows = await self.db.fetch(
                "SELECT stats FROM calls WHERE route = 'owner' AND ended_at IS NOT NULL ORDER BY started_at DESC"
                " LIMIT $1",
                count,
            )
            if len(rows) == count and all(r["stats"] and json.loads(r["stats"]).get("clear_ms") for r in rows):
                clear_ms = [v for r in rows for v in json.loads(r["stats"])["clear_ms"]]
                break
            await asyncio.sleep(0.05)
        busy = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        return {
            "calls": count,
            "in": list(self.lat_in),
            "out": list(self.lat_out),
            "clear": clear_ms,
            "hop": hops,
            "cpu_per_call": busy / (t1 - t0) / count * 100,
            "peers_cpu": ((mine1.user + mine1.system) - (mine0.user + mine0.system)) / (t1 - t0) * 100,
            "load": os.getloadavg()[0],
            "rss_mb": rss1 / 1e6,
            "rss_delta_per_call_kb": (rss1 - rss0) / 1e3 / count,
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="1,50,100,300")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    from core import identity
    from core.store import Database
    from core.testing.postgres import DatabaseFactory, test_server
    from voice.testing.realtime_peer import RealtimePeer
    from voice.testing.twilio_caller import TwilioCaller

    with test_server() as admin:
        factory = DatabaseFactory(admin)
        await factory.prepare_template()
        dsn = await factory.create()
        db = await Database.open(dsn, max_size=4)
        ada = await identity.create_account(db, "Ada")
        await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
        await identity.set_pin(db, ada.id, PIN)
        await identity.assign_line(db, LINE, "personal", ada.id)
        async with RealtimePeer(chunk_ms=20, pace=0.02, vad=False) as peer:
            port = 18000 + os.getpid() % 1000
            env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONWARNINGS="ignore")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--serve", dsn, str(port), peer.websocket_url,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            try:
                assert proc.stdout is not None
                line = (await proc.stdout.readline()).decode()
                assert line.strip() == "ready", line
                caller = TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC)
                bench = Bench(peer, caller, db, psutil.Process(proc.pid))
                print(f"Pepper media relay, {os.cpu_count()} cores; loopback callers and model in one other process")
                for count in (int(c) for c in args.calls.split(",")):
                    r = await bench.run_level(count, args.seconds)
                    print(f"\n{count} concurrent call(s)")
                    print(f"  caller -> model per frame   {_fmt(r['in'])}")
                    print(f"  model -> caller per frame   {_fmt(r['out'])}")
                    print(f"  speech_started -> clear     {_fmt(r['clear'])}  (inside Pepper)")
                    print(f"  peer -> Pepper -> caller    {_fmt(r['hop'])}  (barge-in, full hop)")
                    print(f"  server CPU per call {r['cpu_per_call']:.2f}% of a core; server RSS {r['rss_mb']:.0f} MB"
                          f" ({r['rss_delta_per_call_kb']:+.0f} kB per call over the window)")  # fmt: skip
                    print(f"  load generator (callers + model peer) CPU {r['peers_cpu']:.0f}% of a core;"
                          f" machine load average {r['load']:.1f}")  # fmt: skip
                print("\nBaseline (stock pipecat Twilio + OpenAI Realtime pipeline): not run here; see docs/voice.md.")
            finally:
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
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        asyncio.run(_serve(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    else:
        asyncio.run(main())
