"""A small named background loop that calls :func:`memory_jobs_tick` on an interval, and the
nightly quality judge's :func:`~core.quality.jobs.quality_tick` after it.

For a server without the scheduler: ``gateway.server.build_app`` starts one. The first tick runs
one interval after start, so short-lived processes (tests, a quick restart) do no memory work.
While the index is behind (a re-index, a backlog), ticks follow each other after a short pause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from core.memory.config import MemoryConfig
from core.memory.jobs import memory_jobs_tick
from core.models.types import ModelService
from core.quality.jobs import quality_tick
from core.store.queries import Queries

log = logging.getLogger(__name__)

# Looking for newly finished periods is a scan of recent activity; due jobs are checked every tick.
ENQUEUE_EVERY = timedelta(minutes=10)
CATCH_UP_PAUSE = 1.0


def _utc_now() -> datetime:
    return datetime.now(UTC)


class MemoryWorker:
    """Owns one task, ``pepper-memory-jobs``; :meth:`stop` cancels it and waits."""

    def __init__(
        self,
        db: Queries,
        models: ModelService,
        *,
        interval: float = 60.0,
        config: MemoryConfig | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.db, self.models, self.interval = db, models, interval
        self.config = config or MemoryConfig()
        self.clock = clock
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._enqueued: datetime | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pepper-memory-jobs")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _judge(self, now: datetime, enqueue: bool) -> None:
        """The nightly judge's leased jobs ride the same tick (``core.quality.jobs``)."""
        try:
            judged = await quality_tick(self.db, self.models, now, enqueue=enqueue)
            if judged.claimed:
                log.info("quality judge: days=%s failed=%s", judged.done, judged.failed)
        except Exception as exc:
            log.error("quality judge tick failed: error=%s", type(exc).__name__, exc_info=exc)

    async def _run(self) -> None:
        pause = self.interval
        while True:
            await asyncio.sleep(pause)
            pause = self.interval
            try:
                now = self.clock()
                enqueue = self._enqueued is None or now - self._enqueued >= ENQUEUE_EVERY
                report = await memory_jobs_tick(self.db, self.models, now, config=self.config, enqueue=enqueue)
                await self._judge(now, enqueue)
                if enqueue:
                    self._enqueued = now
                if report.claimed:
                    log.info("memory jobs: done=%s failed=%s", report.done, report.failed)
                if report.index is not None and report.index.ran and not report.index.finished:
                    pause = CATCH_UP_PAUSE  # a re-index or a backlog: keep going, between short pauses
            except Exception as exc:
                log.error("memory jobs tick failed: error=%s", type(exc).__name__, exc_info=exc)
            self.ticks += 1
