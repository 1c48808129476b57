"""Slots with a real installed plugin (an entry point in ``pepper.plugins``): each occupant answers;
one that raises, times out or returns malformed data is passed over for the built-in on that call,
logged and counted; the harness's failure ends the turn with no re-run; the sandbox's child sees
none of Pepper's secrets; and two accounts in one process use different memory occupants."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from core.identity import create_account
from core.memory.search import MEMORY_SEARCH
from core.models.select import ModelPlan, SelectRequest, select_models
from core.scheduling.heartbeat import Pulse, pulse_allowed
from core.settings import Settings
from core.slots import SLOTS
from core.slots.sandbox import run_sandboxed
from core.slots.settings import create_household, fallback_counts, join_household, set_slot
from core.testing.scripted import calls, reply
from core.usage.config import UsageConfig
from core.web.search import BUILTIN_WEB_SEARCH, SearchHit, SlottedSearch
from text_loop import HarnessDeps, run_turn
from text_loop.harness import HARNESS_ERROR_REPLY

NOW = datetime(2025, 6, 2, 12, 30, tzinfo=UTC)


@pytest.fixture
async def ada(db):
    return await create_account(db, "Ada", timezone="UTC")


@pytest.fixture
async def bob(db):
    return await create_account(db, "Bob", timezone="UTC")


def _fallbacks_in_metrics(reason: str) -> float:
    """``pepper_slot_fallbacks`` for the memory slot in what ``/metrics`` serves (``core.metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    from core.metrics import exposition

    text = exposition()[0].decode()
    assert "loopback_memory" not in text
    wanted = {"slot": "memory", "reason": reason}
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "pepper_slot_fallbacks_total" and s.labels == wanted)  # fmt: skip


def turn_deps(db, models) -> HarnessDeps:
    return HarnessDeps(db=db, models=models, clock=lambda: NOW)


async def test_a_memory_occupant_answers_for_its_account_only(db, ada, bob, plugin) -> None:
    await set_slot(db, "memory", "loopback_memory", scope="account", scope_id=ada.id)
    hits = await MEMORY_SEARCH.search(db, ada.id, "passport", limit=3)
    assert [h.snippet for h in hits] == ["loopback_memory found passport"]
    assert await MEMORY_SEARCH.search(db, bob.id, "passport", limit=3) == []  # the built-in: nothing indexed
    assert plugin.CALLS["loopback_memory"] == 1


@pytest.mark.parametrize("mode, reason", [("raise", "raised"), ("slow", "timeout"), ("malformed", "malformed")])
async def test_a_failing_occupant_falls_back_for_that_call_logged_and_counted(
    db, ada, plugin, caplog, mode, reason
) -> None:
    await set_slot(db, "memory", "loopback_memory")
    plugin.MODES["loopback_memory"] = mode
    SLOTS.specs["memory"].timeout = 0.05
    counted = _fallbacks_in_metrics(reason)
    with caplog.at_level(logging.WARNING, logger="core.slots"):
        assert await MEMORY_SEARCH.search(db, ada.id, "passport", limit=3) == []
        assert await MEMORY_SEARCH.search(db, ada.id, "passport", limit=3) == []
    assert plugin.CALLS["loopback_memory"] == 2
    failed = [r for r in caplog.records if "slot occupant failed" in r.getMessage()]
    assert len(failed) == 2
    assert "slot=memory occupant=loopback_memory reason=" + reason in failed[0].getMessage()
    assert await fallback_counts(db) == {("memory", "loopback_memory"): {reason: 2}}
    assert _fallbacks_in_metrics(reason) - counted == 2  # and in /metrics, without the occupant's name
    plugin.MODES["loopback_memory"] = "answer"  # the next call is the occupant's again
    assert len(await MEMORY_SEARCH.search(db, ada.id, "passport", limit=3)) == 1


async def test_two_accounts_in_one_process_use_their_own_memory_occupants(db, ada, bob, models, plugin) -> None:
    """Ada's own setting, Bob's household's, and Carol on the installation's built-in."""
    carol = await create_account(db, "Carol", timezone="UTC")
    home = await create_household(db, "Bob's home")
    await join_household(db, bob.id, home.id)
    await set_slot(db, "memory", "loopback_memory", scope="account", scope_id=ada.id)
    await set_slot(db, "memory", "other_memory", scope="household", scope_id=home.id)
    deps = turn_deps(db, models)
    results = {}
    for person in (ada, bob, carol):
        models.script(calls(("search_memory", {"query": "wifi"})), reply("Done."))
        await run_turn(deps, person.id, "web", "wifi?")
        results[person.name] = models.prompts[-1].messages[-1].tool_result.content
    assert "loopback_memory found wifi" in results["Ada"]
    assert "other_memory found wifi" in results["Bob"]
    assert results["Carol"].startswith("Found nothing")
    # An account's own setting wins over its household's.
    await join_household(db, ada.id, home.id)
    models.script(calls(("search_memory", {"query": "tea"})), reply("Done."))
    await run_turn(deps, ada.id, "web", "tea?")
    assert "loopback_memory found tea" in models.prompts[-1].messages[-1].tool_result.content


async def test_a_harness_occupant_drives_the_turn(db, ada, models, plugin) -> None:
    await set_slot(db, "harness", "loopback_harness")
    outcome = await run_turn(turn_deps(db, models), ada.id, "web", "hello")
    assert (outcome.status, outcome.reply) == ("replied", "the loopback harness answered")
    assert models.received == []  # it never called the model
    assert plugin.SEEN["loopback_harness"].round_cap > 0  # it was handed the turn's own loop


@pytest.mark.parametrize("mode", ["raise", "slow", "malformed"])
async def test_a_failing_harness_ends_the_turn_with_an_error_and_no_rerun(db, ada, models, plugin, mode) -> None:
    await set_slot(db, "harness", "loopback_harness")
    plugin.MODES["loopback_harness"] = mode
    SLOTS.specs["harness"].timeout = 0.05
    models.script(reply("the built-in loop would say this"))
    outcome = await run_turn(turn_deps(db, models), ada.id, "web", "hello")
    assert (outcome.status, outcome.reply) == ("harness-error", HARNESS_ERROR_REPLY)
    assert models.received == []  # the built-in loop did not run the turn again
    assert plugin.CALLS["loopback_harness"] == 1
    row = await db.fetchrow("SELECT status, error FROM turns WHERE id = $1", outcome.turn_id)
    assert row["error"] == f"harness-{ {'raise': 'raised', 'slow': 'timeout', 'malformed': 'malformed'}[mode] }"
    assert sum((await fallback_counts(db))[("harness", "loopback_harness")].values()) == 1


async def test_model_select_is_asked_once_per_turn_and_an_explicit_tier_bypasses_it(db, ada, models, plugin) -> None:
    await set_slot(db, "model_select", "loopback_select")
    deps = turn_deps(db, models)
    models.script(calls(("get_time", {})), reply("It is noon."))
    await run_turn(deps, ada.id, "web", "time?")
    assert [r.tier for r in models.received] == ["large", "large"]
    assert plugin.CALLS["loopback_select"] == 1  # once per turn, not per round
    models.script(reply("Fine."))
    await run_turn(deps, ada.id, "web", "hi", tier="medium")
    assert models.received[-1].tier == "medium"
    assert plugin.CALLS["loopback_select"] == 1


async def test_an_empty_model_plan_is_no_model_not_a_fallback(db, ada, models, plugin, monkeypatch) -> None:
    await set_slot(db, "model_select", "loopback_select")
    monkeypatch.setattr(plugin.LoopbackSelect, "TIERS", ())
    outcome = await run_turn(turn_deps(db, models), ada.id, "web", "hi")
    assert outcome.status == "no-model"
    assert models.received == []
    assert await fallback_counts(db) == {}


async def test_model_select_that_fails_falls_back_to_the_builtin_plan(db, ada, plugin) -> None:
    await set_slot(db, "model_select", "loopback_select")
    plugin.MODES["loopback_select"] = "malformed"
    plan = await select_models(db, SelectRequest(ada.id, "small", "live", "normal", UsageConfig()))
    assert plan == ModelPlan(("small",))


async def test_a_compaction_occupant_writes_the_memory_block(db, ada, models, plugin) -> None:
    await set_slot(db, "compaction", "loopback_compaction")
    models.script(reply("Hi."))
    await run_turn(turn_deps(db, models), ada.id, "web", "hello")
    assert models.prompts[-1].system_dynamic == "Memory (loopback): 0 message(s)."
    plugin.MODES["loopback_compaction"] = "raise"
    models.script(reply("Hi."))
    await run_turn(turn_deps(db, models), ada.id, "web", "hello")
    assert models.prompts[-1].system_dynamic.startswith("Memory: ")  # the built-in's block


async def test_a_heartbeat_occupant_vetoes_a_pulse_and_a_broken_one_allows_it(db, ada, plugin) -> None:
    await set_slot(db, "heartbeat_interval", "loopback_heartbeat")
    assert await pulse_allowed(db, Pulse(ada.id, 1, "briefing", "normal"))
    assert not await pulse_allowed(db, Pulse(ada.id, 1, "briefing", "critical"))
    plugin.MODES["loopback_heartbeat"] = "malformed"
    assert await pulse_allowed(db, Pulse(ada.id, 1, "briefing", "critical"))  # the built-in always allows


async def test_a_web_search_occupant_answers_and_a_broken_one_falls_back(plugin) -> None:
    class Service:  # the configured service, as the research helper holds it
        name = "service"

        async def search(self, query: str, count: int = 5) -> list[SearchHit]:
            return [SearchHit("Service", "https://service.test/", query)]

    BUILTIN_WEB_SEARCH.provider = Service()
    try:
        search = SlottedSearch("loopback_web", [])
        assert [h.url for h in await search.search("tides")] == ["https://loopback.test/"]
        plugin.MODES["loopback_web"] = "raise"
        assert [h.url for h in await search.search("tides")] == ["https://service.test/"]
        assert search.fallbacks == ["raised"]
        stale = SlottedSearch("not_installed", [])
        assert [h.url for h in await stale.search("tides")] == ["https://service.test/"]
    finally:
        BUILTIN_WEB_SEARCH.provider = None


SECRETS = {
    "OPENAI_API_KEY": "sk-openai-secret-1",
    "TWILIO_AUTH_TOKEN": "twilio-secret-2",
    "DATABASE_URL": "postgresql://pepper:pg-secret-3@db/pepper",
}


def secret_settings() -> Settings:
    return Settings(
        openai_api_key=SecretStr(SECRETS["OPENAI_API_KEY"]),
        twilio_auth_token=SecretStr(SECRETS["TWILIO_AUTH_TOKEN"]),
        database_url=SecretStr(SECRETS["DATABASE_URL"]),
    )


def parent_environment() -> dict[str, str]:
    return {
        **SECRETS,
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "MY_COPY": f"copied {SECRETS['OPENAI_API_KEY']} here",  # a secret under an innocent name
        "GITHUB_TOKEN": "ghp-not-pepper-but-a-credential",
    }


@pytest.mark.parametrize("occupant", [None, "loopback_sandbox"])
async def test_the_sandboxed_child_sees_none_of_peppers_secrets(db, plugin, occupant) -> None:
    if occupant:
        await set_slot(db, "sandbox", occupant)
    program = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    result = await run_sandboxed(db, None, program[0], program[1:], env=parent_environment(),
                                 secrets=secret_settings().secret_values(), time_limit=30)  # fmt: skip
    if occupant:
        seen = plugin.SEEN[occupant]["env"]
        assert result.output == "loopback ran"
    else:
        seen = json.loads(result.output)
        assert result.exit_status == 0
    text = json.dumps(seen)
    for secret in [*SECRETS.values(), "ghp-not-pepper"]:
        assert secret not in text
    assert seen.get("LANG") == "C.UTF-8"


async def test_the_builtin_sandbox_stops_a_program_at_its_time_limit(db, plugin) -> None:
    result = await run_sandboxed(db, None, sys.executable, ["-c", "import time; time.sleep(60)"],
                                 env={"PATH": "/usr/bin:/bin"}, secrets=(), time_limit=0.3)  # fmt: skip
    assert result.timed_out and result.exit_status == -1


async def test_deleting_an_account_or_household_forgets_its_slot_settings(db, ada, bob, plugin) -> None:
    from core.identity import delete_account
    from core.slots.settings import delete_household, slot_settings

    home = await create_household(db, "Home")
    await join_household(db, bob.id, home.id)
    await set_slot(db, "memory", "loopback_memory", scope="account", scope_id=ada.id)
    await set_slot(db, "memory", "other_memory", scope="household", scope_id=home.id)
    await set_slot(db, "harness", "loopback_harness")
    await delete_account(db, ada.id)
    await delete_household(db, home.id)
    assert [(s.scope, s.slot) for s in await slot_settings(db)] == [("installation", "harness")]
    assert await db.fetchval("SELECT household_id FROM accounts WHERE id = $1", bob.id) is None
