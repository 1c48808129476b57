"""The ``model_select`` slot: which tiers a turn runs on, asked once per turn.

An occupant answers :meth:`ModelSelect.chain_for` with a :class:`ModelPlan`. The turn runs on the
plan's first tier (the router picks the model inside its mix and fails over to its alternate); an
empty plan is a valid answer, "no model": the turn says so without a model call. A caller that
names its model explicitly (a replay, a test) bypasses the slot.

The built-in applies the person's usage tier (``core.usage``): ``normal`` keeps the requested tier,
``low_compute`` moves to ``usage.low_compute_tier`` (the cheapest), ``critical`` to
``usage.critical_tier`` with only tools that read, and ``dead`` answers with one fixed line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from core.slots import MODEL_SELECT, SLOTS, SlotSpec
from core.store.queries import Queries
from core.usage.config import DEAD_REPLY, UsageConfig, UsageTier

SELECT_TIMEOUT = 2.0


@dataclass(frozen=True)
class SelectRequest:
    account_id: UUID
    tier: str  # what the turn asked for (the harness's default, or a skill's)
    kind: str  # live, scheduled, room...
    usage: UsageTier  # the person's usage tier now
    config: UsageConfig


@dataclass(frozen=True)
class ModelPlan:
    """``tiers``: the turn runs on the first (empty: no model). ``read_only``: offer only tools that
    do not write. ``reply``: answer with this line and call no model."""

    tiers: tuple[str, ...]
    read_only: bool = False
    reply: str | None = None


class ModelSelect(Protocol):
    async def chain_for(self, request: SelectRequest) -> ModelPlan: ...


class BuiltinModelSelect:
    async def chain_for(self, request: SelectRequest) -> ModelPlan:
        if request.usage == "dead":
            return ModelPlan((), reply=DEAD_REPLY)
        if request.usage == "critical":
            return ModelPlan((request.config.critical_tier,), read_only=True)
        if request.usage == "low_compute":
            return ModelPlan((request.config.low_compute_tier,))
        return ModelPlan((request.tier,))


def _valid(_method: str, result: Any) -> bool:
    return (
        isinstance(result, ModelPlan)
        and isinstance(result.tiers, tuple)
        and all(isinstance(t, str) and t for t in result.tiers)
        and (result.reply is None or isinstance(result.reply, str))
    )


SPEC = SLOTS.register(
    SlotSpec(MODEL_SELECT, ("chain_for",), BuiltinModelSelect(), _valid, SELECT_TIMEOUT,
             "which model tier a turn runs on (usage tiers applied)")
)  # fmt: skip


async def select_models(db: Queries, request: SelectRequest) -> ModelPlan:
    """The plan for one turn, from the occupant of ``model_select`` for the request's account."""
    plan: ModelPlan = await SLOTS.call(db, MODEL_SELECT, request.account_id, "chain_for", request)
    return plan
