"""Usage caps and tiers, applied by the built-in ``model_select``: tokens and cost add up per
person per day, 95 % of the cap gets the critical model with reading tools only, 100 % the fixed
line without a model call, a new day starts again, and the owner is told once per change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from cli_support import run_cli

from core.identity import create_account
from core.models.types import Generation, Usage
from core.testing.scripted import reply
from core.usage.config import DEAD_REPLY, UsageConfig
from core.usage.ledger import add_usage, day_usage, month_usage, set_limits, tier_notice, usage_tier
from text_loop import HarnessDeps, run_turn

DAY = datetime(2025, 6, 2, 12, 30, tzinfo=UTC)
CONFIG = UsageConfig(
    daily_tokens=1000, low_compute_tier="cheap", critical_tier="tiny",
    prices={"priced-model": {"input": 2.0, "output": 8.0, "cached_input": 0.5}},
)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = DAY

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def ada(db):
    return await create_account(db, "Ada", timezone="UTC")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def deps(db, models, clock) -> HarnessDeps:
    return HarnessDeps(db=db, models=models, clock=clock, usage=CONFIG)


async def test_each_model_call_adds_its_tokens_and_priced_cost_to_the_day(db, ada, models, deps) -> None:
    models.script(Generation("Hi.", (), Usage(1000, 200, cached_input_tokens=400), "priced-model", "scripted", "stop"))
    await run_turn(deps, ada.id, "web", "hello")
    used = await day_usage(db, ada.id, DAY.date())
    assert (used.tokens, used.model_calls) == (1200, 1)
    # 600 input at $2, 400 cached at $0.50, 200 output at $8, per million.
    assert used.cost == Decimal("0.0030")
    await add_usage(db, ada.id, DAY + timedelta(days=3), tokens=5)
    assert (await month_usage(db, ada.id, DAY.date())).tokens == 1205


async def test_95_percent_gets_the_critical_model_with_reading_tools_only(db, ada, models, deps) -> None:
    await add_usage(db, ada.id, DAY, tokens=950)
    models.script(reply("Sure."), reply("Again."))
    first = await run_turn(deps, ada.id, "web", "hello")
    received = models.received[-1]
    assert received.tier == "tiny"
    offered = {t.name for t in received.prompt.tools}
    writers = {t.name for t in deps.registry.all() if t.writes}
    assert offered and not offered & writers
    assert first.reply == f"Sure.\n\n({tier_notice('critical')})"  # told once
    second = await run_turn(deps, ada.id, "web", "hello again")
    assert second.reply == "Again."


async def test_80_percent_moves_to_the_cheapest_tier(db, ada, models, deps) -> None:
    await add_usage(db, ada.id, DAY, tokens=850)
    models.script(reply("Sure."))
    await run_turn(deps, ada.id, "web", "hello")
    assert models.received[-1].tier == "cheap"


async def test_at_the_cap_the_fixed_line_and_no_model_call_until_a_new_day(db, ada, models, deps, clock) -> None:
    await add_usage(db, ada.id, DAY, tokens=1000)
    outcome = await run_turn(deps, ada.id, "web", "hello")
    assert (outcome.status, outcome.reply) == ("over-cap", DEAD_REPLY)
    assert models.received == []
    assert await usage_tier(db, ada.id, DAY, CONFIG) == "dead"
    clock.now = DAY + timedelta(days=1)
    models.script(reply("Good morning."))
    outcome = await run_turn(deps, ada.id, "web", "hello")
    assert (outcome.status, outcome.reply) == ("replied", "Good morning.")
    assert models.received[-1].tier == "small"


async def test_an_accounts_own_cap_wins_over_the_settings(db, ada, models, deps) -> None:
    await set_limits(db, ada.id, tokens=100, cost=None, minutes=None)
    await add_usage(db, ada.id, DAY, tokens=100)
    assert (await run_turn(deps, ada.id, "web", "hello")).status == "over-cap"


def test_account_limits_sets_and_shows_caps(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    code, out, _ = run_cli(monkeypatch, capsys, "account", "limits", "Ada", "--tokens", "5000", "--minutes", "30")
    assert code == 0
    assert out.splitlines()[0] == "Ada: daily caps 5000 tokens, no cap cost, 30.0 call minutes"
    assert "tier now: normal" in out
    code, out, _ = run_cli(monkeypatch, capsys, "account", "limits", "Ada", "--tokens", "default")
    assert out.splitlines()[0] == "Ada: daily caps no cap tokens, no cap cost, 30.0 call minutes"
    code, _, err = run_cli(monkeypatch, capsys, "account", "limits", "Ada", "--cost", "lots")
    assert code == 1 and "not a number: 'lots'" in err


async def test_call_minutes_count_once_when_a_call_ends(db, ada) -> None:
    started = DAY
    await db.execute(
        "INSERT INTO calls (call_sid, account_id, route, status, started_at)"
        " VALUES ('CA1', $1, 'owner', 'in-progress', $2)",
        ada.id,
        started,
    )
    await db.execute("UPDATE calls SET ended_at = $1 WHERE call_sid = 'CA1'", started + timedelta(minutes=3))
    await db.execute("UPDATE calls SET ended_at = $1 WHERE call_sid = 'CA1'", started + timedelta(minutes=9))
    assert (await day_usage(db, ada.id, DAY.date())).minutes == 3.0
    # At the minute cap, the person is at the fixed line too.
    await set_limits(db, ada.id, tokens=None, cost=None, minutes=3)
    assert await usage_tier(db, ada.id, DAY, CONFIG) == "dead"


async def test_the_repair_pass_counts_toward_the_day(db, ada, models, deps) -> None:
    models.script(
        Generation("Hi there.", (), Usage(100, 20), "priced-model", "scripted", "stop"),
        Generation("Hi there.", (), Usage(40, 10), "priced-model", "scripted", "stop"),  # the repair pass
    )
    outcome = await run_turn(deps, ada.id, "sms", "hello")
    assert outcome.reply == "Hi there." and len(models.received) == 2
    used = await day_usage(db, ada.id, DAY.date())
    assert (used.tokens, used.model_calls) == (170, 2)


def test_reported_model_calls_are_priced_and_garbage_counts_nothing() -> None:
    from core.usage.ledger import calls_usage

    tokens, cost, n = calls_usage(
        [{"model": "priced-model", "input": 1000, "output": 100, "cached": 0},
         {"model": "priced-model", "input": "lots"}, {"input": -5, "output": 1, "model": "x"}, {}],
        CONFIG,
    )  # fmt: skip
    assert (tokens, n) == (1100, 1) and cost == Decimal("0.0028")
