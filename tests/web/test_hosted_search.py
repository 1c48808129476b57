"""The ``hosted`` search occupant: the research tier's own model searches with its provider's search
tool (OpenAI's ``web_search``, Anthropic's web search, Google Search grounding), through each real
SDK against its loopback peer, which answers in the provider's own citation shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import pytest
from web_support import PRICE_PAGE, QUESTION

from core.errors import ConfigError
from core.models.adapters.anthropic import AnthropicAdapter
from core.models.adapters.base import ModelAdapter
from core.models.adapters.google import GoogleAdapter
from core.models.adapters.openai_compatible import OpenAICompatibleAdapter
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import ModelChoice, ModelRouter, Tier
from core.settings import Settings
from core.testing.peers import AnthropicPeer, Cited, GooglePeer, LoopbackPeer, OpenAIPeer, Reply, fault, reply_text
from core.testing.peers.script import ScriptedCall
from core.testing.web_peer import WebPeer
from core.web.egress import Egress, EgressPolicy
from core.web.research import Researcher
from core.web.search import HostedSearch, SearchFailed, search_choice, search_provider

CITED = (
    Cited("RTX 6000 Ada price check", "https://shop.example/rtx6000", "sells for about $6,800 new"),
    Cited("GPU prices this week", "https://prices.example/gpu", "steady since the spring"),
)
QUERY = "rtx 6000 ada 48gb price"

Make = Callable[[LoopbackPeer], ModelAdapter]
PROVIDERS: dict[str, tuple[type[LoopbackPeer], Make, str]] = {
    "openai": (OpenAIPeer, lambda p: OpenAIResponsesAdapter(api_key="k", base_url=p.base_url), "gpt-5-mini"),  # type: ignore[attr-defined]
    "anthropic": (AnthropicPeer, lambda p: AnthropicAdapter(api_key="k", base_url=p.base_url), "claude-haiku-4-5"),  # type: ignore[attr-defined]
    "google": (GooglePeer, lambda p: GoogleAdapter(api_key="k", base_url=p.base_url), "gemini-2.5-flash"),  # type: ignore[attr-defined]
}


def _router(provider: str, adapter: ModelAdapter, model: str) -> ModelRouter:
    return ModelRouter({provider: adapter}, {"small": Tier("small", (ModelChoice(model),))})


@pytest.fixture(params=list(PROVIDERS))
async def hosted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, LoopbackPeer, HostedSearch]]:
    peer_cls, make, model = PROVIDERS[request.param]
    async with peer_cls() as peer, aclosing(make(peer)) as adapter:
        yield request.param, peer, HostedSearch(_router(request.param, adapter, model), "small")


def _search_tool_sent(provider: str, body: dict) -> bool:
    tools = body.get("tools") or []
    if provider == "openai":
        return tools == [{"type": "web_search"}]
    if provider == "anthropic":
        return [t["type"] for t in tools] == ["web_search_20250305"]
    return len(tools) == 1 and ("googleSearch" in tools[0] or "google_search" in tools[0])


async def test_the_cited_pages_are_the_hits_and_only_the_query_is_sent(hosted) -> None:
    provider, peer, search = hosted
    peer.script(Reply(text="About $6,800 new, prices steady.", cited=CITED))
    hits = await search.search(QUERY, count=5)
    assert [(h.title, h.url, h.snippet) for h in hits] == [(c.title, c.url, c.quote) for c in CITED]
    (request,) = peer.requests
    assert _search_tool_sent(provider, request.body), request.body
    sent = json.dumps(request.body)
    assert QUERY in sent
    assert "instructions" not in request.body and "system" not in request.body  # no prompt of Pepper's


async def test_a_page_cited_twice_is_one_hit_and_count_is_kept(hosted) -> None:
    _, peer, search = hosted
    again = Cited(CITED[0].title, CITED[0].url, "the same page, quoted again")
    peer.script(Reply(cited=(CITED[0], again, CITED[1])))
    hits = await search.search(QUERY, count=1)
    assert [h.url for h in hits] == [CITED[0].url]


async def test_an_answer_that_cites_nothing_is_no_results(hosted) -> None:
    _, peer, search = hosted
    peer.script(reply_text("I could not find anything on that."))
    assert await search.search(QUERY) == []


@pytest.mark.parametrize("status", [429, 500])
async def test_a_failing_provider_is_a_failure_not_an_empty_result(hosted, status: int) -> None:
    _, peer, search = hosted
    peer.script(fault(status))
    with pytest.raises(SearchFailed, match="web search did not work") as caught:
        await search.search(QUERY)
    assert caught.value.retryable


async def test_anthropics_reported_search_error_is_a_failure() -> None:
    """Anthropic answers 200 with a ``web_search_tool_result_error`` when its search fails."""
    async with AnthropicPeer() as peer, aclosing(AnthropicAdapter(api_key="k", base_url=peer.base_url)) as adapter:
        peer.script(Reply(search_error="too_many_requests"))
        search = HostedSearch(_router("anthropic", adapter, "claude-haiku-4-5"), "small")
        with pytest.raises(SearchFailed, match="too_many_requests"):
            await search.search(QUERY)


async def test_a_model_without_a_hosted_search_is_refused_plainly() -> None:
    async with OpenAIPeer() as peer, aclosing(OpenAICompatibleAdapter(base_url=peer.base_url)) as adapter:
        search = HostedSearch(_router("openai-compatible", adapter, "compat:llama3"), "small")
        with pytest.raises(SearchFailed, match="has no hosted web search"):
            await search.search(QUERY)
        assert peer.requests == []


def test_hosted_is_chosen_only_when_asked_and_only_for_a_model_that_has_one() -> None:
    assert search_choice(Settings(openai_api_key="k")) is None  # never by "auto": it is billed per search
    assert search_choice(Settings(openai_api_key="k", web_search_provider="hosted")) == "hosted"
    assert search_choice(Settings(gemini_api_key="k", web_search_provider="hosted")) == "hosted"
    with pytest.raises(ConfigError, match=r"small tier's model \(compat:llama3\) has no hosted web search"):
        search_choice(Settings(models={"compatible_base_url": "http://127.0.0.1:1/v1",  # type: ignore[arg-type]
                                       "compatible_model": "llama3"}, web_search_provider="hosted"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"\(none set up\)"):
        search_choice(Settings(web_search_provider="hosted"))
    router = ModelRouter({}, {})
    built = search_provider(Settings(openai_api_key="k", web_search_provider="hosted"), Egress(), router)
    assert isinstance(built, HostedSearch) and built.models is router


async def test_the_research_helper_reads_the_pages_its_model_found() -> None:
    """The helper's loop over the hosted occupant: search (the provider's tool), read the cited
    page through the egress relay, answer with it as the source."""
    async with (
        OpenAIPeer() as model,
        WebPeer() as web,
        aclosing(OpenAIResponsesAdapter(api_key="k", base_url=model.base_url)) as adapter,
    ):
        web.page("/rtx6000", PRICE_PAGE)
        page = web.url + "/rtx6000"
        router = _router("openai", adapter, "gpt-5-mini")
        model.script(
            Reply(tool_calls=(ScriptedCall("web_search", {"query": QUERY}),)),
            Reply(text="About $6,800.", cited=(Cited("RTX 6000 Ada price check", page, "about $6,800 new"),)),
            Reply(tool_calls=(ScriptedCall("read_page", {"url": page}),)),
            reply_text("About $6,800 new (RTX 6000 Ada price check)."),
        )
        egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})))
        report = await Researcher(router, HostedSearch(router, "small"), egress).answer(QUESTION)
        assert report.status == "answered" and "$6,800" in report.answer
        assert report.searches == [{"query": QUERY, "status": "ok", "hits": [page]}]
        assert report.sources == [{"url": page, "title": "RTX 6000 Ada price check"}]
        search_request = model.requests[1].body
        assert search_request["tools"] == [{"type": "web_search"}] and QUESTION not in json.dumps(search_request)
        assert any(path == "/rtx6000" for _, path, _, _ in web.requests)
