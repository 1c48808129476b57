"""The scheduler: finds due occurrences, claims them, runs each as a scheduled turn, delivers.

One :class:`Scheduler` per process; any number of processes may share one database. The loop:

1. ``materialize`` due occurrences (missed ones get receipts; the newest in the catch-up window
   runs once), ``expire_stale`` ones that waited past the window;
2. ``claim`` as many as there are free run slots, each with a lease;
3. run each in its own named task with a heartbeat that extends the lease; a run whose lease is
   lost is cancelled (another process owns it now);
4. judge silence from the turn record, deliver with keyed deliveries, leave the receipt.

A run that crashes (its process killed) keeps its lease until it expires; then any process
claims it again. Its earlier deliveries are found by key and not repeated: if the result was
already delivered, the re-run only writes the receipt. A run that keeps failing is given up after
``max_attempts`` and reported to the person as failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID
from zoneinfo import ZoneInfo

from core import suggestions
from core.conversation import (
    conversation_for,
    extend_hold,
    hold_for_scheduled_turn,
    last_inbound_channel,
    release_hold,
    turn_tool_calls,
)
from core.scheduling import runs
from core.scheduling.heartbeat import Pulse, pulse_allowed
from core.scheduling.runs import Claim
from core.tools.connectors import Connectors
from core.usage import breaker
from core.usage.ledger import usage_tier
from text_loop.prompt import labelled
from text_loop.scheduler.delivery import Deliverer, DeliveryRequest, DeliveryResult, delivery_key
from text_loop.scheduler.silence import SILENT_MARK, Evidence, judge, strip_mark
from text_loop.turn import HarnessDeps, deliver, run_turn

log = logging.getLogger(__name__)

# How a usual channel is guessed from the person's last message.
_USUAL: dict[str, str] = {"sms": "sms", "whatsapp": "whatsapp", "email": "email"}
# The turn's channel for each delivery channel (decides e.g. the repair pass).
_TURN_CHANNEL: dict[str, str] = {"chat": "web", "sms": "sms", "whatsapp": "whatsapp", "email": "email",
                                 "call": "voice"}  # fmt: skip
FAILED_TURN_STATUSES = frozenset({"no-model", "model-error", "empty", "over-cap", "harness-error"})


@dataclass(frozen=True)
class SchedulerConfig:
    """``lease``: how long a claim holds without a heartbeat; ``heartbeat``: how often a running
    run renews it. ``catch_up``: how old a missed occurrence may be and still run after a
    restart. ``slots``: runs in flight per process."""

    lease: timedelta = timedelta(seconds=120)
    heartbeat: timedelta = timedelta(seconds=30)
    poll: float = 15.0
    catch_up: timedelta = timedelta(hours=6)
    slots: int = 4
    max_attempts: int = 3
    retry_after: timedelta = timedelta(minutes=1)
    error_backoff: float = 5.0
    drain_grace: float = 10.0
    # A run whose person is being answered already (a message turn, another of their runs) looks
    # again every ``busy_poll`` seconds, in its slot and under its lease, for up to ``busy_wait``;
    # then it is given back to run ``busy_retry`` later.
    busy_poll: float = 0.2
    busy_wait: timedelta = timedelta(seconds=60)
    busy_retry: timedelta = timedelta(seconds=5)
    # Each pass of the loop also runs the calendar's detectors for accounts whose data changed.
    suggestions: bool = True


def process_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseLost(Exception):
    pass


class ConversationBusy(Exception):
    """A turn is answering the person's conversation: the run waits for it (migration 0103)."""


class FollowChecks(Protocol):
    """Checks of followed sources (``core.following.checks.Following``): claimed with leases of their own."""

    owner: str

    async def tick(self) -> int: ...


class Scheduler:
    def __init__(
        self,
        deps: HarnessDeps,
        deliverer: Deliverer,
        config: SchedulerConfig | None = None,
        *,
        owner: str | None = None,
        clock: Callable[[], datetime] | None = None,
        follows: FollowChecks | None = None,
    ):
        self.deps = deps
        self.db = deps.db
        self.deliverer = deliverer
        self.config = config or SchedulerConfig()
        self.owner = owner or process_owner()
        self.clock = clock or deps.clock
        self._loop_task: asyncio.Task[None] | None = None
        self._running: dict[int, asyncio.Task[None]] = {}
        self._holds: dict[int, UUID] = {}  # run -> the conversation its turn holds
        self._wake = asyncio.Event()
        # Followed pages, feeds, teams and shows: checked in one task of their own beside the runs,
        # so a slow site never holds up a briefing.
        self.follows = follows
        self._follow_task: asyncio.Task[int] | None = None
        if follows is not None:
            follows.owner = self.owner

    # --- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop as a named task owned by this object; ``stop`` ends it."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="pepper-scheduler")

    async def stop(self, grace: float | None = None) -> None:
        """Stop claiming; let runs in flight finish for ``grace`` seconds, then cancel and release them."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        running = set(self._running.values())
        if self._follow_task is not None and not self._follow_task.done():
            running.add(self._follow_task)  # type: ignore[arg-type]
        if running:
            _, late = await asyncio.wait(running, timeout=self.config.drain_grace if grace is None else grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
        close = getattr(self.deliverer, "aclose", None)
        if close is not None:
            await close()

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        log.info("scheduler started: owner=%s", self.owner)
        while True:
            try:
                await self.tick()
                await self.suggest()
                delay = self.config.poll
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler tick failed; retrying: error=%s", type(exc).__name__, exc_info=True)
                delay = self.config.error_backoff
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def tick(self) -> list[asyncio.Task[None]]:
        """One pass: record due occurrences, claim what fits in the free slots, start them."""
        now = self.clock()
        while await runs.materialize(self.db, now, window=self.config.catch_up):
            pass
        await runs.expire_stale(self.db, now, window=self.config.catch_up)
        self._check_follows()
        free = self.config.slots - len(self._running)
        started: list[asyncio.Task[None]] = []
        for claim in await runs.claim(self.db, self.owner, now, lease=self.config.lease, limit=free):
            task = asyncio.get_running_loop().create_task(self._guarded(claim), name=f"scheduled-run-{claim.run_id}")
            self._running[claim.run_id] = task
            task.add_done_callback(lambda _t, run_id=claim.run_id: self._done(run_id))
            started.append(task)
        return started

    async def suggest(self) -> int:
        """Run the calendar's detectors for people whose calendar, todos, notes or inbound mail
        changed since their last run (``core.suggestions``); one query when nothing changed."""
        if not self.config.suggestions:
            return 0
        return await suggestions.run_changed(self.db, self.deps.connectors or Connectors(), self.owner, self.clock())

    def _check_follows(self) -> None:
        if self.follows is None or (self._follow_task is not None and not self._follow_task.done()):
            return
        self._follow_task = asyncio.get_running_loop().create_task(self._follow_pass(), name="pepper-follow-checks")

    async def _follow_pass(self) -> int:
        try:
            return await self.follows.tick() if self.follows is not None else 0
        except Exception as exc:  # a check records its own failure; this is the store failing
            log.warning("follow checks failed: error=%s", type(exc).__name__, exc_info=True)
            return 0

    async def follows_done(self) -> int:
        """Wait for the follow checks in flight (tests, the CLI); how many ran."""
        task = self._follow_task
        return await task if task is not None else 0

    async def run_due(self) -> int:
        """Run everything due now and wait for it (tests, the CLI); returns how many runs ran."""
        total = 0
        while True:
            started = await self.tick()
            if not started:
                return total
            total += len(started)
            await asyncio.gather(*started)

    def _done(self, run_id: int) -> None:
        self._running.pop(run_id, None)
        self._wake.set()

    # --- one run ---------------------------------------------------------------------------

    async def _guarded(self, claim: Claim) -> None:
        """Run with a heartbeat; give the run back on a graceful stop; never raise (except cancel)."""
        work = asyncio.get_running_loop().create_task(self._run(claim), name=f"scheduled-turn-{claim.run_id}")
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=self.config.heartbeat.total_seconds())
                if done:
                    work.result()
                    return
                try:
                    kept = await runs.extend_lease(
                        self.db, claim.run_id, self.owner, self.clock(), lease=self.config.lease
                    )
                except Exception as exc:
                    log.warning("lease heartbeat failed: run=%s error=%s", claim.run_id, type(exc).__name__)
                    continue
                if not kept:
                    # A run that has just finished is no longer running either: let it end.
                    done, _ = await asyncio.wait({work}, timeout=self.config.heartbeat.total_seconds())
                    if done:
                        work.result()
                        return
                    log.warning("lease lost; abandoning the run: run=%s", claim.run_id)
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                    return
                held = self._holds.get(claim.run_id)
                if held is not None:
                    try:
                        await extend_hold(self.db, held, lease=self.config.lease)
                    except Exception as exc:
                        log.warning("conversation hold renewal failed: run=%s error=%s", claim.run_id,
                                    type(exc).__name__)  # fmt: skip
        except asyncio.CancelledError:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            try:
                await asyncio.shield(
                    runs.release(
                        self.db, claim.run_id, self.owner, due_at=self.clock(), reason=None, count_attempt=False
                    )
                )
            except Exception:
                log.warning("could not release a run at shutdown; its lease will expire: run=%s", claim.run_id)
            raise
        except ConversationBusy:
            await self._wait_for_the_turn(claim)
        except Exception as exc:
            log.error("scheduled run failed: run=%s error=%s", claim.run_id, type(exc).__name__, exc_info=exc)
            await self._retry_or_fail(claim, f"an internal error ({type(exc).__name__})")
        finally:
            if not work.done():
                work.cancel()

    async def _wait_for_the_turn(self, claim: Claim) -> None:
        """Give the run back, not counted as an attempt, to run once the person's turn is done."""
        wait = self.config.busy_retry
        try:
            await runs.release(self.db, claim.run_id, self.owner, due_at=self.clock() + wait,
                                 reason="waiting for the turn answering the person", count_attempt=False)  # fmt: skip
        except Exception as exc:
            log.warning("could not give back a waiting run; its lease will expire: run=%s error=%s", claim.run_id, exc)
            return
        asyncio.get_running_loop().call_later(wait.total_seconds(), self._wake.set)

    async def _retry_or_fail(self, claim: Claim, why: str) -> None:
        try:
            if claim.attempts < self.config.max_attempts:
                due = self.clock() + self.config.retry_after * claim.attempts
                await runs.release(self.db, claim.run_id, self.owner, due_at=due, reason=why)
            else:
                await self._give_up(claim, why)
        except Exception as exc:
            log.warning("could not record a run's failure; its lease will expire: run=%s error=%s", claim.run_id, exc)

    async def _give_up(self, claim: Claim, why: str) -> None:
        body = f"Your scheduled task “{claim.title}” could not run: {why}. Pepper will try again at its next time."
        if claim.kind == "reminder":
            body = f"Reminder: {claim.prompt}"
        await self._deliver_all(claim, body, None)
        await runs.finish(self.db, claim.run_id, self.owner, self.clock(), status="failed", reason=why)

    async def _run(self, claim: Claim) -> None:
        db, now = self.db, self.clock()
        if await runs.delivered_earlier(db, claim.run_id):
            # A previous attempt delivered before it died: the person has the result; do not post twice.
            await runs.finish(db, claim.run_id, self.owner, now, status="ran", reason="delivered by an earlier attempt")
            return
        if claim.attempts > self.config.max_attempts:
            await self._give_up(claim, f"it was interrupted {claim.attempts - 1} times")
            return
        if claim.task_status == "cancelled":
            await runs.finish(db, claim.run_id, self.owner, now, status="missed", reason="the task was cancelled")
            return
        if await breaker.paused(db, f"task:{claim.task_id}", now):
            await runs.finish(
                db, claim.run_id, self.owner, now, status="missed", reason="paused by the circuit breaker"
            )
            return
        if claim.kind != "reminder":
            tier = await usage_tier(db, claim.account_id, now, self.deps.usage)
            if not await pulse_allowed(db, Pulse(claim.account_id, claim.task_id, claim.title, tier)):
                await runs.finish(db, claim.run_id, self.owner, now, status="missed",
                                  reason="skipped by the heartbeat_interval slot")  # fmt: skip
                return
        # The turn takes its turn in the person's conversation, as a message turn does.
        conversation_id = await conversation_for(db, claim.account_id)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.config.busy_wait.total_seconds()
        while not await hold_for_scheduled_turn(db, conversation_id, lease=self.config.lease):
            if loop.time() >= give_up_at:
                raise ConversationBusy
            await asyncio.sleep(self.config.busy_poll)
        self._holds[claim.run_id] = conversation_id
        try:
            await self._run_held(claim)
        finally:
            self._holds.pop(claim.run_id, None)
            # Shielded: a run cancelled here must still give the conversation back, or its messages
            # and the person's other runs wait out the lease. The heartbeat cancels a run whose lease
            # it cannot extend, and that includes a run that has just finished (no longer running).
            await asyncio.shield(release_hold(db, conversation_id))

    async def _run_held(self, claim: Claim) -> None:
        db = self.db
        channels = await self._channels(claim)
        outcome = await run_turn(
            self.deps, claim.account_id, _TURN_CHANNEL.get(channels[0], "web"), self._text(claim), kind="scheduled"
        )
        await runs.set_turn(db, claim.run_id, self.owner, outcome.turn_id)
        limit = self.deps.usage.breaker_failures
        if await breaker.record(db, f"task:{claim.task_id}", claim.account_id, outcome.status, self.clock(), limit):
            await self._deliver_all(claim, breaker.tripped_notice(f"the task “{claim.title}”", limit), None)
        calls = await turn_tool_calls(db, outcome.turn_id)
        evidence = judge(outcome.reply, outcome.status, _json_list(calls), staged_writes=outcome.staged_writes)
        failed_turn = outcome.status in FAILED_TURN_STATUSES
        if evidence.silent:
            await deliver(self.deps, outcome.turn_id, ok=False, detail={"reason": "silent"})
            await runs.finish(
                db, claim.run_id, self.owner, self.clock(), status="silent",
                evidence=evidence.as_record(), turn_id=outcome.turn_id,
            )  # fmt: skip
            return
        body = self._body(claim, outcome.reply, outcome.status, evidence)
        results = await self._deliver_all(claim, body, outcome.turn_id, channels)
        reached = [r for r in results if r.reached]
        if not reached:
            await deliver(self.deps, outcome.turn_id, ok=False, detail={"reason": "not-delivered"})
            raise RuntimeError("no channel took the result")
        if any(r.status == "delivered" for r in reached):
            await deliver(self.deps, outcome.turn_id, ok=True, detail={"scheduled": True})
        if failed_turn and claim.kind != "reminder":
            status, reason = "failed", f"the model did not answer ({outcome.status})"
        elif failed_turn:
            status, reason = "ran", f"the model did not answer ({outcome.status}); sent the reminder as written"
        else:
            status, reason = "ran", None
        await runs.finish(
            db, claim.run_id, self.owner, self.clock(), status=status, reason=reason,
            evidence=evidence.as_record(), turn_id=outcome.turn_id,
        )  # fmt: skip

    def _text(self, claim: Claim) -> str:
        local = claim.occurrence_at.astimezone(ZoneInfo(claim.timezone))
        when = f"{local:%A %d %B %Y, %H:%M}"
        if claim.kind == "reminder":
            note = (
                f"This is the reminder the person set for {when}. Nobody is waiting for an answer: write the "
                "reminder to them now, in one or two short sentences."
            )
        else:
            note = (
                f"This is a scheduled run of the person's task “{claim.title}” (#{claim.task_id}), due {when}. "
                "Nobody is watching: do the task now with the tools, then write the message Pepper will send "
                "them. If the task is to tell them about something only when there is something, and every "
                f"lookup you made found nothing, reply exactly {SILENT_MARK} and nothing else; Pepper checks "
                "the lookups before staying silent."
            )
        return f"{claim.prompt}\n\n{labelled(note)}"

    def _body(self, claim: Claim, reply: str, status: str, evidence: Evidence) -> str:
        if status in FAILED_TURN_STATUSES:
            if claim.kind == "reminder":
                return f"Reminder: {claim.prompt}"
            return (
                f"Your scheduled task “{claim.title}” could not run: my AI model did not answer ({status}). "
                "I'll try again at its next time."
            )
        if evidence.asked_silence:
            return (
                f"Your scheduled task “{claim.title}” found nothing to report, but I'm telling you anyway because "
                + "; ".join(evidence.why)
                + "."
            )
        return strip_mark(reply) or reply

    async def _channels(self, claim: Claim) -> tuple[str, ...]:
        if claim.deliver_to:
            return claim.deliver_to
        last = await last_inbound_channel(self.db, claim.account_id)
        return (_USUAL.get(last or "", "chat"),)

    async def _deliver_all(
        self, claim: Claim, body: str, turn_id: Any, channels: tuple[str, ...] | None = None
    ) -> list[DeliveryResult]:
        channels = channels or await self._channels(claim)
        results: list[DeliveryResult] = []
        for seq, channel in enumerate(channels):
            result = await self._deliver_once(claim, channel, body, turn_id, seq)
            results.append(result)
            if result.status == "unavailable" and "chat" not in channels:
                log.info("channel unavailable for a scheduled run; falling back to chat: channel=%s", channel)
                fallback = await self._deliver_once(claim, "chat", body, turn_id, len(channels))
                results.append(fallback)
                channels = (*channels, "chat")
        return results

    async def _deliver_once(self, claim: Claim, channel: str, body: str, turn_id: Any, seq: int = 0) -> DeliveryResult:
        key = delivery_key(claim.task_id, claim.occurrence_at, channel)
        if not await runs.claim_delivery(self.db, key, claim.run_id, channel, claim.attempts):
            status = await runs.delivery_status(self.db, key)
            log.info("delivery key already used; not sending again: run=%s channel=%s", claim.run_id, channel)
            return DeliveryResult(status if status in ("delivered", "queued") else "failed", "already handled")
        request = DeliveryRequest(
            key, claim.account_id, channel, body, claim.task_id, claim.occurrence_at, turn_id, claim.run_id, seq
        )
        try:
            result = await self.deliverer.deliver(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("deliverer raised: channel=%s error=%s", channel, type(exc).__name__, exc_info=exc)
            result = DeliveryResult("failed", f"the deliverer raised {type(exc).__name__}")
        await runs.record_delivery(self.db, key, result.status, result.detail or None, result.provider_message_id)
        return result


def _json_list(value: Any) -> list[dict[str, Any]]:
    import json

    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value)
    return list(value)
