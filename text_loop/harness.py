"""The ``harness`` slot: what drives a whole turn. The built-in is the bounded loop (``TurnLoop``).

An occupant gets the turn's :class:`~text_loop.loop.TurnLoop` (its model service, prompt, tools,
history and ``tool_round``, which runs each call through the gate and the tool runner) and returns
the turn's :class:`~text_loop.loop.LoopResult`. It runs inside the turn, not apart from it, and
none of the loop's guards (round cap, time budget, repeat and cap notes) apply unless it calls
``loop.run()`` or uses ``loop.tool_round`` itself: a call it makes any other way bypasses the
gate. **No fallback**: an occupant that raises, exceeds :data:`HARNESS_CEILING` or returns
something that is not a ``LoopResult`` ends the turn with :data:`HARNESS_ERROR_REPLY`; the turn
is never run again on the built-in loop, since the occupant may already have acted.
"""

from __future__ import annotations

from typing import Any, Protocol
from uuid import UUID

from core.slots import HARNESS, SLOTS, SlotFailed, SlotSpec
from core.store.queries import Queries
from text_loop.loop import LoopResult, TurnLoop

HARNESS_CEILING = 600.0
HARNESS_ERROR_REPLY = "Sorry, something went wrong while I was working on that, so I stopped. Please try again."


class Harness(Protocol):
    async def run(self, loop: TurnLoop) -> LoopResult: ...


class BuiltinHarness:
    async def run(self, loop: TurnLoop) -> LoopResult:
        return await loop.run()


def _valid(_method: str, result: Any) -> bool:
    return isinstance(result, LoopResult) and isinstance(result.reply, str) and isinstance(result.status, str)


SPEC = SLOTS.register(
    SlotSpec(HARNESS, ("run",), BuiltinHarness(), _valid, HARNESS_CEILING,
             "drives the whole turn (no fallback: a failure ends the turn)", fallback=False)
)  # fmt: skip


async def drive(db: Queries, account_id: UUID, loop: TurnLoop) -> LoopResult:
    """The turn's result from the occupant of ``harness``; a failed occupant's turn is an error."""
    try:
        result: LoopResult = await SLOTS.call(db, HARNESS, account_id, "run", loop)
    except SlotFailed as exc:
        done = loop.result
        return LoopResult(
            HARNESS_ERROR_REPLY, "harness-error", rounds=done.rounds, calls=done.calls, model=done.model,
            usage=done.usage, model_ms=done.model_ms, error=f"harness-{exc.reason}",
        )  # fmt: skip
    return result
