"""What a loopback model peer is told to do, and the small HTTP server all of them share.

A test scripts a peer with a queue of :class:`Reply` items; each request the peer receives takes
the next one. A reply is a normal answer (text and/or tool calls, with usage) or a fault: an HTTP
status with the provider's error body, a delay before answering, or a stream cut after N events.
Every request is recorded (:class:`Received`) so tests can check what the SDK actually sent.

An unscripted request gets HTTP 400 with a message saying so: a 400 never fails over, so a
test that forgot to script a reply fails loudly instead of passing by accident.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None  # the peer numbers calls when not given


STREAM_STARTS = web.AppKey("stream_starts", list)


@dataclass(frozen=True)
class Cited:
    """A page a hosted web search "found" and the reply cites, with the words it quotes."""

    title: str
    url: str
    quote: str


@dataclass(frozen=True)
class Reply:
    """One scripted answer (or fault) of a peer.

    ``text`` streams in word-sized deltas. ``status`` answers with that HTTP status and the
    provider's error body instead. ``delay`` seconds pass before the answer starts.
    ``cut_after`` closes the connection abruptly after that many stream events (streaming only).
    ``hold`` keeps the answer back until the test sets that event. ``pace`` seconds pass between
    stream events (a reply a page can be watched streaming). ``cited``: the pages a hosted web
    search found, answered in the provider's own shape when the request turned its search on.
    """

    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    # Usage in the normalised sense (input includes cached, output includes reasoning); each peer
    # renders it the way its provider counts.
    input_tokens: int = 10
    output_tokens: int = 5
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    finish: str | None = None  # "length" to report a truncated reply; else derived
    status: int | None = None
    error_message: str = "scripted failure"
    delay: float = 0.0
    pace: float = 0.0
    cut_after: int | None = None
    hold: asyncio.Event | None = field(default=None, compare=False)
    cited: tuple[Cited, ...] = ()
    search_error: str | None = None  # Anthropic: the search tool's error code instead of results

    def cited_text(self) -> str:
        """The reply's text with every cited quote in it (each found by ``str.index``)."""
        text = self.text
        for source in self.cited:
            if source.quote not in text:
                text = f"{text} {source.quote}".strip()
        return text

    def words(self) -> list[str]:
        """The text as streamed: word-sized pieces that join back to ``text``."""
        return re.findall(r"\s*\S+\s*", self.text) or ([self.text] if self.text else [])


def reply_text(text: str, **kw: Any) -> Reply:
    return Reply(text=text, **kw)


def reply_tools(*calls: tuple[str, dict[str, Any]] | ScriptedCall, text: str = "", **kw: Any) -> Reply:
    """A reply that calls tools: ``reply_tools(("get_weather", {"city": "Paris"}))``."""
    scripted = tuple(c if isinstance(c, ScriptedCall) else ScriptedCall(c[0], c[1]) for c in calls)
    return Reply(text=text, tool_calls=scripted, **kw)


def fault(status: int, message: str = "scripted failure", **kw: Any) -> Reply:
    return Reply(status=status, error_message=message, **kw)


@dataclass(frozen=True)
class Received:
    """One request as the peer saw it."""

    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic, compare=False)  # when it arrived

    @property
    def streaming(self) -> bool:
        return bool(self.body.get("stream")) or "streamGenerateContent" in self.path


@dataclass
class _CallCounter:
    n: int = 0

    def next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


class LoopbackPeer(HttpPeer):
    """A scripted HTTP peer on 127.0.0.1. Use as ``async with Peer() as peer:``.

    Subclasses add routes in :meth:`routes` and turn a :class:`Reply` into their wire format.
    """

    # Requests carry audio and images.
    client_max_size = 64 * 1024 * 1024

    def __init__(self) -> None:
        self._queue: deque[Reply] = deque()
        self.requests: list[Received] = []
        self.unscripted = 0
        self._ids = _CallCounter()
        # time.time() at which each streamed answer's first frame went out (bench/webapp.py).
        self.stream_starts: list[float] = []
        # The one key the models list accepts (``pepper doctor --online``); None accepts any.
        self.api_key: str | None = None
        # The model ids the models list names (subclasses set their provider's).
        self.models: list[str] = []

    # Scripting.
    def script(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    def clear_script(self) -> None:
        """Forget the replies scripted and not yet taken."""
        self._queue.clear()

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def root(self) -> str:
        return self.url

    # Shared request handling.
    async def _take(self, request: web.Request) -> tuple[Received, Reply | None]:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            body = {}
        received = Received(
            request.method, request.path, dict(request.headers), dict(request.query), body if body else {}
        )
        self.requests.append(received)
        if not self._queue:
            self.unscripted += 1
            return received, None
        reply = self._queue.popleft()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.hold is not None:
            await reply.hold.wait()
        return received, reply

    def call_id(self, call: ScriptedCall, prefix: str) -> str:
        return call.id or self._ids.next(prefix)


class StreamWriter:
    """Writes SSE frames, cutting the connection after ``cut_after`` frames when asked."""

    def __init__(self, request: web.Request, response: web.StreamResponse, cut_after: int | None):
        self.request = request
        self.response = response
        self.cut_after = cut_after
        self.sent = 0

    async def send(self, data: str, event: str | None = None) -> None:
        if self.cut_after is not None and self.sent >= self.cut_after:
            raise _Cut
        frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        await self.response.write(frame.encode())
        self.sent += 1


class _Cut(Exception):
    pass


async def open_sse(request: web.Request, reply: Reply) -> tuple[web.StreamResponse, StreamWriter]:
    response = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response, StreamWriter(request, response, reply.cut_after)


async def run_stream(request: web.Request, reply: Reply, frames: Any) -> web.StreamResponse:
    """Send ``frames`` (an iterable of ``(event, data)``) as SSE; honour ``reply.cut_after``."""
    response, writer = await open_sse(request, reply)
    starts = request.app.get(STREAM_STARTS)
    try:
        for n, (event, data) in enumerate(frames):
            if n == 0 and starts is not None:
                starts.append(time.time())
            await writer.send(data, event)
            await asyncio.sleep(reply.pace)
    except _Cut:
        transport = request.transport
        if transport is not None:
            transport.abort()
        return response
    await response.write_eof()
    return response


def json_response(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)
