"""A loopback web for tests: pages, redirects, a huge page, a slow one, and search APIs that
answer in the real services' shapes.

``async with WebPeer() as web:`` then ``web.page("/gpu", html)``; ``web.url + "/gpu"`` serves it.
``/redirect?to=<url>`` answers 302 to ``to``; ``/huge?mb=50`` streams that many megabytes;
``/slow?seconds=30`` sends its headers and then nothing for that long. ``web.requests`` records
(method, path, query, headers) of every request, so a test can assert what never arrived.

Search APIs, each as its service documents it:

* Brave Search: ``GET /res/v1/web/search?q=&count=`` with ``X-Subscription-Token``; answers
  ``{"type": "search", "query": {"original": q}, "web": {"type": "search", "results": [{"title",
  "url", "description", ...}]}}``.
* Tavily: ``POST /search`` with ``Authorization: Bearer tvly-...`` and ``{"query", "max_results"}``;
  answers ``{"query", "answer": null, "images": [], "results": [{"title", "url", "content",
  "score", "raw_content": null}], "response_time"}``.
* SearXNG: ``GET /search?q=&format=json``; answers ``{"query", "number_of_results", "results":
  [{"url", "title", "content", "engine", "score", "category"}], "answers": [], ...}``.

``web.results`` holds the hits every search returns (title, url, snippet); ``web.search_status``
makes the search APIs answer that status (429, 500) instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer

BRAVE_KEY = "brave-test-key"
TAVILY_KEY = "tvly-test-key"


class WebPeer(HttpPeer):
    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, str, bytes]] = {}
        self.results: list[dict[str, str]] = []
        self.search_status: int | None = None
        self.requests: list[tuple[str, str, dict[str, str], dict[str, str]]] = []
        self.searches: list[tuple[str, str]] = []  # (service, query)

    def page(self, path: str, body: str | bytes, *, content_type: str = "text/html; charset=utf-8", status: int = 200):
        self.pages[path] = (status, content_type, body.encode() if isinstance(body, str) else body)

    def middlewares(self) -> list[Any]:
        return [self._record]

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/redirect", self._redirect),
            web.get("/huge", self._huge),
            web.get("/slow", self._slow),
            web.get("/res/v1/web/search", self._brave),
            web.post("/search", self._tavily),
            web.get("/search", self._searxng),
            web.route("*", "/{path:.*}", self._page),
        ]

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query), dict(request.headers)))
        return await handler(request)

    async def _page(self, request: web.Request) -> web.Response:
        found = self.pages.get(request.path)
        if found is None:
            return web.Response(status=404, text="not found")
        status, content_type, body = found
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})  # no length: streamed
        await response.prepare(request)
        block = b"<p>" + b"x" * (64 * 1024 - 7) + b"</p>\n"
        try:
            for _ in range(int(request.query.get("mb", "50")) * 16):
                await response.write(block)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def _slow(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        await asyncio.sleep(float(request.query.get("seconds", "30")))
        return response

    def _failing(self) -> web.Response | None:
        if self.search_status is None:
            return None
        return web.json_response({"error": "search failed on purpose"}, status=self.search_status)

    async def _brave(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
            return web.json_response(
                {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID"}}, status=422
            )
        query = request.query.get("q", "")
        self.searches.append(("brave", query))
        failing = self._failing()
        if failing is not None:
            return failing
        count = int(request.query.get("count", "20"))
        results = [
            {
                "title": r["title"],
                "url": r["url"],
                "description": r["snippet"],
                "type": "search_result",
                "language": "en",
            }
            for r in self.results[:count]
        ]
        return web.json_response(
            {"type": "search", "query": {"original": query}, "web": {"type": "search", "results": results}}
        )

    async def _tavily(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
            return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401)
        body = await request.json()
        self.searches.append(("tavily", body.get("query", "")))
        failing = self._failing()
        if failing is not None:
            return failing
        results = [
            {"title": r["title"], "url": r["url"], "content": r["snippet"], "score": 0.9, "raw_content": None}
            for r in self.results[: int(body.get("max_results", 5))]
        ]
        return web.json_response(
            {"query": body.get("query", ""), "answer": None, "images": [], "results": results, "response_time": 0.4}
        )

    async def _searxng(self, request: web.Request) -> web.Response:
        if request.query.get("format") != "json":
            return web.Response(status=403, text="Forbidden")  # as SearXNG answers with JSON turned off
        query = request.query.get("q", "")
        self.searches.append(("searxng", query))
        failing = self._failing()
        if failing is not None:
            return failing
        results = [
            {"url": r["url"], "title": r["title"], "content": r["snippet"], "engine": "duckduckgo", "score": 1.0,
             "category": "general"}
            for r in self.results
        ]  # fmt: skip
        return web.json_response(
            {"query": query, "number_of_results": len(results), "results": results, "answers": [], "corrections": [],
             "infoboxes": [], "suggestions": [], "unresponsive_engines": []}
        )  # fmt: skip
