"""Turn workers: the processes that answer recorded messages, apart from the web server.

A webhook (SMS, WhatsApp, email) or a web chat post only checks the request, records the message
as ``handling = 'queued'`` and answers at once; a trigger then announces it on ``pepper_turns``.
Turn workers listen for that, claim queued messages with ``FOR UPDATE SKIP LOCKED`` (each message
is claimed by exactly one worker), run the turn and send the reply. One person's messages are
answered one turn at a time, and the texts they sent meanwhile by one turn
(``core.conversation.claim_turn``). A turn never shares an event
loop or a core with the acknowledgements, so a burst of messages cannot slow them down.

``pepper serve`` starts ``PEPPER_TURN_WORKERS`` worker processes (default 2) and stops them on
shutdown, restarting one that dies. They run ``PEPPER_TURN_WORKER_NICE`` steps (default 10) nicer
than the web server, and on Linux in the idle scheduling class (``PEPPER_TURN_WORKER_IDLE``),
as do their local Postgres backends: an acknowledgement is latency work and a turn throughput
work, so when both want a core the kernel should preempt the turn. With ``PEPPER_TURN_WORKERS=0`` the same worker
runs inside the web server instead (one process; tests use it so). The first worker process also
runs the scheduler and the memory jobs (``BackgroundJobs``); with no worker processes, the web
server does.

A claim records the backend pid of the worker's listening connection. When a worker dies, its
session ends, and any worker finds the messages it held, queues them again and answers them: a
message whose turn had not started gets its turn; one whose turn was cut short gets the apology
(running it again could repeat what it did) and that turn's staged writes are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
from datetime import timedelta
from typing import Any

import asyncpg

from core import identity
from core.conversation import claim_turn, finish_handling, release_orphans
from core.settings import Settings
from core.store.database import to_idle_class
from gateway.services import Services

log = logging.getLogger(__name__)

CHANNEL = "pepper_turns"
# Notifications wake a worker at once; this is only the fallback (a notification missed while the
# listening connection was busy reconnecting, a worker that died and left messages).
POLL_SECONDS = 2.0
# Claims from before workers named themselves: a turn never runs this long.
STALE_RUNNING = timedelta(minutes=10)
# Past this, an answer would only confuse: the message is marked expired instead.
RESUME_WINDOW = timedelta(hours=1)


def job_for(services: Services, rows: list[Any]) -> Any:
    """The coroutine that answers one turn's claimed messages on their channel (several only for
    a burst of texts from one sender), or None if they cannot be."""
    from gateway.email_channel import InboundMail
    from gateway.email_channel import run_and_reply as run_email
    from gateway.messaging import Inbound, run_and_reply
    from gateway.webchat import run_web_turn

    row, ids = rows[0], [r["id"] for r in rows]
    meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"] or "{}")
    channel, account_id, interrupted = row["channel"], row["account_id"], row["turn_id"]
    if channel in ("sms", "whatsapp") and meta.get("from") and meta.get("to") and row["handle_id"]:
        # The texts of a burst reach the model as one message, a line each.
        body = "\n".join(r["body"] for r in rows)
        inbound = Inbound(channel, row["provider_message_id"], meta["from"], meta["to"], body, None)
        return run_and_reply(services, inbound, account_id, row["handle_id"], ids, interrupted=interrupted)
    if channel == "email" and meta.get("message_id") and row["handle_id"]:
        fields = {**meta, "references": tuple(meta.get("references", ())),
                  "attachments": tuple(meta.get("attachments", ()))}  # fmt: skip
        mail = InboundMail(**fields)
        return run_email(services, mail, account_id, row["handle_id"], row["id"], interrupted=interrupted)
    if channel == "web":
        return run_web_turn(services, account_id, row["body"], row["id"], interrupted=interrupted)
    return None


class TurnWorker:
    """Claims queued messages and runs up to ``concurrency`` turns at once."""

    def __init__(self, services: Services, *, concurrency: int, poll_seconds: float = POLL_SECONDS) -> None:
        self._services = services
        self._slots = asyncio.Semaphore(concurrency)
        self._poll = poll_seconds
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._conn: asyncpg.Connection | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.pid = 0  # the backend pid claims are recorded under

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._services.db.dsn)
        self.pid = self._conn.get_server_pid()
        await self._conn.add_listener(CHANNEL, lambda *_: self._wake.set())
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name=f"turn-worker-{self.pid}")

    async def stop(self, grace: float) -> None:
        """Claim nothing more, let running turns finish for ``grace`` seconds, then close."""
        self._stopping.set()
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        await self._services.tasks.drain(grace)
        if self._conn is not None:
            # Closing the session last: the messages of turns cut short now count as orphans.
            await self._conn.close()
            self._conn = None

    async def _run(self) -> None:
        db = self._services.db
        loop = asyncio.get_running_loop()
        swept = -self._poll
        while not self._stopping.is_set():
            self._wake.clear()  # before looking, so an announcement made meanwhile is not lost
            try:
                if loop.time() - swept >= self._poll:  # not on every announcement: it scans sessions
                    await release_orphans(db, stale=STALE_RUNNING, expire_after=RESUME_WINDOW)
                    swept = loop.time()
                while not self._stopping.is_set():
                    await self._slots.acquire()
                    try:
                        rows = await claim_turn(db, self.pid)
                    except BaseException:
                        self._slots.release()  # a failed claim must not cost a turn slot for good
                        raise
                    if not rows:
                        self._slots.release()
                        break
                    self._start(rows)
            except (OSError, asyncpg.PostgresError):
                log.warning("turn worker could not reach the database; trying again", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll)

    def _start(self, rows: list[Any]) -> None:
        task = self._services.tasks.spawn(f"turn-{rows[0]['channel']}-{rows[0]['id']}", self._answer(rows))
        task.add_done_callback(self._finished)

    def _finished(self, _: Any) -> None:
        self._slots.release()
        # The person may have written again during the turn: those messages waited for it, and
        # no announcement will come for them.
        self._wake.set()

    async def _answer(self, rows: list[Any]) -> None:
        services = self._services
        row, ids = rows[0], [r["id"] for r in rows]
        channel, handle_id = row["channel"], row["handle_id"]
        if handle_id is not None and channel in identity.CONSENT_CHANNELS:
            if await identity.is_blocked(services.db, handle_id, channel):
                # Checked here, not in the webhook: the acknowledgement stays one statement.
                log.info("message recorded from an opted-out handle; no turn, no reply")
                await finish_handling(services.db, ids, handling="skipped")
                return
        job = job_for(services, rows)
        if job is None:
            log.error("messages %s on %s cannot be answered (missing reply details)", ids, channel)
            await finish_handling(services.db, ids)
            return
        await job


def start_in_process(services: Services) -> TurnWorker:
    """A worker in this process and event loop (``PEPPER_TURN_WORKERS=0``, tests)."""
    return TurnWorker(services, concurrency=services.settings.max_concurrent_turns)


# --- worker processes ----------------------------------------------------------------------------


class ChildProcesses:
    """Processes ``pepper serve`` runs beside the web server (turn workers, media processes):
    started after start-up recovery, restarted when one dies, stopped (SIGTERM, then their own
    graceful drain) before the store closes. ``target(settings, index)`` runs in each."""

    label = "turn worker"
    name = "pepper-turns"

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
        worker_process_main(settings, index)

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
                    process.close()
                    self._processes[index] = self._spawn(index)

    async def stop(self, grace: float) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
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


class TurnProcesses(ChildProcesses):
    """The turn-worker processes of ``pepper serve`` (``PEPPER_TURN_WORKERS``)."""


class BackgroundJobs:
    """The scheduler and the memory jobs, in the first turn-worker process: a scheduled run is a
    turn, and indexing new messages for search is throughput work; neither belongs beside the
    acknowledgements (with ``PEPPER_TURN_WORKERS=0`` the web server runs them). Both are safe in
    several processes at once (leases, ``SKIP LOCKED``), so a restarted worker taking over while
    its predecessor's runs expire is fine."""

    def __init__(self, settings: Settings, services: Services) -> None:
        from gateway.scheduled import build_scheduler
        from gateway.server import start_memory

        harness = services.harness
        self._scheduler = (
            build_scheduler(settings, harness, services.messenger, services.mailer)
            if settings.scheduler_enabled
            else None
        )
        self._memory = start_memory(settings, services.db, harness.models)

    def start(self) -> None:
        if self._scheduler is not None:
            self._scheduler.start()
        if self._memory is not None:
            self._memory.start()
            log.info("memory jobs started")

    async def stop(self, grace: float) -> None:
        if self._scheduler is not None:
            await self._scheduler.stop(grace)
        if self._memory is not None:
            await self._memory.stop()


def _secret(value: str) -> Any:
    from pydantic import SecretStr

    return SecretStr(value)


def worker_process_main(settings: Settings, index: int) -> None:
    """Entry point of one worker process."""
    from gateway.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format, process=f"turns-{index}")
    # Turn workers yield the CPU to the web server (``PEPPER_TURN_WORKER_NICE``): acknowledgements
    # first, turns with what is left. Relative to the server: a server already niced stays ahead.
    with contextlib.suppress(OSError):
        os.nice(settings.turn_worker_nice)
        if settings.turn_worker_idle:
            to_idle_class(0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_worker_process(settings, index))


def turn_pool_size(settings: Settings) -> int:
    """A turn worker's pool: a turn takes a connection only while it needs one, so a few more than
    its concurrent turns is plenty."""
    return settings.max_concurrent_turns + 4


async def _worker_process(settings: Settings, index: int) -> None:
    from core.store import Database
    from gateway.server import build_turn_services

    stop = ChildStop()
    assert settings.database_url is not None
    # The Postgres backends doing the turns' work yield the CPU as this process does (when local).
    # All are opened before the first claim: a backend forked and set up mid-burst costs the
    # postmaster's CPU, at the web server's priority.
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    idle = hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE
    size = turn_pool_size(settings)
    db = await Database.open(
        settings.database_url.get_secret_value(), min_size=size, max_size=size, backend_nice=own_nice,
        backend_idle=idle,
    )  # fmt: skip
    try:
        async with build_turn_services(settings, db) as services:
            worker = TurnWorker(services, concurrency=settings.max_concurrent_turns)
            await worker.start()
            jobs = BackgroundJobs(settings, services) if index == 0 else None
            if jobs is not None:
                jobs.start()
            log.info("turn worker ready (claims as %s)", worker.pid)
            await stop.stopped("turn worker")
            grace = settings.graceful_timeout
            await asyncio.gather(worker.stop(grace), *([jobs.stop(grace)] if jobs is not None else []))
    finally:
        await db.close()


class ChildStop(asyncio.Event):
    """In a child process: set by SIGTERM (the supervisor's stop) or SIGINT. Made in the child's
    event loop before anything slow starts, so a stop during start-up is not lost."""

    def __init__(self) -> None:
        super().__init__()
        self.parent = os.getppid()
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
