"""The ``heartbeat_interval`` slot: one more veto on a scheduled run that is already due.

The scheduler asks it right before a due task (a briefing, a watch) runs; it never changes a
task's schedule, and reminders are never vetoed (a reminder the person set must arrive). The
built-in always allows. An occupant can skip pulses while the person's usage tier
(``core.usage.usage_tier``) is ``critical`` or ``dead``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from core.slots import HEARTBEAT, SLOTS, SlotSpec
from core.store.queries import Queries

HEARTBEAT_TIMEOUT = 2.0


@dataclass(frozen=True)
class Pulse:
    account_id: UUID
    task_id: int
    title: str
    usage: str  # the person's usage tier now


class HeartbeatInterval(Protocol):
    async def allowed(self, pulse: Pulse) -> bool: ...


class BuiltinHeartbeat:
    async def allowed(self, pulse: Pulse) -> bool:
        return True


def _is_bool(_method: str, result: Any) -> bool:
    return isinstance(result, bool)


async def pulse_allowed(db: Queries, pulse: Pulse) -> bool:
    """True unless the occupant of ``heartbeat_interval`` for the person skips this pulse."""
    return bool(await SLOTS.call(db, HEARTBEAT, pulse.account_id, "allowed", pulse))


SPEC = SLOTS.register(SlotSpec(HEARTBEAT, ("allowed",), BuiltinHeartbeat(), _is_bool, HEARTBEAT_TIMEOUT,
                               "a veto on a scheduled run that is due"))  # fmt: skip
