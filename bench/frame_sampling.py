"""What the sampled per-frame timings (``pepper_call_caller_to_model_ms``,
``pepper_call_model_to_caller_ms``) cost the call engine's frame path, measured on the engine's own
methods: ``CallEngine.feed_audio`` (a caller frame to the model socket) and ``_relay_audio`` (a
model audio delta to the caller's socket) with the model and Twilio sockets replaced by no-ops, run
with the sampling as shipped (one frame in ``SAMPLE_EVERY``) and with it never firing, alternately,
in one process.

    PYTHONPATH=. .venv/bin/python bench/frame_sampling.py [--frames 200000] [--rounds 7]

Prints per direction the median and p99 over rounds of ns per frame, both ways, and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time

from core.adapters.twilio import media_streams as media
from core.tools.gate import Gate
from core.tools.registry import ToolRegistry
from voice import engine as engine_module
from voice.deps import VoiceConfig, VoiceDeps
from voice.engine import CallEngine
from voice.profile import AdmittedCall
from voice.realtime import AudioDelta
from voice.replay_call import _Link, _Outside, _Profile

PAYLOAD = base64.b64encode(b"\x7f" * 160).decode()


class _Conn:
    def append_audio_nowait(self, payload: str) -> bool:
        return True


def _engine() -> CallEngine:
    deps = VoiceDeps(db=None, model=None, registry=ToolRegistry(), gate=Gate(), config=VoiceConfig())  # type: ignore[arg-type]
    start = media.StreamStart("MZbench", "CAbench", "", {}, "audio/x-mulaw")
    admitted = AdmittedCall("CAbench", None, None, None, None)  # type: ignore[arg-type]
    engine = CallEngine(deps, _Link(), start, admitted, _Profile({}), outside=_Outside())  # type: ignore[arg-type]
    engine._listening = True
    engine._conn = _Conn()  # type: ignore[assignment]
    return engine


def _per_frame(frames: int, every: int) -> tuple[float, float]:
    engine_module.SAMPLE_EVERY = every
    engine = _engine()
    delta = AudioDelta("resp", "item", PAYLOAD)
    feed, relay = engine.feed_audio, engine._relay_audio
    started = time.perf_counter_ns()
    for _ in range(frames):
        feed(PAYLOAD)
    up = (time.perf_counter_ns() - started) / frames
    started = time.perf_counter_ns()
    for _ in range(frames):
        relay(delta)
    down = (time.perf_counter_ns() - started) / frames
    return up, down


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shipped = engine_module.SAMPLE_EVERY
    runs: dict[str, list[tuple[float, float]]] = {"sampled": [], "never": []}
    for _ in range(args.rounds):
        runs["sampled"].append(_per_frame(args.frames, shipped))
        runs["never"].append(_per_frame(args.frames, 10**15))
    engine_module.SAMPLE_EVERY = shipped

    def figures(values: list[float]) -> str:
        ordered = sorted(values)
        return f"{statistics.median(ordered):.0f} / {ordered[min(len(ordered) - 1, round(0.99 * len(ordered)))]:.0f}"

    for index, name in ((0, "caller->model (feed_audio)"), (1, "model->caller (_relay_audio)")):
        on, off = [r[index] for r in runs["sampled"]], [r[index] for r in runs["never"]]
        added = statistics.median(on) - statistics.median(off)
        print(
            f"{name}: sampled 1 in {shipped} {figures(on)} ns per frame, never {figures(off)} ns; added {added:+.0f} ns"
        )


if __name__ == "__main__":
    asyncio.run(main())
