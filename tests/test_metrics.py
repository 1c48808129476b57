"""``GET /metrics`` (gateway/metrics_route.py, core/metrics.py): what happened is counted, and only
a scraper on this machine (or one with the token) may read it. ``pepper serve``'s processes
reporting together is checked in tests/test_turn_workers.py, whose server has turn workers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.twilio_peer import TwilioPeer
from core.usage.config import Price, UsageConfig
from gateway.server import running_app

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"


@dataclass
class Served:
    db: Database
    twilio: TwilioPeer
    model: OpenAIPeer
    local: str
    session: aiohttp.ClientSession

    async def samples(self, **headers: str) -> dict[tuple[str, frozenset], float]:
        async with self.session.get(self.local + "/metrics", headers=headers) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/plain"
            text = await response.text()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def _served(db: Database, db_url: str, **extra) -> AsyncIterator[Served]:
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await identity.assign_line(db, LINE, "personal", ada.id)
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        settings = Settings(database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                            twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-test",
                            openai_base_url=model.base_url, port=0, **extra)  # fmt: skip
        async with running_app(settings, db) as (_, port), aiohttp.ClientSession() as session:
            yield Served(db, twilio, model, f"http://127.0.0.1:{port}", session)


@pytest.fixture
async def served(db: Database, db_url: str) -> AsyncIterator[Served]:
    # A price for the default small model, so a turn has a cost.
    async for s in _served(db, db_url, usage=UsageConfig(prices={"gpt-5-mini": Price(input=1.0, output=2.0)})):
        yield s


async def test_a_turn_a_model_call_and_webhooks_are_counted(served: Served) -> None:
    before = await served.samples()
    served.model.script(reply_text("Hello Ada."))
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="hi")
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    # The same delivery again (Twilio retries): answered as before, counted as a duplicate, one turn only.
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    forged = TwilioPeer(auth_token="not-the-token").sign(PUBLIC + "/twilio/sms", form)
    status, _ = await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, signature=forged,
                                              session=served.session)  # fmt: skip
    assert status == 403
    async with served.session.post(served.local + "/twilio/voice", data={"garbage": "x"}) as response:
        assert response.status == 403  # unsigned
    # A call's webhook, and Twilio retrying it: one accepted, one duplicate.
    call = {"CallSid": "CA" + "5" * 32, "From": OWNER, "To": LINE, "AccountSid": served.twilio.account_sid,
            "CallStatus": "ringing", "Direction": "inbound"}  # fmt: skip
    for _ in range(2):
        assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/voice", call, session=served.session))[
            0
        ] == 200
    await served.twilio.wait_for_sent(1, within=30)
    after = await served.samples()
    for _ in range(100):  # the turn is counted when its record is written, just before the reply goes
        if _value(after, "pepper_turns_total", channel="sms", kind="live", status="replied") > _value(
            before, "pepper_turns_total", channel="sms", kind="live", status="replied"
        ):
            break
        await asyncio.sleep(0.05)
        after = await served.samples()

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("pepper_turns_total", channel="sms", kind="live", status="replied") == 1
    assert grew("pepper_turn_rounds_count", channel="sms") == 1
    assert grew("pepper_webhooks_total", provider="sms", outcome="accepted") == 1
    assert grew("pepper_webhooks_total", provider="sms", outcome="duplicate") == 1
    assert grew("pepper_webhooks_total", provider="sms", outcome="refused") == 1
    assert grew("pepper_webhooks_total", provider="voice", outcome="refused") == 1
    assert grew("pepper_webhooks_total", provider="voice", outcome="accepted") == 1
    assert grew("pepper_webhooks_total", provider="voice", outcome="duplicate") == 1
    assert grew("pepper_model_calls_total", provider="openai", outcome="ok") >= 1
    assert grew("pepper_model_tokens_total", provider="openai", direction="input") >= 10
    # The turn's own figures, by channel and kind; the model calls by the tier that made them.
    assert grew("pepper_turn_model_rounds_total", channel="sms", kind="live") == 1
    assert grew("pepper_turn_tokens_total", channel="sms", kind="live") >= 10
    assert grew("pepper_turn_cost_usd_total", channel="sms", kind="live") > 0
    assert grew("pepper_model_tier_calls_total", tier="small", provider="openai", outcome="ok") >= 1
    assert grew("pepper_turns_repaired_total", channel="sms", kind="live") == 0
    # Every metric is listed from the start, so a dashboard has no gaps.
    assert any(name == "pepper_calls_active" for name, _ in before)


async def test_a_recovered_and_repaired_turn_is_counted_so(served: Served) -> None:
    before = await served.samples()
    # An empty answer (the loop asks once more, as plain text), then a reply the repair pass mends.
    served.model.script(reply_text(""), reply_text("Lunch is at the the cafe at noon."),
                        reply_text("Lunch is at the cafe at noon."))  # fmt: skip
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="when is lunch")
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    [sent] = await served.twilio.wait_for_sent(1, within=30)
    assert sent.body == "Lunch is at the cafe at noon."
    recovered = {"channel": "sms", "kind": "live", "status": "recovered"}
    for _ in range(100):
        after = await served.samples()
        if _value(after, "pepper_turns_total", **recovered) > _value(before, "pepper_turns_total", **recovered):
            break
        await asyncio.sleep(0.05)
    assert _value(after, "pepper_turns_total", **recovered) - _value(before, "pepper_turns_total", **recovered) == 1
    repaired = ("pepper_turns_repaired_total", {"channel": "sms", "kind": "live"})
    assert _value(after, repaired[0], **repaired[1]) - _value(before, repaired[0], **repaired[1]) == 1
    # The recovery and the repair were model calls of the small tier too.
    tier = ("pepper_model_tier_calls_total", {"tier": "small", "provider": "openai", "outcome": "ok"})
    assert _value(after, tier[0], **tier[1]) - _value(before, tier[0], **tier[1]) == 3


async def test_model_calls_are_counted_by_tier_with_their_failovers(served: Served) -> None:
    from core.models import ChatMessage, Prompt
    from core.models.adapters.anthropic import AnthropicAdapter
    from core.models.adapters.openai_responses import OpenAIResponsesAdapter
    from core.models.errors import ModelRequestError
    from core.models.router import ModelChoice, ModelRouter, Tier
    from core.testing.peers import AnthropicPeer, fault

    prompt = Prompt("You are Pepper.", (ChatMessage("user", "hello"),))
    async with AnthropicPeer() as anthropic:
        adapters = {"openai": OpenAIResponsesAdapter(api_key="k", base_url=served.model.base_url, timeout=2),
                    "anthropic": AnthropicAdapter(api_key="k", base_url=anthropic.base_url, timeout=2)}  # fmt: skip
        tiers = {"brisk": Tier("brisk", (ModelChoice("gpt-x-mini"),), ModelChoice("claude-x-haiku")),
                 "lone": Tier("lone", (ModelChoice("gpt-x-mini"),))}  # fmt: skip
        router = ModelRouter(adapters, tiers)
        before = await served.samples()
        served.model.script(fault(503), fault(503), fault(400))
        anthropic.script(reply_text("from the alternate"), reply_text("streamed from the alternate"))
        assert (await router.generate(prompt, conversation_key="c", tier="brisk")).failed_over_from == "gpt-x-mini"
        events = [e async for e in router.stream(prompt, conversation_key="c", tier="brisk")]
        assert events[-1].failed_over_from == "gpt-x-mini"  # type: ignore[union-attr]
        with pytest.raises(ModelRequestError):
            await router.generate(prompt, conversation_key="c", tier="lone")
        await router.aclose()
    after = await served.samples()

    def grew(**labels: str) -> float:
        return _value(after, "pepper_model_tier_calls_total", **labels) - _value(
            before, "pepper_model_tier_calls_total", **labels
        )

    assert grew(tier="brisk", provider="anthropic", outcome="ok") == 2
    assert grew(tier="brisk", provider="openai", outcome="failed_over") == 2
    assert grew(tier="brisk", provider="openai", outcome="ok") == 0
    assert grew(tier="lone", provider="openai", outcome="model-bad-request") == 1


async def test_a_capped_turn_is_counted_with_its_rounds(served: Served) -> None:
    from core.testing.peers import reply_tools

    before = await served.samples()
    # Eight rounds of lookups (the live round cap), then the summary without tools; the repair pass
    # finds nothing to mend.
    served.model.script(*(reply_tools(("search_notes", {"query": f"plan {n}"})) for n in range(8)),
                        reply_text("I looked eight times and found nothing."),
                        reply_text("I looked eight times and found nothing."))  # fmt: skip
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="find my plans")
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    [sent] = await served.twilio.wait_for_sent(1, within=30)
    assert sent.body == "I looked eight times and found nothing."
    capped = {"channel": "sms", "kind": "live", "status": "capped"}
    for _ in range(100):
        after = await served.samples()
        if _value(after, "pepper_turns_total", **capped) > _value(before, "pepper_turns_total", **capped):
            break
        await asyncio.sleep(0.05)
    assert _value(after, "pepper_turns_total", **capped) - _value(before, "pepper_turns_total", **capped) == 1
    rounds = ("pepper_turn_model_rounds_total", {"channel": "sms", "kind": "live"})
    assert _value(after, rounds[0], **rounds[1]) - _value(before, rounds[0], **rounds[1]) == 8


@pytest.fixture
async def quiet(db: Database, db_url: str) -> AsyncIterator[Served]:
    """``served`` without the server's own scheduler and memory worker: the test runs them."""
    async for s in _served(db, db_url, scheduler_enabled=False, memory_jobs_interval=0):
        yield s


async def test_scheduled_runs_are_counted_due_claimed_and_by_outcome(quiet: Served) -> None:
    from core.models.errors import ModelTransientError
    from core.scheduling.schedule import parse_schedule
    from core.scheduling.tasks import create_task
    from core.testing.scripted import ScriptedModels, calls, reply
    from gateway.scheduled import GatewayDeliverer
    from text_loop import HarnessDeps
    from text_loop.scheduler import SILENT_MARK, Scheduler, SchedulerConfig

    db = quiet.db
    account_id = await db.fetchval("UPDATE accounts SET timezone = 'Europe/Paris' RETURNING id")
    now = [datetime(2025, 6, 2, 5, 0, tzinfo=UTC)]
    models = ScriptedModels()
    scheduler = Scheduler(HarnessDeps(db=db, models=models, clock=lambda: now[0]), GatewayDeliverer(Settings(), db),
                          SchedulerConfig(), owner="metrics", clock=lambda: now[0])  # fmt: skip

    async def task(schedule: str, prompt: str) -> None:
        async with db.transaction() as conn:
            await create_task(conn, account_id, title="Brief", prompt=prompt, now=now[0],
                              schedule=parse_schedule(schedule, now=now[0], timezone="Europe/Paris"))  # fmt: skip

    before = await quiet.samples()
    await task("every day at 08:00", "Brief me.")
    now[0] = datetime(2025, 6, 5, 9, 0, tzinfo=UTC)  # down for three days: three missed, one runs
    models.script(reply("Your brief, a little late."))
    assert await scheduler.run_due() == 1
    await task("every day at 12:00", "Tell me if I have open todos.")
    now[0] = datetime(2025, 6, 5, 11, 0, tzinfo=UTC)  # an hour past: after any offset
    models.script(calls(("list_todos", {})), reply(SILENT_MARK))
    assert await scheduler.run_due() == 1
    await task("every day at 14:00", "Brief me again.")
    now[0] = datetime(2025, 6, 5, 13, 0, tzinfo=UTC)
    models.script(ModelTransientError("down", provider="scripted"))
    assert await scheduler.run_due() == 1
    statuses = [r["status"] for r in await db.fetch("SELECT status FROM task_runs ORDER BY id")]
    assert sorted(statuses) == ["failed", "missed", "missed", "missed", "ran", "silent"]
    after = await quiet.samples()

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("pepper_scheduled_due_total") == 3
    assert grew("pepper_scheduled_claimed_total") == 3
    for outcome, n in (("ran", 1), ("silent", 1), ("failed", 1), ("missed", 3)):
        assert grew("pepper_scheduled_runs_total", outcome=outcome) == n, outcome


async def test_memory_jobs_are_counted_by_kind_and_outcome(quiet: Served) -> None:
    from core.conversation import record_inbound
    from core.memory.jobs import run_nightly_summaries
    from core.testing.scripted import ScriptedModels, reply

    account_id = await quiet.db.fetchval("SELECT id FROM accounts")
    await record_inbound(quiet.db, account_id, "sms", "we moved lunch to Friday")
    before = await quiet.samples()
    models = ScriptedModels(default=reply("Lunch moved to Friday."))
    report = await run_nightly_summaries(quiet.db, models, datetime.now(UTC) + timedelta(days=2), ignore_offsets=True)
    assert report.enqueued >= 1 and report.claimed == report.enqueued
    after = await quiet.samples()
    assert _value(after, "pepper_memory_jobs_enqueued_total") - _value(before, "pepper_memory_jobs_enqueued_total") == (
        report.enqueued
    )
    ran = {
        key: after[key] - before.get(key, 0.0) for key in after if key[0] == "pepper_memory_jobs_total"
    }  # by (kind, outcome)
    assert sum(ran.values()) == report.claimed
    day = sum(v for (_, labels), v in ran.items() if dict(labels)["kind"] == "day")
    assert day == 1
    assert all(dict(labels)["outcome"] in report.outcomes for (_, labels), v in ran.items() if v)


async def test_no_label_holds_a_person_s_number_or_words(served: Served) -> None:
    served.model.script(reply_text("Hello."))
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="my secret plan")
    for _ in range(2):  # and once more: a duplicate
        await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session)
    await served.twilio.wait_for_sent(1, within=30)
    for _ in range(100):
        async with served.session.get(served.local + "/metrics") as response:
            text = await response.text()
        if "pepper_turn_tokens_total{" in text:
            break
        await asyncio.sleep(0.05)
    for name in ("pepper_turns_total", "pepper_turn_tokens_total", "pepper_turn_cost_usd_total",
                 "pepper_model_tier_calls_total", 'outcome="duplicate"'):  # fmt: skip
        assert name in text
    assert OWNER.lstrip("+") not in text and "secret" not in text and form["MessageSid"] not in text
    # Every label of every metric (the ones added later too) is a word of a fixed vocabulary.
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name.startswith("pepper_") else ():
            for key, value in sample.labels.items():
                if key != "le":
                    assert re.fullmatch(r"[a-z][a-z_-]*", value), (sample.name, key, value)


async def test_a_request_through_a_proxy_or_from_elsewhere_is_refused(served: Served) -> None:
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
        async with served.session.get(served.local + "/metrics", headers={header: "203.0.113.9"}) as response:
            assert response.status == 403
            assert "PEPPER_METRICS_TOKEN" in await response.text()
            assert "pepper_" not in await response.text()


async def test_with_a_token_only_the_token_reads_the_metrics(db: Database, db_url: str) -> None:
    async for served in _served(db, db_url, metrics_token="scrape-me"):
        for given in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-me"},
                      {"Authorization": "Bearer scrape-me-too"}):  # fmt: skip
            async with served.session.get(served.local + "/metrics", headers=given) as response:
                assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
        # The token works from anywhere, through the proxy too.
        samples = await served.samples(Authorization="Bearer scrape-me", **{"X-Forwarded-For": "203.0.113.9"})
        assert any(name.startswith("pepper_") for name, _ in samples)


def test_the_metric_names_are_pepper_s_own_and_documented() -> None:
    from pathlib import Path

    from core.metrics import metrics

    names = {m._name for m in vars(metrics()).values()}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    assert all(re.fullmatch(r"pepper_[a-z_]+", n) for n in names)
    missing = [n for n in names if n not in docs]
    assert not missing, f"docs/operations.md does not describe {missing}"
