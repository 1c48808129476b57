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

Turn workers also send what answering calls promised (``answering_service.deliveries``: callers'
confirmation texts and the owner's notices), recorded with the calls' writes and announced on the
same ``pepper_turns`` channel, in one task at a time beside the turns.

A claim records the backend pid of the worker's listening connection. When a worker dies, its
session ends, and any worker finds the messages it held, queues them again and answers them: a
message whose turn had not started gets its turn; one whose turn was cut short gets the apology
(running it again could repeat what it did) and that turn's staged writes are dropped. A session
also ends under a live worker (Postgres restarted, the connection was cut): the worker listens
again and claims the messages of the turns it is still running under its new session, and a
sweep hands a gone session's messages back only after ``ORPHAN_GRACE``, so that a turn still on
its way is never answered a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from core.conversation import carry_claims, claim_turn, gone_claimers, release_claims, release_orphans
from core.records import messages
from core.settings import Settings
from core.store.database import to_idle_class, unreachable
from core.store.queries import Queries
from core.store.sessions import DRIVER_ERRORS, Listener
from gateway.channels import Channel, Pipeline, settle_delivery
from gateway.children import ChildProcesses, ChildStop
from gateway.live import ProgressPublisher
from gateway.services import Services

if TYPE_CHECKING:
    from gateway.plugin_channels import ChannelSupervisor

log = logging.getLogger(__name__)

CHANNEL = "pepper_turns"
# Notifications wake a worker at once; this is only the fallback (a notification missed while the
# listening connection was busy reconnecting, a worker that died and left messages).
POLL_SECONDS = 2.0
# Claims from before workers named themselves: a turn never runs this long.
STALE_RUNNING = timedelta(minutes=10)
# Past this, an answer would only confuse: the message is marked expired instead.
RESUME_WINDOW = timedelta(hours=1)
# How long a session claims are recorded under must have been gone before they are handed back: a
# worker whose session ended (Postgres restarted, the connection was cut) is often still running
# those turns, and claims them again under its new session as soon as it listens again.
ORPHAN_GRACE = 5.0


class TurnWorker:
    """Claims queued messages and runs up to ``concurrency`` turns at once, each through the
    text channels' one pipeline (``gateway.channels``); ``channels`` by default those of
    ``gateway.composition.text_channels``."""

    def __init__(
        self, services: Services, *, concurrency: int, poll_seconds: float = POLL_SECONDS,
        channels: Iterable[Channel] | None = None, orphan_grace: float = ORPHAN_GRACE,
    ) -> None:  # fmt: skip
        if channels is None:
            from gateway.composition import text_channels

            channels = text_channels()
        self._services = services
        self._progress = ProgressPublisher(services.db.dsn)
        self._pipeline = Pipeline(services, channels, self._progress.publish)
        self._slots = asyncio.Semaphore(concurrency)
        self._poll = poll_seconds
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._listener: Listener | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._delivering: asyncio.Task[Any] | None = None
        self._deliverer: tuple[Any, Any] | None = None
        self._deliver_again = False
        self.pid = 0  # the backend pid claims are recorded under
        self._answering: dict[asyncio.Task[Any], tuple[int, ...]] = {}  # the turns running, their messages
        self._old_pids: list[int] = []  # sessions of this worker that ended with turns still running
        self._grace = orphan_grace
        self._gone: dict[int, float] = {}  # sessions of claims seen gone, and since when
        self._failed: list[int] = []  # messages of turns that raised, to hand back
        self._sessions: list[int] = []  # every session this worker claimed under (one a reconnect)

    async def start(self) -> None:
        self._listener = await self._listen()
        self.pid = self._listener.pid
        self._sessions.append(self.pid)
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name=f"turn-worker-{self.pid}")

    async def stop(self, grace: float) -> None:
        """Claim nothing more, let running turns finish for ``grace`` seconds, then close."""
        self._stopping.set()
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        await self._services.tasks.drain(grace)
        if self._listener is not None:
            # Closing the session last: the messages of turns cut short now count as orphans.
            await self._listener.close()
            self._listener = None
        await self._progress.close()

    async def _resolve_stuck_sending(self) -> None:
        """Once, at start: replies a crash left ``sending`` whose texts no worker takes again
        (``core.records.messages.resolve_stuck_sending``); their turns' writes are dropped."""
        for turn_id in await messages.resolve_stuck_sending(self._services.db, older_than=STALE_RUNNING):
            log.warning("a reply left unconfirmed by a crash is marked sent-unknown; its writes are dropped")
            await settle_delivery(self._services, turn_id, ok=False, detail={"reason": "sent-unknown"})

    async def _run(self) -> None:
        db = self._services.db
        loop = asyncio.get_running_loop()
        swept = -self._poll
        try:
            await self._resolve_stuck_sending()
        except Exception:  # never worth a worker that does not start
            log.exception("resolving replies left sending failed")
        while not self._stopping.is_set():
            self._wake.clear()  # before looking, so an announcement made meanwhile is not lost
            try:
                if self._listener is None or self._listener.is_closed():
                    await self._listen_again()
                if self._old_pids:
                    await self._carry_claims()
                if self._failed:
                    # A turn that lost its database mid-turn left its messages claimed: handed
                    # back, they are answered as a dead worker's are.
                    failed, self._failed = self._failed, []
                    try:
                        await release_claims(db, failed, self._sessions)
                    except BaseException:
                        self._failed = failed + self._failed
                        raise
                if loop.time() - swept >= self._poll:  # not on every announcement: it scans sessions
                    await self._release_orphans()
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
                self._deliver()
            except DRIVER_ERRORS:
                log.warning("turn worker could not reach the database; trying again", exc_info=True)
            except Exception:
                # The loop must outlive any one pass: a worker whose loop died would hold its
                # process (and its claims' session) while answering nothing.
                log.exception("turn worker pass failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll)

    async def _listen(self) -> Listener:
        # A session that ends wakes the loop, to listen again and carry the claims over at once.
        wake = self._wake.set
        return await Listener.open(self._services.db.dsn, CHANNEL, lambda _: wake(), closed=wake)

    async def _listen_again(self) -> None:
        """The listening session ended (Postgres restarted, the connection was cut): listen on a
        new one and claim under its pid. The turns this worker is still running keep their
        messages (:meth:`_carry_claims`); what it claimed under the old pid for nothing running
        any more is an orphan, which a sweep hands back once the old session has been gone for
        the grace (a turn not started runs; one cut short gets the apology)."""
        if self._listener is not None:
            with contextlib.suppress(*DRIVER_ERRORS):
                await self._listener.close()
            self._listener = None
        self._listener = await self._listen()
        log.warning("turn worker listening again after its database session ended: pid %s -> %s",
                    self.pid, self._listener.pid)  # fmt: skip
        if self._answering:
            self._old_pids.append(self.pid)
        self.pid = self._listener.pid
        self._sessions.append(self.pid)

    async def _carry_claims(self) -> None:
        """Claim the messages of the turns still running again, under the new session: else a
        sweep would take them for a dead worker's, and a second turn worker would answer them
        (an apology beside the reply, or a reply sent again while the first was on its way)."""
        ids = [i for message_ids in self._answering.values() for i in message_ids]
        carried = await carry_claims(self._services.db, ids, self._old_pids, self.pid)
        if len(carried) < len(ids):
            log.error("%d message(s) of turns still running were claimed by another worker meanwhile",
                      len(ids) - len(carried))  # fmt: skip
        self._old_pids = []

    async def _release_orphans(self) -> None:
        """Hand back the claims of sessions gone for at least the grace (their worker is dead, or
        did not claim them again in time)."""
        db, now = self._services.db, asyncio.get_running_loop().time()
        gone = await gone_claimers(db)
        self._gone = {pid: self._gone.get(pid, now) for pid in gone}
        due = [pid for pid, since in self._gone.items() if now - since >= self._grace]
        await release_orphans(db, stale=STALE_RUNNING, expire_after=RESUME_WINDOW, claimers=due)

    def _deliver(self) -> None:
        """Send what answering calls promised (``answering_service.deliveries``), in one task at a
        time beside the turns: a wake-up while it runs is picked up by the next pass."""
        if self._stopping.is_set():
            return
        if self._delivering is not None and not self._delivering.done():
            self._deliver_again = True  # announced while it ran: look once more when it is done
            return
        self._deliver_again = False
        if self._deliverer is None:
            from gateway.composition import answering_notifier, plain_sms

            services = self._services
            self._deliverer = (answering_notifier(services.settings, services.db, services.messenger),
                               plain_sms(services.messenger))  # fmt: skip
        from answering_service.deliveries import deliver_due

        notifier, send_sms = self._deliverer
        self._delivering = self._services.tasks.spawn(
            "answering-deliveries", deliver_due(self._services.db, notifier, send_sms), limited=False
        )
        self._delivering.add_done_callback(self._delivered)

    def _delivered(self, _: Any) -> None:
        if self._deliver_again:
            self._wake.set()

    def _start(self, rows: list[Any]) -> None:
        task = self._services.tasks.spawn(f"turn-{rows[0]['channel']}-{rows[0]['id']}", self._answer(rows))
        self._answering[task] = tuple(r["id"] for r in rows)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        ids = self._answering.pop(task, ())
        if not task.cancelled() and (error := task.exception()) is not None and unreachable(error):
            self._failed.extend(ids)  # not for any other error: it could fail the same way again
        self._slots.release()
        # The person may have written again during the turn: those messages waited for it, and
        # no announcement will come for them.
        self._wake.set()

    async def _answer(self, rows: list[Any]) -> None:
        await self._pipeline.answer(rows)


def start_in_process(services: Services) -> TurnWorker:
    """A worker in this process and event loop (``PEPPER_TURN_WORKERS=0``, tests)."""
    return TurnWorker(services, concurrency=services.settings.max_concurrent_turns)


class TurnProcesses(ChildProcesses):
    """The turn-worker processes of ``pepper serve`` (``PEPPER_TURN_WORKERS``)."""

    label = "turn worker"
    name = "pepper-turns"

    @staticmethod
    def target(settings: Settings, index: int) -> None:
        worker_process_main(settings, index)


class BackgroundJobs:
    """The scheduler and the memory jobs, in the first turn-worker process: a scheduled run is a
    turn, and indexing new messages for search is throughput work; neither belongs beside the
    acknowledgements (with ``PEPPER_TURN_WORKERS=0`` the web server runs them). Both are safe in
    several processes at once (leases, ``SKIP LOCKED``), so a restarted worker taking over while
    its predecessor's runs expire is fine."""

    def __init__(self, settings: Settings, services: Services) -> None:
        from gateway.composition import start_memory
        from gateway.scheduled import build_scheduler

        harness = services.harness
        self._scheduler = (
            build_scheduler(settings, harness, services.messenger, services.mailer)
            if settings.scheduler_enabled
            else None
        )
        self._memory = start_memory(settings, services.db, harness.models)
        self._channels = channel_supervisor(services.db)

    def start(self) -> None:
        if self._channels is not None:
            self._channels.start()
        if self._scheduler is not None:
            from gateway.scheduled import start_outbound

            self._scheduler.start()
            start_outbound(self._scheduler)
        if self._memory is not None:
            self._memory.start()
            log.info("memory jobs started")

    async def stop(self, grace: float) -> None:
        if self._channels is not None:
            await self._channels.stop()
        if self._scheduler is not None:
            from gateway.scheduled import stop_outbound

            await self._scheduler.stop(grace)
            await stop_outbound(self._scheduler)
        if self._memory is not None:
            await self._memory.stop()


def channel_supervisor(db: Queries) -> ChannelSupervisor | None:
    """The long-lived connections of channel plugins (``gateway.plugin_channels``), or None
    when no plugin has one."""
    from gateway.plugin_channels import ChannelSupervisor, channel_plugins

    supervisor = ChannelSupervisor(db, channel_plugins())
    if not supervisor.names:
        return None
    log.info("channel plugin connections: %s", ", ".join(supervisor.names))
    return supervisor


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
    from gateway.composition import build_turn_services

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
