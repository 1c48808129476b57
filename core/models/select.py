"""The ``model_select`` slot: which tiers a turn runs on, asked once per turn.

An occupant answers :meth:`ModelSelect.chain_for` with a :class:`ModelPlan`. The turn runs on the
plan's first tier (the router picks the model inside its mix and fails over to its alternate);
when that tier cannot answer (not configured, or its model call fails after the router's own
failover) the same call goes to the plan's next tier, and so on down the plan. An empty plan is a
valid answer, "no model": the turn says so without a model call. A caller that names its model
explicitly (a replay, a test) bypasses the slot.

The built-in applies the person's usage tier (``core.usage``) to the configured tiers
(:attr:`SelectRequest.tiers`), priced from the settings' price table:

- ``normal``: the requested tier;
- ``low_compute``: the configured tiers from the cheapest up, none dearer than the requested one
  (``usage.low_compute_tier`` first when set);
- ``critical``: the tiers from the one with the smallest model (the cheapest single model; the
  price table is the only measure of size Pepper has), with only tools that read
  (``usage.critical_tier`` first when set);
- ``dead``: one fixed line, no model.

A tier with a model missing from the price table counts as dearer than any priced one; among
unpriced tiers the usual names order them (``small`` < ``medium`` < ``large``), then the
configuration's order.
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
class TierInfo:
    """A configured tier: its name and the models of its mix (the alternate left out)."""

    name: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class SelectRequest:
    account_id: UUID
    tier: str  # what the turn asked for (the harness's default, or a skill's)
    kind: str  # live, scheduled, room...
    usage: UsageTier  # the person's usage tier now
    config: UsageConfig
    tiers: tuple[TierInfo, ...] = ()  # the configured tiers, in the configuration's order


@dataclass(frozen=True)
class ModelPlan:
    """``tiers``: the turn runs on the first (empty: no model). ``read_only``: offer only tools that
    do not write. ``reply``: answer with this line and call no model."""

    tiers: tuple[str, ...]
    read_only: bool = False
    reply: str | None = None


class ModelSelect(Protocol):
    async def chain_for(self, request: SelectRequest) -> ModelPlan: ...


_SIZE_NAMES = {"small": 0, "medium": 1, "large": 2}
_UNPRICED = float("inf")


def _model_price(config: UsageConfig, model: str) -> float:
    price = config.prices.get(model)
    return _UNPRICED if price is None else price.input + price.output


def _rank(config: UsageConfig, tiers: tuple[TierInfo, ...], of: str) -> list[TierInfo]:
    """The tiers ordered by ``of``: ``cost`` (the dearest model of the mix, what a turn may pay)
    or ``smallest`` (the cheapest model of the mix)."""
    pick = max if of == "cost" else min

    def key(item: tuple[int, TierInfo]) -> tuple[float, int, int]:
        index, tier = item
        value = pick((_model_price(config, m) for m in tier.models), default=_UNPRICED)
        return value, _SIZE_NAMES.get(tier.name, 1), index

    return [t for _, t in sorted(enumerate(tiers), key=key)]


def _chain(first: str | None, ranked: list[TierInfo], fallback: str) -> tuple[str, ...]:
    names = ([first] if first else []) + [t.name for t in ranked]
    return tuple(dict.fromkeys(names)) or (fallback,)


class BuiltinModelSelect:
    async def chain_for(self, request: SelectRequest) -> ModelPlan:
        config, tiers = request.config, request.tiers
        if request.usage == "dead":
            return ModelPlan((), reply=DEAD_REPLY)
        if request.usage == "critical":
            return ModelPlan(_chain(config.critical_tier, _rank(config, tiers, "smallest"), request.tier),
                             read_only=True)  # fmt: skip
        if request.usage == "low_compute":
            ranked = _rank(config, tiers, "cost")
            names = [t.name for t in ranked]
            if request.tier in names:  # nothing dearer than what the turn asked for
                ranked = ranked[: names.index(request.tier) + 1]
            return ModelPlan(_chain(config.low_compute_tier, ranked, request.tier))
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
