"""The built-in ``model_select`` walks the configured tiers: ``low_compute`` from the cheapest tier
up (none dearer than the one asked for), ``critical`` from the tier with the smallest model with
reading tools only; a turn whose tier cannot answer goes on down the plan."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from core.identity import create_account
from core.models.errors import ModelNotConfigured, ModelTransientError
from core.models.router import ModelChoice, Tier
from core.models.select import BuiltinModelSelect, SelectRequest, TierInfo
from core.testing.scripted import reply
from core.usage.config import UsageConfig
from core.usage.ledger import add_usage
from text_loop import HarnessDeps, run_turn

PRICES = {
    "big-model": {"input": 5.0, "output": 20.0},
    "mid-model": {"input": 1.0, "output": 4.0},
    "tiny-model": {"input": 0.05, "output": 0.2},
    "cheap-model": {"input": 0.1, "output": 0.4},
}
TIERS = (
    TierInfo("large", ("big-model",)),
    TierInfo("medium", ("mid-model", "big-model")),  # a mix: it may cost what its dearest model costs
    TierInfo("small", ("cheap-model", "mid-model")),
    TierInfo("edge", ("tiny-model", "big-model")),  # the smallest model, in an expensive mix
    TierInfo("mystery", ("unpriced-model",)),
)


def _request(usage, tier="medium", config=None) -> SelectRequest:
    config = config or UsageConfig(prices=PRICES)
    return SelectRequest(account_id=None, tier=tier, kind="live", usage=usage, config=config, tiers=TIERS)  # type: ignore[arg-type]


async def test_low_compute_walks_from_the_cheapest_tier_up_to_the_one_asked_for() -> None:
    select = BuiltinModelSelect()
    plan = await select.chain_for(_request("low_compute"))
    assert plan.tiers == ("small", "medium") and not plan.read_only
    plan = await select.chain_for(_request("low_compute", tier="large"))
    assert plan.tiers == ("small", "medium", "edge", "large")  # edge and large both top out at big-model
    set_first = UsageConfig(prices=PRICES, low_compute_tier="edge")
    assert (await select.chain_for(_request("low_compute", config=set_first))).tiers == ("edge", "small", "medium")
    # An unpriced tier is dearer than any priced one: asked for, it is the last resort.
    plan = await select.chain_for(_request("low_compute", tier="mystery"))
    assert plan.tiers[0] == "small" and plan.tiers[-1] == "mystery"


async def test_critical_starts_at_the_smallest_model_with_reading_tools_only() -> None:
    select = BuiltinModelSelect()
    plan = await select.chain_for(_request("critical"))
    assert plan.read_only
    assert plan.tiers == ("edge", "small", "medium", "large", "mystery")
    assert (await select.chain_for(_request("normal"))).tiers == ("medium",)
    # Nothing configured (no tiers known): the requested tier.
    bare = SelectRequest(None, "small", "live", "critical", UsageConfig())  # type: ignore[arg-type]
    assert (await select.chain_for(bare)).tiers == ("small",)
    # Without prices, the usual names order them.
    unpriced = await select.chain_for(_request("critical", config=UsageConfig()))
    assert unpriced.tiers == ("small", "medium", "edge", "mystery", "large")  # then the configured order


class TieredModels:
    """The scripted model behind named tiers (the router's ``tiers``): a tier listed in ``down``
    fails as an outage would; any other answers from the script."""

    def __init__(self, models, down: dict[str, Exception]) -> None:
        self.scripted = models
        self.down = down
        self.tiers = {t.name: Tier(t.name, tuple(ModelChoice(m) for m in t.models)) for t in TIERS}
        self.asked: list[str] = []

    async def generate(self, prompt, *, conversation_key, tier="small", background=False):
        self.asked.append(tier)
        if tier in self.down:
            raise self.down[tier]
        return await self.scripted.generate(prompt, conversation_key=conversation_key, tier=tier, background=background)

    def stream(self, prompt, **kwargs):
        return self.scripted.stream(prompt, **kwargs)


@pytest.mark.parametrize("error", [ModelTransientError("busy"), ModelNotConfigured("no key")])
async def test_a_turn_walks_down_the_plan_when_a_tier_cannot_answer(db, models, error) -> None:
    ada = await create_account(db, "Ada", timezone="UTC")
    now = datetime(2025, 6, 2, 12, tzinfo=UTC)
    tiered = TieredModels(models, {"small": error})
    deps = HarnessDeps(db=db, models=tiered, clock=lambda: now,
                       usage=UsageConfig(prices=PRICES, daily_tokens=1000))  # fmt: skip
    deps.config = replace(deps.config, tier="medium")
    await add_usage(db, ada.id, now, tokens=850)  # low_compute
    models.script(reply("From the next tier."))
    outcome = await run_turn(deps, ada.id, "web", "hello")
    assert outcome.reply.startswith("From the next tier.")
    assert tiered.asked == ["small", "medium"]
    turn = await db.fetchrow("SELECT tier, rounds FROM turns WHERE id = $1", outcome.turn_id)
    assert turn["tier"] == "medium"
    assert '"tiers_failed"' in turn["rounds"] and '"small"' in turn["rounds"]
