"""Background work started by a request that must outlive it (a turn after the webhook's 200)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    """Owns every task it starts: named, logged if they fail, drained on shutdown.

    At most ``limit`` run at once; the rest wait their turn without costing the event loop
    anything, so a burst of webhooks is still acknowledged at once while its turns queue.
    """

    def __init__(self, limit: int = 8) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(limit)

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], *, limited: bool = True) -> asyncio.Task[Any]:
        """Start ``coro``; ``limited=False`` for work that must start at once whatever else runs
        (a phone call: queued behind turns, the caller would hear silence)."""
        task = asyncio.get_running_loop().create_task(self._limited(coro) if limited else coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    async def _limited(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            async with self._slots:
                return await coro
        finally:
            coro.close()  # a task cancelled while waiting never started its coroutine

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self, grace: float) -> None:
        """Let running tasks finish for up to ``grace`` seconds, then cancel the rest."""
        if not self._tasks:
            return
        _, still_running = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in still_running:
            task.cancel()
        if still_running:
            log.warning("cancelled %s background task(s) at shutdown", len(still_running))
            await asyncio.wait(still_running, timeout=5)
