"""What a web research hand-off adds, and what the tool costs the orchestrator's prompt.

The research helper runs as ``pepper serve`` runs it (``gateway.research``: its own process, on a
unix socket) against loopback peers: a SearXNG-shaped search API and a price page (both
``core.testing.web_peer.WebPeer``) and an OpenAI-shaped model (``core.testing.peers.OpenAIPeer``).
Each hand-off is one search, one page read and three model rounds (search, read, answer).

Prints, median and p99 over ``--handoffs`` hand-offs:

* the hand-off as the orchestrator's tool sees it (socket, helper process, its loop, the relay);
* the baseline in the same run: the same three model calls, search and page read made directly
  from this process through the same router and relay, one after another (the peers' own time);
* the difference, which is what the helper adds per hand-off (target: median <= 50 ms).

And the orchestrator's first prompt in tokens with and without the ``web_research`` tool (the
tool's description and schema), counted as ``bench/prompt_size.py`` counts.

    PYTHONPATH=. .venv/bin/python bench/research.py [--handoffs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from prompt_size import token_counter  # the sibling script (``python bench/research.py`` puts bench/ on the path)

from core.models.router import ModelRouter
from core.models.types import ChatMessage, Prompt
from core.settings import Settings
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.web_peer import WebPeer
from core.tools.connectors import Connectors
from core.tools.starter import starter_registry
from core.web.egress import Egress, egress_policy
from core.web.helper import research
from core.web.pages import read_page
from core.web.research import HELPER_RULES, TOOLS
from core.web.search import SearxngSearch
from gateway.research import ResearchHelper

QUESTION = "What does an NVIDIA RTX 6000 Ada 48 GB cost new today?"
PAGE = (
    "<html><head><title>RTX 6000 Ada price check</title></head><body><article><h1>RTX 6000 Ada price check</h1>"
    + "<p>The NVIDIA RTX 6000 Ada Generation with 48 GB sells for about $6,800 new this month.</p>" * 40
    + "</article></body></html>"
)


def _script(model: OpenAIPeer, url: str) -> None:
    model.script(
        reply_tools(("web_search", {"query": "RTX 6000 Ada price"})),
        reply_tools(("read_page", {"url": url})),
        reply_text(f"About $6,800 new. Sources: {url}"),
    )


async def _direct(router: ModelRouter, search: SearxngSearch, egress: Egress, url: str) -> None:
    """The same peer work without the helper: three model rounds, a search, a page read."""
    history = (ChatMessage("user", QUESTION),)
    for step in range(3):
        prompt = Prompt(system_stable=HELPER_RULES, messages=history, tools=TOOLS, max_output_tokens=800)
        await router.generate(prompt, conversation_key="bench", tier="small")
        if step == 0:
            await search.search("RTX 6000 Ada price")
        elif step == 1:
            await read_page(egress, url)


def _tool_tokens(count) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    def tools_text(registry) -> str:  # type: ignore[no-untyped-def]
        specs = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in registry.all()]
        return json.dumps(specs, separators=(",", ":"))

    without = count(tools_text(starter_registry(Connectors())))
    with_tool = count(tools_text(starter_registry(Connectors(research_socket="/tmp/unused.sock"))))
    return without, with_tool


async def main(handoffs: int) -> None:
    async with WebPeer() as web, OpenAIPeer() as model:
        web.page("/rtx6000", PAGE)
        url = web.url + "/rtx6000"
        web.results = [{"title": "RTX 6000 Ada price check", "url": url, "snippet": "About $6,800 new."}]
        settings = Settings(
            openai_api_key="sk-bench", openai_base_url=model.base_url, web_search_provider="searxng",
            searxng_url=web.url, web_test_loopback_ports=(web.port,),
        )  # fmt: skip
        helper = ResearchHelper(settings)
        helper.start()
        router = ModelRouter.from_settings(settings)
        egress = Egress(egress_policy(settings))
        search = SearxngSearch(egress, web.url)
        handed, direct = [], []
        try:
            await helper.ready()
            for n in range(handoffs + 3):  # three warm-up rounds of each, not counted
                _script(model, url)
                started = time.perf_counter()
                report = await research(helper.socket_path, QUESTION, 30)
                took = (time.perf_counter() - started) * 1000
                assert report.sources and report.sources[0]["url"] == url, report
                _script(model, url)
                started = time.perf_counter()
                await _direct(router, search, egress, url)
                baseline = (time.perf_counter() - started) * 1000
                if n >= 3:
                    handed.append(took)
                    direct.append(baseline)
        finally:
            await helper.stop(2)
            await router.aclose()
    added = [h - d for h, d in zip(handed, direct, strict=True)]
    count, how = token_counter()
    without, with_tool = _tool_tokens(count)
    print(f"web research hand-offs: {handoffs} (1 search, 1 page, 3 model rounds each; loopback peers)")
    print(f"  hand-off through the helper process: {statistics.median(handed):.1f} / {p99(handed):.1f} ms")
    print(f"  baseline, the same peer calls made directly: {statistics.median(direct):.1f} / {p99(direct):.1f} ms")
    print(f"  added by the helper: {statistics.median(added):.1f} / {p99(added):.1f} ms (target: median <= 50 ms)")
    grown = with_tool - without
    print(f"orchestrator tool list: {without:,} tokens without web_research, {with_tool:,} with (+{grown:,})")
    print(f"  tokens counted with {how}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=50)
    asyncio.run(main(parser.parse_args().handoffs))
