"""Router rules through real adapters and loopback peers: tiers, mixes, failover, background, records."""

from __future__ import annotations

import ast
import contextlib
import gc
import json
import sys
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any

import pydantic
import pytest

from core.conversation import conversation_for, start_turn
from core.identity import create_account
from core.models import (
    ChatMessage,
    Generation,
    ModelAuthError,
    ModelNotConfigured,
    ModelRequestError,
    ModelTransientError,
    Prompt,
    StreamInterrupted,
    TextDelta,
)
from core.models.adapters.anthropic import AnthropicAdapter
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.records import record_model_use
from core.models.router import (
    ModelChoice,
    ModelRouter,
    Tier,
    pick,
    provider_for,
    tiers_from_settings,
)
from core.settings import Settings
from core.store import Database
from core.testing.peers import AnthropicPeer, GooglePeer, OpenAIPeer, fault, reply_text, reply_tools

REPO = Path(__file__).resolve().parents[1]
PROMPT = Prompt("You are Pepper.", (ChatMessage("user", "hello"),))
DAY = date(2026, 3, 1)
PRIMARY, ALTERNATE = ModelChoice("gpt-x-mini", effort="low"), ModelChoice("claude-x-haiku")


@pytest.fixture
async def peers() -> AsyncIterator[tuple[OpenAIPeer, AnthropicPeer, ModelRouter]]:
    async with OpenAIPeer() as openai_peer, AnthropicPeer() as anthropic_peer:
        adapters = {
            "openai": OpenAIResponsesAdapter(api_key="k", base_url=openai_peer.base_url, timeout=2),
            "anthropic": AnthropicAdapter(api_key="k", base_url=anthropic_peer.base_url, timeout=2),
        }
        tiers = {"small": Tier("small", (PRIMARY,), ALTERNATE), "large": Tier("large", (ModelChoice("claude-x-opus"),))}
        router = ModelRouter(adapters, tiers, today=lambda: DAY)
        yield openai_peer, anthropic_peer, router
        await router.aclose()


async def collect(router: ModelRouter, **kw: object) -> tuple[list[str], Generation]:
    deltas: list[str] = []
    final: Generation | None = None
    async for event in router.stream(PROMPT, conversation_key="conv-1", **kw):  # type: ignore[arg-type]
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            final = event
    assert final is not None
    return deltas, final


# Provider from the model name.
@pytest.mark.parametrize(
    ("name", "provider", "sent"),
    [
        ("gpt-5-mini", "openai", "gpt-5-mini"),
        ("o4-mini", "openai", "o4-mini"),
        ("chatgpt-4o-latest", "openai", "chatgpt-4o-latest"),
        ("claude-haiku-4-5", "anthropic", "claude-haiku-4-5"),
        ("gemini-2.5-flash", "google", "gemini-2.5-flash"),
        ("compat:gpt-oss:20b", "openai-compatible", "gpt-oss:20b"),
        ("llama3.2", "openai-compatible", "llama3.2"),
        ("openai:my-finetune", "openai", "my-finetune"),
        ("omni-local", "openai-compatible", "omni-local"),
    ],
)
def test_provider_follows_the_model_name(name: str, provider: str, sent: str) -> None:
    assert provider_for(name) == (provider, sent)


# Failover rules.
async def test_transient_error_before_the_reply_fails_over_once(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(503))
    anthropic_peer.script(reply_text("from the alternate"))
    gen = await router.generate(PROMPT, conversation_key="conv-1")
    assert (gen.text, gen.model, gen.provider, gen.failed_over_from) == (
        "from the alternate",
        "claude-x-haiku",
        "anthropic",
        "gpt-x-mini",
    )
    assert len(openai_peer.requests) == 1 and len(anthropic_peer.requests) == 1


async def test_no_failover_without_error(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(reply_text("hi"))
    gen = await router.generate(PROMPT, conversation_key="conv-1")
    assert (gen.model, gen.failed_over_from, gen.extras["effort"]) == ("gpt-x-mini", None, "low")
    assert openai_peer.requests[0].body["model"] == "gpt-x-mini"
    assert openai_peer.requests[0].body["reasoning"] == {"effort": "low"}
    assert anthropic_peer.requests == []


@pytest.mark.parametrize(("status", "error"), [(400, ModelRequestError), (401, ModelAuthError)])
async def test_request_and_auth_errors_do_not_fail_over(peers, status: int, error: type[Exception]) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(status), fault(status))
    with pytest.raises(error):
        await router.generate(PROMPT, conversation_key="conv-1")
    with pytest.raises(error):
        await collect(router)
    assert anthropic_peer.requests == []


async def test_a_second_failure_surfaces(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(429), fault(500))
    anthropic_peer.script(fault(529), fault(503))
    with pytest.raises(ModelTransientError) as plain:
        await router.generate(PROMPT, conversation_key="conv-1")
    assert plain.value.provider == "anthropic"
    with pytest.raises(ModelTransientError):
        await collect(router)
    # One hop: each side was asked exactly once per call, nothing bounced back.
    assert len(openai_peer.requests) == 2 and len(anthropic_peer.requests) == 2


async def test_streaming_fails_over_before_the_first_token(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(503))
    anthropic_peer.script(reply_text("alternate speaking"))
    deltas, gen = await collect(router)
    assert "".join(deltas) == "alternate speaking"
    assert (gen.model, gen.failed_over_from) == ("claude-x-haiku", "gpt-x-mini")


async def test_stream_cut_before_the_first_token_fails_over(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(reply_text("never seen", cut_after=1))
    anthropic_peer.script(reply_text("alternate"))
    deltas, gen = await collect(router)
    assert deltas == ["alternate"] and gen.failed_over_from == "gpt-x-mini"


async def test_a_failure_after_the_first_streamed_token_does_not_fail_over(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(reply_text("one two three four five six", cut_after=4))
    anthropic_peer.script(reply_text("must not be used"))
    seen: list[str] = []
    with pytest.raises(StreamInterrupted):
        async for event in router.stream(PROMPT, conversation_key="conv-1"):
            assert isinstance(event, TextDelta)
            seen.append(event.text)
    assert seen == ["one ", "two "]
    assert anthropic_peer.requests == [] and anthropic_peer.pending == 1


async def test_tool_call_stream_failing_over_keeps_tool_calls(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(502))
    anthropic_peer.script(reply_tools(("get_weather", {"city": "Paris"})))
    deltas, gen = await collect(router)
    assert deltas == [] and gen.tool_calls[0].arguments == {"city": "Paris"} and gen.finish_reason == "tool_calls"


# Background work.
async def test_background_uses_flex_and_falls_back_to_standard_when_busy(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(fault(429, "Resource unavailable"), reply_text("summary"))
    gen = await router.generate(PROMPT, conversation_key="nightly", background=True)
    assert (gen.text, gen.model, gen.failed_over_from) == ("summary", "gpt-x-mini", None)
    assert gen.extras["background_fell_back"] is True
    flex, standard = openai_peer.requests
    assert flex.body["service_tier"] == "flex" and "service_tier" not in standard.body
    assert anthropic_peer.requests == []


async def test_background_streaming_falls_back_too(peers) -> None:
    openai_peer, _, router = peers
    openai_peer.script(fault(503), reply_text("ok then"))
    deltas, gen = await collect(router, background=True)
    assert deltas == ["ok ", "then"] and gen.extras["background_fell_back"] is True
    assert [r.body.get("service_tier") for r in openai_peer.requests] == ["flex", None]


async def test_background_when_flex_is_free_makes_one_call(peers) -> None:
    openai_peer, _, router = peers
    openai_peer.script(reply_text("done"))
    gen = await router.generate(PROMPT, conversation_key="nightly", background=True)
    assert gen.extras["service_tier"] == "flex" and "background_fell_back" not in gen.extras
    assert len(openai_peer.requests) == 1


async def test_background_on_a_provider_without_a_low_tier_runs_standard(peers) -> None:
    _, anthropic_peer, router = peers
    anthropic_peer.script(reply_text("done"))
    gen = await router.generate(PROMPT, conversation_key="nightly", tier="large", background=True)
    assert gen.model == "claude-x-opus"
    assert "service_tier" not in anthropic_peer.requests[0].body


# Tiers and mixes.
async def test_a_larger_tier_by_name(peers) -> None:
    openai_peer, anthropic_peer, router = peers
    anthropic_peer.script(reply_text("big thoughts"))
    gen = await router.generate(PROMPT, conversation_key="conv-1", tier="large")
    assert gen.model == "claude-x-opus" and openai_peer.requests == []


async def test_unknown_tier_is_not_configured(peers) -> None:
    _, _, router = peers
    with pytest.raises(ModelNotConfigured, match="no model tier named 'huge'"):
        await router.generate(PROMPT, conversation_key="conv-1", tier="huge")


KEYS = [f"conversation-{n}" for n in range(20000)]


def shares(mix: tuple[ModelChoice, ...], day: date = DAY) -> dict[str, str]:
    return {key: pick(mix, key, day).model for key in KEYS}


def test_mix_shares_follow_weights_and_stay_put_for_the_day() -> None:
    mix = (ModelChoice("a", weight=3), ModelChoice("b", weight=1))
    chosen = shares(mix)
    fraction_a = sum(1 for m in chosen.values() if m == "a") / len(KEYS)
    assert 0.73 < fraction_a < 0.77
    assert chosen == shares(mix)  # deterministic
    next_day = shares(mix, date(2026, 3, 2))
    moved = sum(1 for k in KEYS if chosen[k] != next_day[k]) / len(KEYS)
    assert 0.3 < moved < 0.45  # a new day reshuffles (2 * 0.75 * 0.25 expected)


def test_adding_a_model_moves_only_its_share_and_only_to_it() -> None:
    before = shares((ModelChoice("a"), ModelChoice("b")))
    after = shares((ModelChoice("a"), ModelChoice("b"), ModelChoice("c")))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "c" for k in moved)
    assert abs(len(moved) / len(KEYS) - 1 / 3) < 0.02


def test_changing_one_weight_moves_only_the_needed_fraction() -> None:
    before = shares((ModelChoice("a"), ModelChoice("b"), ModelChoice("c")))
    after = shares((ModelChoice("a"), ModelChoice("b", weight=2), ModelChoice("c")))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "b" for k in moved)  # only towards the model that gained weight
    assert abs(len(moved) / len(KEYS) - (1 / 2 - 1 / 3)) < 0.02
    lowered = shares((ModelChoice("a"), ModelChoice("b", weight=0.5), ModelChoice("c")))
    moved_down = [k for k in KEYS if before[k] != lowered[k]]
    assert all(before[k] == "b" for k in moved_down)  # only away from the model that lost weight
    assert abs(len(moved_down) / len(KEYS) - (1 / 3 - 0.5 / 2.5)) < 0.02


def test_the_same_model_at_another_effort_is_another_choice() -> None:
    mix = (ModelChoice("gpt-5-mini", effort="low"), ModelChoice("gpt-5-mini", effort="high"))
    efforts = {pick(mix, key, DAY).effort for key in KEYS[:200]}
    assert efforts == {"low", "high"}


# Settings.
def test_no_provider_means_not_configured_with_a_plain_message() -> None:
    router = ModelRouter.from_settings(Settings())
    assert router.adapters == {} and router.tiers == {}
    with pytest.raises(ModelNotConfigured) as caught:
        router.choose("small", "conv-1")
    assert "No AI model is set up" in str(caught.value) and "OPENAI_API_KEY" in str(caught.value)


async def test_not_configured_surfaces_from_generate_and_stream() -> None:
    router = ModelRouter.from_settings(Settings())
    with pytest.raises(ModelNotConfigured):
        await router.generate(PROMPT, conversation_key="conv-1")
    with pytest.raises(ModelNotConfigured):
        async for _ in router.stream(PROMPT, conversation_key="conv-1"):
            pass


def test_default_tiers_use_whichever_provider_has_a_key() -> None:
    only_anthropic = tiers_from_settings(Settings(anthropic_api_key="k"))
    assert only_anthropic["small"].mix[0].model.startswith("claude-") and only_anthropic["small"].alternate is None
    both = tiers_from_settings(Settings(openai_api_key="k", gemini_api_key="g"))
    assert both["small"].mix[0].provider == "openai" and both["small"].alternate.provider == "google"  # type: ignore[union-attr]
    assert set(both) == {"small", "medium", "large"}
    compat = tiers_from_settings(
        Settings(models={"compatible_base_url": "http://127.0.0.1:1/v1", "compatible_model": "llama3.2"})
    )
    assert compat["small"].mix[0].model == "compat:llama3.2"


def test_tiers_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {
        "tiers": {
            "small": {
                "mix": [{"model": "gpt-5-mini", "effort": "low", "weight": 3}, {"model": "claude-haiku-4-5"}],
                "alternate": "gemini-2.5-flash",
            },
            "judge": {"model": "gpt-5", "effort": "high"},
        }
    }
    monkeypatch.setenv("PEPPER_MODELS", json.dumps(config))
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    tiers = tiers_from_settings(Settings())
    assert [c.weight for c in tiers["small"].mix] == [3, 1]
    assert tiers["small"].alternate == ModelChoice("gemini-2.5-flash")
    assert tiers["judge"].mix == (ModelChoice("gpt-5", effort="high"),)
    assert tiers["large"].mix[0].provider == "openai"  # defaults fill the tiers left out


def test_tiers_from_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "pepper.toml"
    toml.write_text('[models.tiers.small]\nmodel = "claude-haiku-4-5"\nalternate = { model = "gpt-5-mini" }\n')
    monkeypatch.setenv("PEPPER_CONFIG", str(toml))
    tiers = tiers_from_settings(Settings())
    assert tiers["small"] == Tier("small", (ModelChoice("claude-haiku-4-5"),), ModelChoice("gpt-5-mini"))


def test_a_tier_with_both_model_and_mix_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="either one `model` or a `mix`"):
        Settings(models={"tiers": {"small": {"model": "a", "mix": [{"model": "b"}]}}})


async def test_from_settings_reaches_the_peers_with_the_sdk_base_urls() -> None:
    async with OpenAIPeer() as openai_peer, GooglePeer() as google_peer:
        settings = Settings(
            openai_api_key="sk-test",
            openai_base_url=openai_peer.base_url,
            gemini_api_key="g-test",
            gemini_base_url=google_peer.base_url,
        )
        router = ModelRouter.from_settings(settings)
        openai_peer.script(fault(500))
        google_peer.script(reply_text("hello from gemini"))
        gen = await router.generate(PROMPT, conversation_key="conv-1")
        await router.aclose()
    assert (gen.provider, gen.failed_over_from) == ("google", "gpt-5-mini")
    assert openai_peer.requests[0].headers["Authorization"] == "Bearer sk-test"
    assert google_peer.requests[0].headers["x-goog-api-key"] == "g-test"


async def test_model_that_needs_a_missing_key_says_which() -> None:
    router = ModelRouter.from_settings(
        Settings(openai_api_key="k", models={"tiers": {"small": {"model": "claude-haiku-4-5"}}})
    )
    with pytest.raises(ModelNotConfigured, match="ANTHROPIC_API_KEY"):
        await router.generate(PROMPT, conversation_key="conv-1")
    await router.aclose()


# Turn records.
async def test_usage_and_model_land_in_the_turn_record(peers, db: Database) -> None:
    openai_peer, anthropic_peer, router = peers
    openai_peer.script(reply_tools(("get_weather", {"city": "Paris"}), input_tokens=40, cached_tokens=30), fault(503))
    anthropic_peer.script(reply_text("Sunny.", input_tokens=60, output_tokens=3))
    account = await create_account(db, "Ada")
    conversation = await conversation_for(db, account.id)
    turn = await start_turn(db, conversation, channel="sms")
    first = await router.generate(PROMPT, conversation_key=str(conversation))
    second = await router.generate(PROMPT, conversation_key=str(conversation))
    await record_model_use(db, turn, [first, second], tier="small")
    row = await db.fetchrow("SELECT model, tier, usage FROM turns WHERE id = $1", turn)
    usage = json.loads(row["usage"]) if isinstance(row["usage"], str) else row["usage"]
    assert (row["model"], row["tier"]) == ("claude-x-haiku", "small")
    assert (usage["input_tokens"], usage["output_tokens"], usage["cached_input_tokens"]) == (100, 8, 30)
    assert [c["model"] for c in usage["calls"]] == ["gpt-x-mini", "claude-x-haiku"]
    assert usage["calls"][1]["failed_over_from"] == "gpt-x-mini"
    assert usage["calls"][0]["effort"] == "low"


# Architecture: vendor model SDKs only inside core/models/adapters (and voice/adapters for realtime).
VENDOR_SDKS = ("openai", "anthropic", "google.genai")


def test_only_adapters_import_vendor_model_sdks() -> None:
    root = Path(__file__).resolve().parent.parent
    allowed = root / "core" / "models" / "adapters"
    voice_adapters = root / "voice" / "adapters"  # realtime voice adapters (SDK_HOMES in test_architecture)
    offenders = []
    for package in ("core", "gateway", "text_loop", "voice", "answering_service", "bench"):
        for path in (root / package).rglob("*.py"):
            if allowed in path.parents or voice_adapters in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if any(n == sdk or n.startswith(sdk + ".") for n in names for sdk in VENDOR_SDKS):
                    offenders.append(str(path.relative_to(root)))
    # The benchmarks that time a raw SDK call as their baseline import it on purpose.
    assert set(offenders) <= {"bench/models.py", "bench/gemini_live.py"}, offenders


async def test_doctor_reports_each_tier_and_its_missing_key(tmp_path: Path) -> None:
    from gateway.doctor import MISSING, OK, diagnose

    settings = Settings(
        data_dir=tmp_path,
        openai_api_key="k",
        models={"tiers": {"judge": {"model": "claude-opus-4-1", "alternate": "gpt-5"}}},
    )
    report = await diagnose(settings, set())
    checks = {c.area: c for c in report.checks}
    assert checks["model tier: small"].status == OK and "gpt-5-mini" in checks["model tier: small"].detail
    judge = checks["model tier: judge"]
    assert judge.status == MISSING and "ANTHROPIC_API_KEY" in judge.detail and "fails over to gpt-5" in judge.detail


async def test_a_stream_stopped_early_closes_every_inner_stream_at_once(peers) -> None:
    """A consumer that stops after the first words (a barge-in) closes the provider's stream then,
    not when the garbage collector finds it: no generator of the chain is left for the loop's
    finalizer, which may run after the loop (and its HTTP client) have closed."""
    openai_peer, _, router = peers
    openai_peer.script(reply_text("one two three four five six seven eight"))
    left_for_the_finalizer: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(gen: Any) -> None:  # only our own generators: the SDK's inner ones end with its response
        if gen.ag_code.co_filename.startswith(str(REPO / "core")):
            left_for_the_finalizer.append(gen.__qualname__)

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        stream = router.stream(PROMPT, conversation_key="conv-1")
        async with contextlib.aclosing(stream):
            async for event in stream:
                assert isinstance(event, TextDelta)
                break
        del stream, event
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert left_for_the_finalizer == [], left_for_the_finalizer
