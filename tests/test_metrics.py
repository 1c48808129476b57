"""``GET /metrics`` (gateway/metrics_route.py, core/metrics.py): what happened is counted, and only
a scraper on this machine (or one with the token) may read it. ``pepper serve``'s processes
reporting together is checked in tests/test_turn_workers.py, whose server has turn workers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.twilio_peer import TwilioPeer
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
    async for s in _served(db, db_url):
        yield s


async def test_a_turn_a_model_call_and_webhooks_are_counted(served: Served) -> None:
    before = await served.samples()
    served.model.script(reply_text("Hello Ada."))
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="hi")
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    # The same delivery again (Twilio retries): accepted, and one turn only.
    assert (await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session))[0] == 200
    forged = TwilioPeer(auth_token="not-the-token").sign(PUBLIC + "/twilio/sms", form)
    status, _ = await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, signature=forged,
                                              session=served.session)  # fmt: skip
    assert status == 403
    async with served.session.post(served.local + "/twilio/voice", data={"garbage": "x"}) as response:
        assert response.status == 403  # unsigned
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
    assert grew("pepper_webhooks_total", provider="sms", outcome="accepted") == 2
    assert grew("pepper_webhooks_total", provider="sms", outcome="refused") == 1
    assert grew("pepper_webhooks_total", provider="voice", outcome="refused") == 1
    assert grew("pepper_model_calls_total", provider="openai", outcome="ok") >= 1
    assert grew("pepper_model_tokens_total", provider="openai", direction="input") >= 10
    # Every metric is listed from the start, so a dashboard has no gaps.
    assert any(name == "pepper_calls_active" for name, _ in before)


async def test_no_label_holds_a_person_s_number_or_words(served: Served) -> None:
    served.model.script(reply_text("Hello."))
    form = served.twilio.inbound_message(sender=OWNER, to=LINE, body="my secret plan")
    await served.twilio.post_form(served.local, PUBLIC, "/twilio/sms", form, session=served.session)
    await served.twilio.wait_for_sent(1, within=30)
    async with served.session.get(served.local + "/metrics") as response:
        text = await response.text()
    assert "pepper_turns_total" in text
    assert OWNER.lstrip("+") not in text and "secret" not in text


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
