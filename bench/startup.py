"""Time from `pepper serve` to a healthy /healthz, cold (new data dir) and warm (existing one).

    .venv/bin/python bench/startup.py [--runs N]

Prints median and p99 (the nearest-rank percentile; with few runs it is the slowest run) for each.
Target: warm median <= 3 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from core.testing.figures import p99
from core.testing.processes import free_port


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def one_start(data_dir: Path) -> float:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(PEPPER_DATA_DIR=str(data_dir), PEPPER_PORT=str(port), PEPPER_MEDIA_PORT="0", PYTHONWARNINGS="ignore")
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise SystemExit(f"pepper serve exited with {proc.returncode}")
            if time.perf_counter() - started > 120:
                raise SystemExit("pepper serve did not become healthy in 120 s")
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pepper-bench-"))
    try:
        cold = []
        for i in range(args.runs):
            cold.append(one_start(root / f"cold-{i}"))
        warm_dir = root / "cold-0"
        warm = [one_start(warm_dir) for _ in range(args.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"pepper serve -> healthy, {args.runs} runs each (seconds)")
    print(f"{'':6} {'median':>8} {'p99':>8}")
    for name, values in (("cold", cold), ("warm", warm)):
        print(f"{name:6} {statistics.median(values):8.2f} {p99(values):8.2f}")
    print(f"target: warm median <= 3.00 -> {'met' if statistics.median(warm) <= 3 else 'NOT met'}")


if __name__ == "__main__":
    main()
