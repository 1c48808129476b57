"""What the fault suites that run ``pepper serve`` share (issue 31: ``core.testing.crash``,
``two_servers``, ``postgres_restart``, ``load_suite``): the result they count checks into, the
servers they start and stop, and the wait for the texts they sent to be answered.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from core.store import Database
from core.testing.processes import kill_tree


@dataclass
class SuiteResult:
    """A suite's checks (``cases`` run, ``failures`` by what failed) and its ``timings`` (seconds,
    in the order taken); each suite adds its figures and its one ``summary()`` line."""

    cases: int = 0
    failures: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> None:
        self.cases += 1
        if not ok:
            self.failures.append(what)

    def times(self) -> str:
        """The timings as the summary lines end: ``start 4.2s send 10.0s ...``."""
        return " ".join(f"{k} {v:.1f}s" for k, v in self.timings.items())


def spawn(
    procs: list[subprocess.Popen], args: list[str], env: dict[str, str], log: IO[str] | None = None,
    new_group: bool = False,
) -> None:  # fmt: skip
    """Start ``args`` (stdout discarded, stderr to ``log``) and add it to ``procs``."""
    # Popen returns once the child is forked: nothing here waits on it.
    stderr = subprocess.DEVNULL if log is None else log
    procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=new_group))


def spawn_serve(procs: list[subprocess.Popen], env: dict[str, str], log_path: Path) -> None:
    """Start ``pepper serve`` with ``env``, its log in ``log_path``, in its own process group (so
    a kill takes its children with it)."""
    with log_path.open("w") as log:
        spawn(procs, [sys.executable, "-m", "gateway.cli", "serve"], env, log, new_group=True)


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each (a server stops its children), SIGKILL the tree of one that does not stop."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(proc)


@asynccontextmanager
async def harness(result: SuiteResult, root: Path, stop: Callable[[], object]) -> AsyncIterator[None]:
    """A suite's run: an exception in the block is a failed case, reported with the rest (never
    raised); on the way out ``stop`` (the suite's Postgres) runs in a thread, the suite's folder
    ``root`` is removed and ``timings["total"]`` taken."""
    started = time.monotonic()
    try:
        yield
    except Exception as exc:  # a harness failure is a failed case, reported with the rest
        result.check(False, f"{type(exc).__name__}: {exc}")
    finally:
        await asyncio.to_thread(stop)
        shutil.rmtree(root, ignore_errors=True)
    result.timings["total"] = time.monotonic() - started


@asynccontextmanager
async def processes() -> AsyncIterator[list[subprocess.Popen]]:
    """A list to :func:`spawn` into; every process in it is stopped on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        # In a thread: the servers finish their turns against the peers on this event loop.
        await asyncio.to_thread(_stop_all, procs)


async def healthy(
    session: aiohttp.ClientSession, base: str, proc: subprocess.Popen, within: float, log_path: Path | None = None
) -> None:
    """Wait until ``base`` answers ``/healthz`` with 200; AssertionError if ``proc`` exits first or
    time runs out (with the end of ``log_path``, which says why)."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[:4]} exited early with {proc.returncode}")
            try:
                async with session.get(base + "/healthz") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"{base} never became healthy")
    except AssertionError as exc:
        if log_path is None:
            raise
        raise AssertionError(f"{exc}: {_tail(log_path)}") from None


def _tail(log_path: Path) -> str:
    return log_path.read_text()[-3000:]


async def texts_settled(
    db: Database, expected: int, within: float, *, body_like: str | None = None, turn_channel: str | None = None
) -> None:
    """Wait until ``expected`` inbound texts are recorded (those whose body is ``LIKE body_like``,
    if given), none queued or running, and no turn running (on ``turn_channel``, if given)."""
    deadline = time.monotonic() + within
    row: Any = {"inbound": 0, "open": 0}
    running = 0
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT count(*) FILTER (WHERE $1::text IS NULL OR body LIKE $1) AS inbound,"
            " count(*) FILTER (WHERE handling IN ('queued', 'running')) AS open"
            " FROM messages WHERE direction = 'inbound' AND channel = 'sms'",
            body_like,
        )
        assert row is not None
        running = await db.fetchval(
            "SELECT count(*) FROM turns WHERE status = 'running' AND ($1::text IS NULL OR channel = $1)", turn_channel
        )
        if row["inbound"] >= expected and not row["open"] and not running:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not settled: {row['inbound']} of {expected} texts in, {row['open']} open, {running} running")
