"""Browser calls (WebRTC) beside phone calls (Twilio Media Streams): what the server adds per 20 ms
frame, caller -> model and model -> caller, at 1 and 20 concurrent calls, in the same run.

One Pepper server (as ``pepper serve`` builds it, on uvloop, calls held in the web server's event
loop) and one loopback OpenAI Realtime model (``bench/call_load.py --model``) serve both paths. The
Twilio path is measured by ``bench/calls.py``'s own level (its caller worker, tags and onsets). The
browser path is a load process of loopback browsers (``voice.testing.browser_peer``, aiortc: Opus
48 kHz both ways, as Chrome sends), one web session per call (one call per session).

Opus erases the tags ``bench/calls.py`` reads per frame, so both paths are compared on **onsets**:
every 400 ms each side sends a 40 ms tone burst into silence; its rising edge is detected by level
where it lands and joined with the latest burst sent on that call, on the machine-wide monotonic
clock. A browser burst is timed when its frame is handed to the browser's Opus encoder and seen
when the model receives the mu-law append; the model's burst is timed when its delta is sent and
seen when the browser has decoded it. So the browser figures include what a browser would add on
its side of loopback (Opus encode and decode, aiortc's jitter buffer) and the server's pacing of
the model's audio into 20 ms frames (Twilio paces on its own side); the Twilio figures include the
loopback caller's and model's sockets. Server CPU is from /proc over the window.

    PYTHONPATH=. .venv/bin/python bench/webrtc.py [--calls 1,20] [--seconds 5] [--load-nice 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import calls as twilio_bench
from call_load import BURST_EVERY, BURST_FRAMES, Onsets, serve_commands

RATE = 48000
FRAME = 960


def _tone48() -> bytes:
    """20 ms of the 700 Hz burst tone, 16-bit 48 kHz mono (``call_load``'s tone, at the browser's rate)."""
    import math

    return b"".join(
        int(8000 * math.sin(2 * math.pi * 700 * i / RATE)).to_bytes(2, "little", signed=True) for i in range(FRAME)
    )


# --- The browsers (a load process) -----------------------------------------------------------


class BrowserWorker:
    """Loopback browsers, each on its own web session, driven by JSON lines as ``call_load``'s workers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, str, dict[str, str]]] = []
        self.measuring = False
        self.tone = _tone48()
        self.onsets = Onsets()
        self.reset()

    def reset(self) -> None:
        self.sent: dict[int, list[float]] = {}
        self.seen: dict[int, list[float]] = {}
        self.frames_sent = 0
        self.ms_heard = 0.0

    def _mic(self, index: int) -> Any:
        def on_frame(n: int) -> bytes | None:
            phase = n % BURST_EVERY
            if self.measuring:
                self.frames_sent += 1
                if phase == 0:
                    self.sent.setdefault(index, []).append(time.monotonic())
            return self.tone if phase < BURST_FRAMES else None

        return on_frame

    def _ear(self, index: int) -> Any:
        def on_audio(now: float, pcm: bytes) -> None:
            if not self.measuring:
                return
            self.ms_heard += len(pcm) / 96
            if self.onsets.rising(index, pcm):
                self.seen.setdefault(index, []).append(now)

        return on_audio

    async def _open(self, http: Any, index: int, token: str, csrf: str) -> bool:
        from voice.testing.browser_peer import BrowserPeer

        browser = BrowserPeer()
        browser.mic.on_frame = self._mic(index)
        browser.on_audio = self._ear(index)
        headers = {"X-CSRF-Token": csrf, "Cookie": f"pepper_session={token}"}
        response = await http.post("/api/calls", json=await browser.offer(), headers=headers)
        if response.status_code != 201:
            await browser.close()
            return False
        await browser.accept(response.json()["sdp"])
        self.calls.append((browser, response.json()["call_id"], headers))
        try:  # the opening notice heard: the call runs (and the model's next socket is another call's)
            await browser.wait_for(lambda: browser.heard(1000) > 0, within=20)
        except AssertionError:
            return False
        return True

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        import httpx

        op = cmd["op"]
        if op == "open":
            failed = 0
            async with httpx.AsyncClient(base_url=cmd["http"], timeout=20) as http:
                for i, (token, csrf) in enumerate(cmd["sessions"]):
                    failed += not await self._open(http, i, token, csrf)
            return {"failed": failed}
        if op == "measure":
            if cmd["on"]:
                self.reset()
            self.measuring = cmd["on"]
            return {"ok": True}
        if op == "collect":
            return {"sent": self.sent, "seen": self.seen, "ms_sent": self.frames_sent * 20, "ms_heard": self.ms_heard}
        if op == "hangup":
            async with httpx.AsyncClient(base_url=cmd["http"], timeout=20) as http:
                for browser, call_id, headers in self.calls:
                    await http.post(f"/api/calls/{call_id}/hangup", headers=headers)
                    await browser.close()
            self.calls = []
            return {"ok": True}
        raise ValueError(op)


async def _browsers_main() -> None:
    await serve_commands(BrowserWorker().run)


# --- One level of browser calls ----------------------------------------------------------------


HERE = os.path.abspath(__file__)


async def start_browsers(env: dict[str, str], nice: int) -> twilio_bench.Proc:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, HERE, "--browsers", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env=env, limit=2**28, preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )  # fmt: skip
    browsers = twilio_bench.Proc(proc)
    await browsers._line(60)  # ready
    return browsers


async def browser_level(
    count: int, seconds: float, model: Any, browsers: Any, server: Any, http: str, sessions: list[list[str]]
) -> dict[str, Any]:
    r: dict[str, Any] = {"mode": "browser", "calls": count, "notes": [], "in_onset": [], "out_onset": []}
    await model.ask(op="level", mode="browser")
    t_open = time.monotonic()
    opened = await browsers.ask(within=60 + 3 * count, op="open", http=http, sessions=sessions[:count])
    r["open_s"], r["failed"] = time.monotonic() - t_open, opened["failed"]
    try:
        await asyncio.sleep(1.0)
        cpu0, t0, load0 = server.cpu_times(), time.perf_counter(), browsers.cpu + model.cpu
        await asyncio.gather(*(p.ask(op="measure", on=True) for p in (model, browsers)))
        await asyncio.sleep(seconds)
        await asyncio.gather(*(p.ask(op="measure", on=False) for p in (model, browsers)))
        cpu1, t1, load1 = server.cpu_times(), time.perf_counter(), browsers.cpu + model.cpu
        side = await model.ask(op="collect")
        got = await browsers.ask(op="collect")
    finally:
        await browsers.ask(within=60, op="hangup", http=http)
    window = t1 - t0
    ok = count - r["failed"]
    busy = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    r.update(
        in_onset=twilio_bench.join_onsets(twilio_bench._keyed(got["sent"]), twilio_bench._keyed(side["seen"])),
        out_onset=twilio_bench.join_onsets(twilio_bench._keyed(side["sent"]), twilio_bench._keyed(got["seen"])),
        cpu_ms_per_call_s=busy / window / max(1, ok) * 1000,
        server_cores=busy / window,
        load_cores=(load1 - load0) / window,
        expected=ok * window * 1000,
        ms_in=side["ms_in"],
        ms_heard=got["ms_heard"],
    )
    short = [w for w, n in (("reached the model", side["ms_in"]), ("reached the browsers", got["ms_heard"]))
             if n < 0.9 * r["expected"]]  # fmt: skip
    if short:
        r["notes"].append("NOT SUSTAINED: less than 90% of the audio due " + " and ".join(short))
    return r


def _line(name: str, r: dict[str, Any]) -> str:
    cpu = r.get("cpu_ms_per_call_s")
    return (f"  {name:<8} caller->model {twilio_bench._fmt(r['in_onset'])}   model->caller"
            f" {twilio_bench._fmt(r['out_onset'])}   server CPU {cpu:.1f} ms per call-second"
            f" ({r['server_cores']:.2f} cores; load side {r.get('load_cores', r.get('generator', 0)):.2f})"
            if cpu is not None else f"  {name:<8} no figures")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="1,20")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--load-nice", type=int, default=10)
    args = parser.parse_args()
    levels = [int(c) for c in args.calls.split(",")]

    from core import access

    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONWARNINGS="ignore")
    async with twilio_bench.owner_database() as (dsn, db, ada):
        sessions = []
        for _ in range(max(levels)):
            token, session = await access.create_session(db, ada.id)
            sessions.append([token, session.csrf_token])
        loads: list[Any] = []
        pepper = None
        try:
            model, model_url = await twilio_bench.Proc.start(env, "--model", args.load_nice)
            loads.append(model)
            pepper, http, media = await twilio_bench._start_server(["--serve", dsn, model_url, "1"], env)
            callers, _ = await twilio_bench.Proc.start(env, "--callers", args.load_nice)
            loads.append(callers)
            browsers = await start_browsers(env, args.load_nice)
            loads.append(browsers)
            print(f"{os.cpu_count()} cores; one server (calls in its event loop), the model, the Twilio callers and"
                  f" the browsers in their own processes at nice +{args.load_nice}; {args.seconds:.0f} s windows;"
                  " onset latency median / p99", flush=True)  # fmt: skip
            server = twilio_bench.ServerGroup(pepper.pid)
            for count in levels:
                phone = await twilio_bench.run_level("pepper", count, args.seconds, model, [callers], server, http,
                                                     media)  # fmt: skip
                browser = await browser_level(count, args.seconds, model, browsers, server, http, sessions)
                print(f"\n{count} concurrent call(s):")
                print(_line("twilio", phone))
                print(_line("browser", browser))
                for note in phone["notes"] + browser["notes"]:
                    print(f"  note: {note}")
                sys.stdout.flush()
        finally:
            for load in loads:
                await load.stop()
            if pepper is not None:
                await twilio_bench._stop_server(pepper, 20)


if __name__ == "__main__":
    if sys.argv[1:] == ["--browsers"]:
        asyncio.run(_browsers_main())
    else:
        asyncio.run(main())
