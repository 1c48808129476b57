"""Call control across processes: a call ends where it is held, whichever process heard it end.

A call lives in the process whose media socket Twilio connected to (``pepper serve`` runs several,
``PEPPER_MEDIA_PROCESSES``), but Twilio's status callback reaches the web server. Every process
that holds calls keeps one listening connection; its backend pid is written on each call it holds
(``calls.held_by``). The status callback records the end (``calls.ended_at``) and announces the
``CallSid`` on ``pepper_calls``; the holder hangs the session up at once.

Notifications are fast but not durable (one sent while the listening connection was reconnecting
is lost), so each holder also looks every ``POLL_SECONDS`` for held calls whose row says they
ended: a missed notification delays a hang-up by at most that, never past the call's maximum.

The same sweep writes the end of calls held by a process that died before writing it (its
listening session is gone from ``pg_stat_activity``; a call's own end always sets ``summary``):
the call is marked ended (``process-died``), its turn failed, the writes it staged dropped. The
transcript lines recorded while it ran are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from core.conversation import update_turn
from core.records import calls as call_records
from core.records.turns import turn_status
from core.store.queries import Queries
from core.store.sessions import Listener
from core.tools.staging import drop_turn_writes

log = logging.getLogger(__name__)

CHANNEL = "pepper_calls"
POLL_SECONDS = 2.0
# How long a call's holder must stay gone before its end is written for it: a holder whose
# connection dropped reconnects (within a poll) and records its calls under its new session.
ORPHAN_GRACE = 3 * POLL_SECONDS
# Statuses after which Twilio's call is over.
FINAL_STATUSES = frozenset({"completed", "busy", "no-answer", "failed", "canceled"})
DIED = "process-died"
CUT_SHORT = "Phone call cut short: the process holding it stopped."


async def record_call_status(db: Queries, call_sid: str, status: str) -> None:
    """Record a final status and tell the process holding the call, in one statement."""
    await call_records.record_final_status(db, call_sid, status, channel=CHANNEL)


class CallControl:
    """The listening side, in each process that holds calls: hangs up the held calls that ended
    elsewhere, and writes the end of calls whose holder died. ``calls`` is the process's
    :class:`~voice.service.CallService`."""

    def __init__(
        self, calls: Any, dsn: str, *, name: str = "pepper-calls", poll_seconds: float = POLL_SECONDS,
        orphan_grace: float = ORPHAN_GRACE,
    ):  # fmt: skip
        self._calls = calls
        self._dsn = dsn
        self._name = name
        self._poll = poll_seconds
        self._grace = orphan_grace
        self._suspects: dict[tuple[str, int], float] = {}  # (call_sid, held_by) -> when first seen orphaned
        self._listener: Listener | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready = False

    @property
    def holder(self) -> int | None:
        """The backend pid calls held here are recorded under (``calls.held_by``)."""
        return self._calls.deps.holder

    async def start(self) -> None:
        await self._listen()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self._name}-control")

    async def _listen(self) -> None:
        # Named with the OS pid: an operator (or a test) can tell which process holds which call.
        listener = await Listener.open(self._dsn, CHANNEL, self._announced, application_name=self._application_name())
        self._listener = listener
        # Calls opened from now on are recorded under this session: while it lives, so do they.
        holder = self._calls.deps.holder = listener.pid
        held = list(self._calls.sessions)
        if held:  # a new session after a lost connection: the calls still running move to it
            await call_records.hold_calls(self._calls.deps.db, holder, held)

    def _application_name(self) -> str:
        return f"{self._name} {os.getpid()}{' ready' if self._ready else ''}"

    async def mark_ready(self) -> None:
        """Say in the session's name that this process now accepts calls (what start-up waits for)."""
        self._ready = True
        if self._listener is not None:
            await self._listener.rename(self._application_name())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._listener is not None:
            # Closed last (after the calls drained): until then this process visibly holds them.
            await self._listener.close()
            self._listener = None

    def _announced(self, call_sid: str) -> None:
        session = self._calls.sessions.get(call_sid)
        if session is not None:
            log.info("call %s ended (status callback); hanging up", call_sid[-8:])
            session.hang_up("hangup")

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._poll)
            try:
                if self._listener is None or self._listener.is_closed():
                    # Whatever was announced meanwhile is lost; the look below finds it.
                    await self._listen()
                await self.claim_held()
                await self.hang_up_ended()
                await self.end_orphans()
            except Exception:
                # Whatever it was, the loop must go on: it is the only reconnect and sweep there is.
                log.warning("call control could not reach the database; trying again", exc_info=True)

    async def claim_held(self) -> None:
        """Record every call running here under this process's session, on each poll: a call
        that opened while the listening connection was being replaced (its row written with the
        old session's pid) must not look orphaned to the others' sweep."""
        held = [sid for sid, session in self._calls.sessions.items() if not session.ended]
        if held and self.holder is not None:
            await call_records.hold_calls(self._calls.deps.db, self.holder, held)

    async def hang_up_ended(self) -> None:
        """Hang up held calls whose row says they ended (a notification that never arrived)."""
        held = list(self._calls.sessions)
        if not held:
            return
        for call_sid in await call_records.ended_among(self._calls.deps.db, held):
            session = self._calls.sessions.get(call_sid)
            if session is not None and not session.ended:
                log.warning("call %s ended without its notification reaching us; hanging up", call_sid[-8:])
                session.hang_up("hangup")

    async def end_orphans(self) -> list[str]:
        """Write the end of calls left unfinished by a process that died: orphaned (their holder's
        session gone) for ``orphan_grace`` seconds, so a holder whose connection dropped has time to
        reconnect and claim its calls again. Each row is claimed by one statement, so several
        processes sweeping at once write each end once."""
        db = self._calls.deps.db
        seen = await call_records.orphaned(db)
        now = asyncio.get_running_loop().time()
        self._suspects = {key: self._suspects.get(key, now) for key in seen}
        due = [key for key, since in self._suspects.items() if now - since >= self._grace]
        if not due:
            return []
        # Claimed by this process (not cleared): if it dies before writing the end, the row is an
        # orphan again and another sweep finishes it.
        rows = await call_records.end_orphans(db, due, reason=DIED, holder=self.holder)
        for key in due:
            self._suspects.pop(key, None)
        for row in rows:
            log.error("call %s was held by a process that died; recording its end", row["call_sid"][-8:])
            try:
                turn_id = row["turn_id"]
                if (  # else it died after writing the turn's end itself
                    turn_id is not None and await turn_status(db, turn_id) == "running"
                ):
                    dropped = await drop_turn_writes(db, self._calls.deps.registry, turn_id)
                    await update_turn(
                        db, turn_id, status="failed", error=DIED, finished_at=self._calls.deps.clock(),
                        delivery={"end_reason": DIED}, staged_writes=[w.as_record() for w in dropped],
                    )  # fmt: skip
                # Last, as a call's own end does: a call with a summary is fully recorded.
                await call_records.summarize_if_missing(db, row["call_sid"], CUT_SHORT)
            except Exception:
                log.exception("could not record the end of call %s", row["call_sid"][-8:])
        return [r["call_sid"] for r in rows]
