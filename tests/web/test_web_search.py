"""Search providers speak each service's API (core.web.search); pages become text (core.web.pages)."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.settings import Settings
from core.testing.web_peer import BRAVE_KEY, TAVILY_KEY, WebPeer
from core.web.egress import Egress, EgressError, EgressPolicy
from core.web.pages import read_page
from core.web.search import BraveSearch, SearchFailed, SearxngSearch, TavilySearch, search_choice, search_provider

HITS = [
    {"title": "RTX 6000 Ada price", "url": "https://shop.example/rtx6000", "snippet": "From $6,800 at Shop."},
    {"title": "GPU prices", "url": "https://prices.example/gpu", "snippet": "Prices  this\nweek."},
]


def _providers(web: WebPeer) -> list:
    egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})))
    return [BraveSearch(egress, BRAVE_KEY, web.url), TavilySearch(egress, TAVILY_KEY, web.url),
            SearxngSearch(egress, web.url)]  # fmt: skip


async def test_each_service_returns_its_hits() -> None:
    async with WebPeer() as web:
        web.results = HITS
        for provider in _providers(web):
            hits = await provider.search("rtx 6000 ada price", count=5)
            assert [(h.title, h.url) for h in hits] == [(r["title"], r["url"]) for r in HITS], provider.name
            assert hits[1].snippet == "Prices this week."
        assert web.searches == [(s, "rtx 6000 ada price") for s in ("brave", "tavily", "searxng")]


async def test_nothing_found_is_an_empty_list() -> None:
    async with WebPeer() as web:
        for provider in _providers(web):
            assert await provider.search("zzz") == []


@pytest.mark.parametrize("status", [429, 500])
async def test_a_failing_search_api_is_a_failure_not_an_empty_result(status: int) -> None:
    async with WebPeer() as web:
        web.results, web.search_status = HITS, status
        for provider in _providers(web):
            with pytest.raises(SearchFailed, match=str(status)):
                await provider.search("rtx 6000 ada price")


async def test_a_wrong_key_is_a_failure() -> None:
    async with WebPeer() as web:
        egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})))
        with pytest.raises(SearchFailed, match="422"):
            await BraveSearch(egress, "wrong", web.url).search("x")
        with pytest.raises(SearchFailed, match="401"):
            await TavilySearch(egress, "wrong", web.url).search("x")


async def test_a_search_api_inside_the_house_is_refused() -> None:
    with pytest.raises(SearchFailed, match=r"could not be reached: .*loopback"):
        await SearxngSearch(Egress(), "http://127.0.0.1:8888").search("x")


def test_the_provider_comes_from_the_settings() -> None:
    assert search_choice(Settings()) is None
    assert search_choice(Settings(brave_api_key="k")) == "brave"
    assert search_choice(Settings(tavily_api_key="k")) == "tavily"
    assert search_choice(Settings(searxng_url="https://searx.example", brave_api_key="k",
                                  web_search_provider="searxng")) == "searxng"  # fmt: skip
    assert search_choice(Settings(brave_api_key="k", web_search_provider="none")) is None
    with pytest.raises(ConfigError, match="TAVILY_API_KEY"):
        search_choice(Settings(web_search_provider="tavily"))
    built = search_provider(Settings(tavily_api_key="k"), Egress(), models=None)  # type: ignore[arg-type]
    assert isinstance(built, TavilySearch) and built.api_key == "k"


ARTICLE = """<html><head><title>RTX 6000 Ada: price check</title></head><body>
<nav><a href="/">Home</a> | <a href="/deals">Deals</a></nav>
<article><h1>RTX 6000 Ada price check</h1>
<p>The NVIDIA RTX 6000 Ada Generation with 48 GB of memory sells for about $6,800 at most shops this month.</p>
<p>Used cards go for around $5,500, and prices have been steady since the spring.</p></article>
<script>var tracking = "do not read me";</script><footer>Copyright Shop</footer></body></html>"""


async def test_a_page_is_reduced_to_its_text() -> None:
    async with WebPeer() as web:
        web.page("/rtx", ARTICLE)
        page = await read_page(Egress(EgressPolicy(loopback_ports=frozenset({web.port}))), web.url + "/rtx")
        assert page.title.startswith("RTX 6000 Ada")
        assert "$6,800" in page.text and "$5,500" in page.text
        assert "tracking" not in page.text and "<p>" not in page.text


async def test_a_missing_page_or_a_binary_file_is_an_error() -> None:
    async with WebPeer() as web:
        web.page("/file.pdf", b"%PDF-1.7", content_type="application/pdf")
        egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})))
        with pytest.raises(EgressError, match="404"):
            await read_page(egress, web.url + "/nope")
        with pytest.raises(EgressError, match="not a web page"):
            await read_page(egress, web.url + "/file.pdf")
