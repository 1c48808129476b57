"""Web research end to end through the real server: an SMS asks a price, one hand-off goes to the
helper process, which searches a loopback search API and reads a loopback page, and the reply that
Twilio delivers cites the page. A follow-up without "search" may use the web; an hour later not."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import aiohttp
import pytest
from web_support import QUESTION, web_with_prices

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.twilio_peer import TwilioPeer
from core.testing.web_peer import WebPeer
from core.untrusted import WEB_RESEARCH_LABEL
from gateway.server import running_app

# These start the research helper (or pepper serve) as a process of its own.
pytestmark = pytest.mark.slow

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER = "+14155552671"
PEPPER_NUMBER = "+14155550100"


def _tool_names(request) -> set[str]:
    return {t["name"] for t in request.body.get("tools", [])}


def _split(model: OpenAIPeer) -> tuple[list, list]:
    """(the orchestrator's turn rounds, the helper's rounds); the SMS repair pass has no tools."""
    helper = [r for r in model.requests if "web research helper" in json.dumps(r.body.get("instructions", ""))]
    turns = [r for r in model.requests if r not in helper and "tools" in r.body]
    return turns, helper


async def _text(twilio: TwilioPeer, local: str, session: aiohttp.ClientSession, body: str) -> None:
    form = twilio.inbound_message(sender=OWNER, to=PEPPER_NUMBER, body=body)
    status, _ = await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
    assert status == 200


async def _settled(db: Database) -> None:
    for _ in range(1000):
        busy = await db.fetchval(
            "SELECT (SELECT count(*) FROM turns WHERE status = 'running')"
            " + (SELECT count(*) FROM messages WHERE handling IN ('queued', 'running'))"
        )
        if not busy:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("turns did not finish")


async def test_an_sms_price_question_is_researched_and_the_reply_cites_the_page(db: Database, db_url: str) -> None:
    ada = await identity.create_account(db, "Grace")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await identity.assign_line(db, PEPPER_NUMBER, "personal", ada.id)
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model, WebPeer() as web:
        url = web_with_prices(web)
        settings = Settings(
            database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
            twilio_api_url=twilio.api_url, openai_api_key="sk-test", openai_base_url=model.base_url, port=0,
            web_search_provider="searxng", searxng_url=web.url, web_test_loopback_ports=(web.port,),
        )  # fmt: skip
        # One queue for both: the orchestrator's first round, the helper's three, the orchestrator's reply.
        model.script(
            reply_tools(("web_research", {"question": QUESTION})),
            reply_tools(("web_search", {"query": "RTX 6000 Ada 48GB price"})),
            reply_tools(("read_page", {"url": url})),
            reply_text(f"About $6,800 new, used around $5,500. Sources: {url}"),
            reply_text(f"An RTX 6000 Ada 48 GB costs about $6,800 new (source: {url})."),
        )
        async with running_app(settings, db) as (_, port), aiohttp.ClientSession() as session:
            local = f"http://127.0.0.1:{port}"
            await _text(twilio, local, session, "Search the web: what does an RTX 6000 Ada cost?")
            [sent] = await twilio.wait_for_sent(1, within=30)
            assert url in sent.body and "$6,800" in sent.body
            await _settled(db)
            turns, helper = _split(model)
            orchestrator, helper_first = turns[0], helper[0]
            assert len(helper) == 3 and "web_research" in _tool_names(orchestrator)
            # The helper's request holds its rules and the question, nothing of the person's.
            assert [m["content"] for m in helper_first.body["input"] if m.get("role") == "user"] == [QUESTION]
            assert _tool_names(helper_first) == {"web_search", "read_page"}
            assert "Grace" not in json.dumps([r.body for r in helper]) and OWNER not in json.dumps(
                [r.body for r in helper]
            )
            assert web.searches == [("searxng", "RTX 6000 Ada 48GB price")]
            reply_round = json.dumps(turns[1].body, ensure_ascii=False)
            assert WEB_RESEARCH_LABEL in reply_round and url in reply_round
            [calls] = await db.fetch("SELECT tool_calls FROM turns WHERE kind = 'live'")
            assert json.loads(calls["tool_calls"])[0]["status"] == "ok"

            # A follow-up without "search" still may use the web; its memory holds only the person's words.
            model.script(reply_text("The 48 GB one is the RTX 6000 Ada; about $6,800."))
            await _text(twilio, local, session, "I mean the 48 GB version")
            await twilio.wait_for_sent(2, within=30)
            await _settled(db)
            follow_up = _split(model)[0][-1]
            assert "web_research" in _tool_names(follow_up)
            instructions = json.dumps(follow_up.body.get("instructions", ""))
            assert "what does an RTX 6000 Ada cost?" in instructions and sent.body not in instructions

            # An hour later the permission is gone.
            await db.execute("UPDATE messages SET created_at = created_at - $1::interval", timedelta(hours=1))
            model.script(reply_text("Sure."))
            await _text(twilio, local, session, "and the 24 GB one?")
            await twilio.wait_for_sent(3, within=30)
            await _settled(db)
            assert "web_research" not in _tool_names(_split(model)[0][-1])
            assert len(_split(model)[1]) == 3  # still the one hand-off
