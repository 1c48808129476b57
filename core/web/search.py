"""The ``web_search`` slot: one interface, several real search services behind it.

The built-in occupant (:class:`BuiltinWebSearch`) is the service ``web_search_provider`` names; a
plugin named for the slot answers instead (:class:`SlottedSearch`), and a search on which it
fails is answered by the built-in. The untrusted-text labelling stays in the research code, whoever
answers: an occupant returns plain :class:`SearchHit` items, never prompt text.

Each provider sends its service's documented request through the egress relay
(:mod:`core.web.egress`) and reads its documented response into :class:`SearchHit` items:

* ``brave``: Brave Search API, ``GET /res/v1/web/search`` with ``X-Subscription-Token``
  (``BRAVE_API_KEY``); hits in ``web.results[]`` (``title``, ``url``, ``description``).
* ``tavily``: Tavily, ``POST /search`` with ``Authorization: Bearer`` (``TAVILY_API_KEY``); hits in
  ``results[]`` (``title``, ``url``, ``content``).
* ``searxng``: a SearXNG instance (``PEPPER_SEARXNG_URL``, with the JSON format turned on in its
  ``settings.yml``), ``GET /search?format=json``; hits in ``results[]`` (``title``, ``url``, ``content``).
* ``hosted``: the research tier's own model searches, with its provider's search tool (OpenAI's
  ``web_search``, Anthropic's web search, Google Search grounding); the hits are the pages its
  answer cites, with the words it cites. Only the search query goes to the model, as with the
  others; the pages are then read through the egress relay like any hit. Never chosen by
  ``auto``: the provider bills each search on top of the tokens, so it is the person's choice.

A search that did not work (an HTTP error, a rate limit, a body that is not the service's shape)
raises :class:`SearchFailed`: a model told "no results" when the service was down tells the
person nothing exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from core.errors import ConfigError, PepperError
from core.models.errors import ModelError
from core.models.router import hosted_search_model
from core.models.types import WebSource
from core.settings import Settings
from core.slots import SLOTS, WEB_SEARCH, SlotSpec, is_list_of
from core.web.egress import Egress, EgressError, WebResponse

BRAVE_URL = "https://api.search.brave.com"
TAVILY_URL = "https://api.tavily.com"
SNIPPET_CHARS = 400
WEB_SEARCH_TIMEOUT = 20.0  # seconds an occupant has for one search


class SearchFailed(PepperError):
    code = "search-failed"


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


class SearchProvider(Protocol):
    @property
    def name(self) -> str: ...

    async def search(self, query: str, count: int = 5) -> list[SearchHit]: ...


def _checked(response: WebResponse, service: str) -> Any:
    if response.status == 429:
        raise SearchFailed(f"{service} refused the search: rate limited (HTTP 429)", retryable=True)
    if response.status >= 400:
        raise SearchFailed(f"{service} answered HTTP {response.status}", retryable=response.status >= 500)
    try:
        return response.json()
    except ValueError:
        raise SearchFailed(f"{service} did not answer with JSON") from None


def _hits(items: Any, service: str, snippet_key: str, count: int) -> list[SearchHit]:
    if not isinstance(items, list):
        raise SearchFailed(f"{service} answered without a result list")
    hits = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            snippet = " ".join(str(item.get(snippet_key) or "").split())[:SNIPPET_CHARS]
            hits.append(SearchHit(str(item.get("title") or item["url"]), item["url"], snippet))
    return hits[:count]


async def _send(egress: Egress, service: str, url: str, **kw: Any) -> WebResponse:
    try:
        return await egress.fetch(url, **kw)
    except EgressError as exc:
        raise SearchFailed(f"{service} could not be reached: {exc.message}", retryable=exc.retryable) from None


@dataclass
class _KeyedService:
    egress: Egress
    api_key: str
    base_url: str


@dataclass
class BraveSearch(_KeyedService):
    base_url: str = BRAVE_URL
    name: ClassVar[str] = "brave"

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        headers = {"Accept": "application/json", "X-Subscription-Token": self.api_key}
        url = f"{self.base_url.rstrip('/')}/res/v1/web/search"
        response = await _send(self.egress, "Brave Search", url, headers=headers, params={"q": query, "count": count})
        body = _checked(response, "Brave Search")
        # Brave leaves "web" out when nothing was found.
        web = body.get("web", {"results": []}) if isinstance(body, dict) else None
        return _hits(web.get("results") if isinstance(web, dict) else None, "Brave Search", "description", count)


@dataclass
class TavilySearch(_KeyedService):
    base_url: str = TAVILY_URL
    name: ClassVar[str] = "tavily"

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        body = {"query": query, "max_results": count, "search_depth": "basic"}
        url = f"{self.base_url.rstrip('/')}/search"
        response = await _send(self.egress, "Tavily", url, method="POST", headers=headers, json=body)
        found = _checked(response, "Tavily")
        return _hits(found.get("results") if isinstance(found, dict) else None, "Tavily", "content", count)


@dataclass
class SearxngSearch:
    egress: Egress
    base_url: str
    name: ClassVar[str] = "searxng"

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        url = f"{self.base_url.rstrip('/')}/search"
        response = await _send(self.egress, "SearXNG", url, headers={"Accept": "application/json"},
                               params={"q": query, "format": "json"})  # fmt: skip
        if response.status == 403:
            raise SearchFailed("SearXNG refused the JSON format (turn on 'json' under search.formats)")
        found = _checked(response, "SearXNG")
        return _hits(found.get("results") if isinstance(found, dict) else None, "SearXNG", "content", count)


class HostedSearcher(Protocol):
    """The part of the model router a hosted search needs (``core.models.router.ModelRouter``)."""

    async def hosted_search(self, query: str, *, tier: str, count: int) -> list[WebSource]: ...


@dataclass
class HostedSearch:
    models: HostedSearcher
    tier: str
    name: ClassVar[str] = "hosted"

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        try:
            sources = await self.models.hosted_search(query, tier=self.tier, count=count)
        except ModelError as exc:
            raise SearchFailed(f"the model's web search did not work: {exc.message}", retryable=exc.retryable) from None
        return [SearchHit(s.title, s.url, " ".join(s.snippet.split())[:SNIPPET_CHARS]) for s in sources]


def search_choice(settings: Settings) -> str | None:
    """The search service in force (what ``web_search_provider`` names; "auto": the first set up
    of Brave, Tavily, SearXNG), None for none; a choice that is not set up raises ``ConfigError``."""
    choice = settings.web_search_provider
    brave = settings.brave_api_key.get_secret_value() if settings.brave_api_key else ""
    tavily = settings.tavily_api_key.get_secret_value() if settings.tavily_api_key else ""
    if choice == "auto":
        choice = "brave" if brave else "tavily" if tavily else "searxng" if settings.searxng_url else "none"
    if choice == "none":
        return None
    if choice == "brave" and not brave:
        raise ConfigError("PEPPER_WEB_SEARCH_PROVIDER is brave but BRAVE_API_KEY is not set")
    if choice == "tavily" and not tavily:
        raise ConfigError("PEPPER_WEB_SEARCH_PROVIDER is tavily but TAVILY_API_KEY is not set")
    if choice == "searxng" and not settings.searxng_url:
        raise ConfigError("PEPPER_WEB_SEARCH_PROVIDER is searxng but PEPPER_SEARXNG_URL is not set")
    if choice == "hosted":
        model, provider = hosted_search_model(settings, settings.web_research_tier)
        if provider is None:
            raise ConfigError(
                f"PEPPER_WEB_SEARCH_PROVIDER is hosted but the {settings.web_research_tier} tier's model"
                f" ({model or 'none set up'}) has no hosted web search: OpenAI, Anthropic and Google models do"
            )
    return choice


def search_provider(settings: Settings, egress: Egress, models: HostedSearcher) -> SearchProvider | None:
    """The provider :func:`search_choice` names, built; ``models`` does the hosted search."""
    choice = search_choice(settings)
    if choice is None:
        return None
    if choice == "brave":
        return BraveSearch(egress, settings.brave_api_key.get_secret_value(), settings.brave_search_url)  # type: ignore[union-attr]
    if choice == "tavily":
        return TavilySearch(egress, settings.tavily_api_key.get_secret_value(), settings.tavily_url)  # type: ignore[union-attr]
    if choice == "hosted":
        return HostedSearch(models, settings.web_research_tier)
    return SearxngSearch(egress, settings.searxng_url)  # type: ignore[arg-type]


class BuiltinWebSearch:
    """The configured service (:func:`search_provider`); the research helper sets ``provider``."""

    def __init__(self) -> None:
        self.provider: SearchProvider | None = None

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        if self.provider is None:
            raise SearchFailed("no web search service is set up")
        return await self.provider.search(query, count)


BUILTIN_WEB_SEARCH = BuiltinWebSearch()
WEB_SEARCH_SPEC = SLOTS.register(
    SlotSpec(WEB_SEARCH, ("search",), BUILTIN_WEB_SEARCH, is_list_of(SearchHit), WEB_SEARCH_TIMEOUT,
             "web search for the research helper (Brave, Tavily, SearXNG or hosted built in)")
)  # fmt: skip


@dataclass
class SlottedSearch:
    """A :class:`SearchProvider` over the slot for one research request, whose occupant the
    caller resolved (the helper has no database): ``fallbacks`` collects the reasons of the
    searches the built-in answered instead, for the caller to count."""

    occupant: str
    fallbacks: list[str]

    @property
    def name(self) -> str:
        return self.occupant

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        resolved = SLOTS.named(WEB_SEARCH, self.occupant)
        hits, reason = await SLOTS.run(WEB_SEARCH, resolved, "search", query, count)
        if reason is not None:
            self.fallbacks.append(reason)
        return list(hits)
