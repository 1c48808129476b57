"""The record of refused requests: what happened and where, never the content.

A flood of forged requests must not become a flood of rows: per kind, each process records at most
``PER_MINUTE`` events a minute and counts the rest; the next event it records of that kind carries
the count (``detail.suppressed``). Nothing is counted from these rows: the PIN lock counts wrong
answers in ``call_verification_attempts`` (``voice.verification``). ``prune_security_events``
deletes events older than ``RETENTION`` (the memory jobs run it).
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from core.store.queries import Queries

log = logging.getLogger(__name__)

PER_MINUTE = 30
WINDOW_SECONDS = 60.0
RETENTION = timedelta(days=90)


class EventLimiter:
    """Per kind, at most ``per_window`` events in a fixed window of ``window`` seconds."""

    def __init__(
        self, per_window: int = PER_MINUTE, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_window, self.window, self.clock = per_window, window, clock
        self._kinds: dict[str, list[float | int]] = {}  # kind -> [window start, recorded, suppressed]

    def admit(self, kind: str) -> tuple[bool, int]:
        """(record this one?, how many of this kind went unrecorded before it, to note with it)."""
        now = self.clock()
        state = self._kinds.get(kind)
        carried = 0
        if state is None or now - state[0] >= self.window:
            if state is not None:
                carried = int(state[2])
            state = self._kinds[kind] = [now, 0, carried]
        if state[1] >= self.per_window:
            if state[2] == 0:  # the first one over the limit in this window
                log.warning("security events over the limit; counting instead of recording: kind=%s", kind)
            state[2] += 1
            return False, 0
        state[1] += 1
        carried, state[2] = int(state[2]), 0
        return True, carried


_limiters: weakref.WeakKeyDictionary[Any, EventLimiter] = weakref.WeakKeyDictionary()
_shared = EventLimiter()


def _limiter(db: Queries) -> EventLimiter:
    try:
        limiter = _limiters.get(db)
        if limiter is None:
            limiter = _limiters[db] = EventLimiter()
        return limiter
    except TypeError:  # not weak-referenceable
        return _shared


async def record_security_event(db: Queries, kind: str, **detail: str | None) -> None:
    """Record a refusal (a forged signature, a reused token, a failed PIN), within the rate limit.

    Never raises: the refusal itself must not fail because its record did.
    """
    record, suppressed = _limiter(db).admit(kind)
    if not record:
        return
    if suppressed:
        detail["suppressed"] = str(suppressed)
    try:
        await db.execute("INSERT INTO security_events (kind, detail) VALUES ($1, $2::jsonb)", kind, json.dumps(detail))
    except Exception:
        log.exception("could not record a security event")


async def prune_security_events(db: Queries, now: datetime, retention: timedelta = RETENTION) -> int:
    """Delete security events older than ``retention``; how many went."""
    status = await db.execute("DELETE FROM security_events WHERE created_at < $1", now - retention)
    removed = int(status.split()[-1])
    if removed:
        log.info("pruned old security events: count=%s", removed)
    return removed
