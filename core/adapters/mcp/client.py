"""One connection to an MCP server on the official SDK, and the plain values it gives back.

A :class:`McpConnection` is opened once and reused: a task of its own holds the SDK's ``Client``
open (the SDK's task groups must be entered and left in one task), and requests from any task
go through it. Every request has a time limit; when one runs out, or the transport fails, the
connection is closed and the next request opens a new one, so a server that hangs, crashes or
answers garbage costs at most one time limit per request, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from core.errors import PepperError

log = logging.getLogger(__name__)

Transport = Literal["http", "stdio"]
MAX_RESULT_CHARS = 20_000


class McpUnavailable(PepperError):
    """The server could not be reached, did not answer in time, or broke the protocol."""

    code = "mcp-unavailable"
    retryable = True


class McpTimeout(McpUnavailable):
    """The server did not answer within the time limit."""

    code = "mcp-timeout"


@dataclass(frozen=True)
class McpTarget:
    """Where a server is: a streamable HTTP ``url`` (with an optional bearer ``token``) or a stdio
    ``command`` (argv) run as a child process."""

    transport: Transport
    url: str | None = None
    command: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.transport == "http" and not self.url:
            raise ValueError("an http MCP target needs a url")
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP target needs a command")

    @property
    def where(self) -> str:
        """For messages: the URL or the program, never the token."""
        return self.url if self.transport == "http" else self.command[0]  # type: ignore[return-value]


@dataclass(frozen=True)
class ToolDefinition:
    """A tool as the server lists it, every part that decides what it does."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any]
    title: str | None = None

    @property
    def read_only(self) -> bool:
        """Only a tool whose annotations say so is a read: a missing hint counts as a write."""
        return self.annotations.get("readOnlyHint") is True

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "annotations": self.annotations,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolDefinition:
        return cls(
            name=data["name"],
            description=data.get("description") or "",
            input_schema=dict(data.get("input_schema") or {}),
            output_schema=data.get("output_schema"),
            annotations=dict(data.get("annotations") or {}),
            title=data.get("title"),
        )


@dataclass(frozen=True)
class CallResult:
    """What a ``tools/call`` returned: its text parts joined, and whether the tool said it failed."""

    text: str
    is_error: bool


def _definition(tool: types.Tool) -> ToolDefinition:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return ToolDefinition(
        name=tool.name,
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {}),
        output_schema=dict(tool.output_schema) if tool.output_schema is not None else None,
        annotations=annotations,
        title=tool.title,
    )


def _result(result: types.CallToolResult) -> CallResult:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"({block.type} content left out)")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + " ... (cut)"
    return CallResult(text, bool(result.is_error))


class McpConnection:
    """A reusable connection to one server. ``timeout``: seconds one request (connecting
    included) may take. Safe to use from several tasks; :meth:`close` when done."""

    def __init__(self, target: McpTarget, *, timeout: float = 20.0, label: str = "mcp"):
        self.target = target
        self.timeout = timeout
        self.label = label
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.opened = 0  # how many times a session was opened (reuse and reconnects show here)

    def _server(self) -> Any:
        target = self.target
        if target.transport == "stdio":
            return StdioServerParameters(
                command=target.command[0], args=list(target.command[1:]), env=dict(target.env) or None
            )
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(self.timeout, read=300.0))
        return _OwnedHttp(streamable_http_client(target.url or "", http_client=http), http)

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        try:
            async with Client(self._server(), cache=None, read_timeout_seconds=self.timeout) as client:
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # the owner of the connection reports it to whoever waits
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpUnavailable("the session was stopped"))
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.info("mcp session ended: server=%s error=%s", self.label, type(exc).__name__)
        finally:
            if self._stop is stop:
                self._client = None

    async def _session(self) -> Client:
        async with self._lock:
            if self._client is not None and self._task is not None and not self._task.done():
                return self._client
            await self._drop()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Client] = loop.create_future()
            stop = asyncio.Event()
            self._stop = stop
            self._task = asyncio.create_task(self._hold(ready, stop), name=f"mcp-session:{self.label}")
            try:
                self._client = await asyncio.wait_for(asyncio.shield(ready), self.timeout)
            except TimeoutError:
                await self._drop()
                raise McpTimeout(
                    f"the {self.label} server did not finish connecting within {self.timeout:g} s"
                ) from None
            except asyncio.CancelledError:
                await self._drop()
                raise
            except Exception as exc:
                await self._drop()
                raise McpUnavailable(f"cannot connect to the {self.label} server ({_why(exc)})") from exc
            self.opened += 1
            return self._client

    async def _drop(self) -> None:
        task, stop = self._task, self._stop
        self._client, self._task, self._stop = None, None, None
        if task is None:
            return
        if stop is not None:
            stop.set()
        # A session that ends cleanly stops at once; one stuck on a dead server is cancelled.
        # ``asyncio.wait`` raises only when this task itself is cancelled.
        done, _ = await asyncio.wait([task], timeout=0.5)
        if not done:
            task.cancel()
            await asyncio.wait([task], timeout=2.0)

    async def _request(self, what: str, run: Any) -> Any:
        client = await self._session()
        try:
            return await asyncio.wait_for(run(client), self.timeout)
        except TimeoutError:
            async with self._lock:
                await self._drop()
            raise McpTimeout(f"the {self.label} server did not answer {what} within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            async with self._lock:
                await self._drop()
            raise McpUnavailable(f"the {self.label} server failed {what} ({_why(exc)})") from exc

    async def list_tools(self) -> list[ToolDefinition]:
        """Every tool the server offers now (all pages), never from a cache."""

        async def run(client: Client) -> list[ToolDefinition]:
            found: list[ToolDefinition] = []
            cursor: str | None = None
            for _ in range(50):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                found += [_definition(t) for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
            return found

        try:
            return await self._request("its tool list", run)
        except McpUnavailable as exc:
            # A listing changes nothing, so one that failed on a session the server forgot (it
            # restarted) is asked again on a new one; a timeout is not asked twice.
            if isinstance(exc, McpTimeout):
                raise
            return await self._request("its tool list", run)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallResult:
        async def run(client: Client) -> CallResult:
            return _result(await client.call_tool(name, arguments))

        return await self._request(f"the call to {name}", run)

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


def _why(exc: BaseException) -> str:
    """A short reason for a message: the innermost error's type and text, on one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _OwnedHttp:
    """The SDK's streamable HTTP transport, closing the HTTP client Pepper made for it."""

    def __init__(self, transport: Any, http: httpx2.AsyncClient):
        self._transport, self._http = transport, http

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        try:
            return await self._transport.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._transport.__aexit__(*exc)
        finally:
            await self._http.__aexit__(None, None, None)
