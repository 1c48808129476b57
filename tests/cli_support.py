"""What the command-line tests share: running ``pepper`` in process or as ``pepper serve``."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from core.testing.processes import free_port
from gateway.cli import main

PEPPER = [sys.executable, "-m", "gateway.cli"]


def run_cli(monkeypatch, capsys, *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        import io

        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    captured = capsys.readouterr()
    return code, "\n".join(lines), captured.err


def start_serve(env: dict[str, str], data_dir: Path, port: int, *extra_env: tuple[str, str]) -> subprocess.Popen:
    env = {**env, "PEPPER_DATA_DIR": str(data_dir), "PEPPER_PORT": str(port), "PEPPER_MEDIA_PORT": str(free_port()),
           **dict(extra_env)}  # fmt: skip
    log = tempfile.TemporaryFile("w+")  # closed by stop()
    proc = subprocess.Popen([*PEPPER, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def stop(proc: subprocess.Popen) -> str:
    """Stop it if still running (SIGTERM, so it stops its embedded Postgres too; SIGKILL if it
    does not stop in time); return what it wrote to stderr."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.log.closed:  # stopped already (a wait that saw it exit early)
        return ""
    proc.log.seek(0)
    text = proc.log.read()
    proc.log.close()
    return text


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {stop(proc)}")
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("serve never became healthy")


def run_serve_expecting_failure(env, data_dir, port, *extra_env) -> tuple[int, str]:
    proc = start_serve(env, data_dir, port, *extra_env)
    try:
        proc.wait(timeout=60)
    finally:
        err = stop(proc)
    return proc.returncode, err
