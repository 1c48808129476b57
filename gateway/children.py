"""Child-process supervision for ``pepper serve``: start, restart one that dies, stop with a drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from typing import Any, Protocol

from core.metrics import process_gone
from core.settings import Settings

log = logging.getLogger(__name__)


class Supervised(Protocol):
    """What ``pepper serve`` starts and stops beside the web server."""

    def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


class ChildProcesses:
    """Processes ``pepper serve`` runs beside the web server (turn workers, media processes):
    started after start-up recovery, restarted when one dies, stopped (SIGTERM, then their own
    graceful drain) before the store closes. ``target(settings, index)`` runs in each."""

    label = "child"
    name = "pepper-child"

    def __init__(self, settings: Settings, dsn: str, count: int) -> None:
        # The children use the server's database, embedded or not.
        self._settings = settings.model_copy(update={"database_url": _secret(dsn)})
        self._count = count
        self._context = multiprocessing.get_context("spawn")  # no inherited event loop or sockets
        self._processes: list[Any] = []
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @staticmethod
    def target(settings: Settings, index: int) -> None:
        """Runs in each child process (``index`` from 0)."""
        raise NotImplementedError

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.is_alive()]

    def start(self) -> None:
        self._processes = [self._spawn(i) for i in range(self._count)]
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name=self.name)
        log.info("started %s %s process(es): %s", self._count, self.label, self.pids)

    def _spawn(self, index: int) -> Any:
        process = self._context.Process(
            target=type(self).target, args=(self._settings, index), name=f"{self.name}-{index}", daemon=False
        )
        process.start()
        return process

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(1.0)
            for index, process in enumerate(self._processes):
                if not self._stopping and not process.is_alive():
                    log.error("%s process %s exited with %s; starting another", self.label, process.pid,
                              process.exitcode)  # fmt: skip
                    process_gone(process.pid)
                    process.close()
                    self._processes[index] = self._spawn(index)

    async def stop(self, grace: float) -> None:
        self._stopping = True
        await cancelled(self._watch)
        for process in self._processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the child drains its work for ``grace`` seconds
        for process in self._processes:
            await asyncio.to_thread(process.join, grace + 10)
            if process.is_alive():
                log.warning("%s process %s did not stop in time; killing it", self.label, process.pid)
                process.kill()
                await asyncio.to_thread(process.join, 5)
        log.info("%s processes stopped", self.label)


async def cancelled(task: asyncio.Task[Any] | None) -> None:
    """Cancel a supervisor's watch task and wait until it ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _secret(value: str) -> Any:
    from pydantic import SecretStr

    return SecretStr(value)


class ChildStop(asyncio.Event):
    """In a child process: set by SIGTERM (the supervisor's stop) or SIGINT. Made in the child's
    event loop before anything slow starts, so a stop during start-up is not lost."""

    def __init__(self) -> None:
        super().__init__()
        # The pid that started this process, as multiprocessing handed it over: a server killed
        # while this child was still importing has already left it to init, and the child's own
        # parent pid would then never change.
        started_by = multiprocessing.parent_process()
        self.parent = started_by.pid if started_by is not None and started_by.pid else os.getppid()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.set)

    async def stopped(self, label: str) -> None:
        """Return when set, or when the server that started this child is gone: a child never
        outlives it."""
        while not self.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait(), 1.0)
            if os.getppid() != self.parent:
                log.warning("pepper serve went away; %s stopping", label)
                return
