"""Helpers for tests that run ``pepper serve`` as a user would: its own process and children."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

# Ports handed out lie below the kernel's ephemeral range, which every outgoing connection on the
# machine draws its local port from: a port the kernel picked there (``bind(0)``) could be taken by
# any connection (another test's client, a keep-alive pool) before the server meant to listen on it
# binds it, and that server then fails with "address already in use" (seen with Synapse in CI).
_FIRST_PORT = 10000
_given: set[int] = set()
_pick = random.Random()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, not handed out before by
    this process."""
    last = _ephemeral_start() - 1
    for _ in range(500):
        port = _pick.randint(_FIRST_PORT, last) if last > _FIRST_PORT else 0
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _given.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def children_of(parent: int, marker: bytes) -> set[int]:
    """The processes ``parent`` started whose command line holds ``marker``."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and marker in cmdline:
            pids.add(int(entry.name))
    return pids


def spawned_children(parent: int) -> set[int]:
    """The children ``parent`` started with multiprocessing's spawn (turn workers, media processes)."""
    return children_of(parent, b"spawn_main")


async def until_healthy(base_url: str, within: float = 60.0) -> None:
    """Wait until a server at ``base_url`` answers ``/healthz`` with 200."""
    import aiohttp

    async with aiohttp.ClientSession() as session:

        async def healthy() -> bool:
            try:
                async with session.get(base_url + "/healthz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await until(healthy, within, "the server to be healthy")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "(zombie)" not in Path(f"/proc/{pid}/status").read_text()


async def until(predicate: Any, within: float, what: str) -> Any:
    """Poll ``predicate`` (sync or async, or a lambda returning an awaitable) until it returns
    something truthy, and return that."""
    for _ in range(int(within / 0.05)):
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def until_or_false(predicate: Any, within: float) -> Any:
    """Poll ``predicate`` as :func:`until` does; its last value when time is up."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


def descendants(pid: int) -> set[int]:
    """Every process under ``pid`` (its children, theirs, ...), read from /proc."""
    found, frontier = set(), {pid}
    for _ in range(10):  # bounded depth: the server, its workers, their helpers
        children = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in frontier:
                children.add(int(entry.name))
        children -= found
        if not children:
            break
        found |= children
        frontier = children
    return found


def kill_tree(proc: subprocess.Popen) -> set[int]:
    """SIGKILL a server and every process under it (its own process group and any stragglers)."""
    pids = descendants(proc.pid)
    for pid in (-proc.pid, *pids):  # the group (start_new_session), then any that left it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    return pids
