"""MCP servers built with the SDK, for tests and benchmarks: real wire protocol, scripted tools.

``async with LoopbackMcp(tools) as server:`` serves streamable HTTP on 127.0.0.1 at
``server.url``; a test changes ``server.tools`` (a list of :class:`LoopbackTool`) at any time and
the next ``tools/list`` shows the change. ``server.calls`` records every ``tools/call`` that
reached it (name, arguments); ``server.token`` set: requests without ``Bearer <token>`` get 401.

A tool's ``behaviour``: ``"echo"`` (the arguments back, as JSON), ``"text"`` (its ``reply``),
``"hang"`` (never answers), ``"crash"`` (the HTTP server stops mid-call; over stdio the process
exits). :func:`stdio_command` is the argv of the same server over stdio, as a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}


@dataclass
class LoopbackTool:
    name: str
    description: str = "A loopback tool."
    input_schema: dict[str, Any] = field(default_factory=lambda: dict(ANY_OBJECT))
    output_schema: dict[str, Any] | None = None
    read_only: bool | None = True
    destructive: bool | None = None
    behaviour: str = "echo"
    reply: str = ""

    def listed(self) -> types.Tool:
        hints: dict[str, Any] = {}
        if self.read_only is not None:
            hints["read_only_hint"] = self.read_only
        if self.destructive is not None:
            hints["destructive_hint"] = self.destructive
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=types.ToolAnnotations(**hints) if hints else None,
        )


def build_server(
    tools: list[LoopbackTool], calls: list[tuple[str, dict[str, Any]]], on_crash: Any = None
) -> Server[Any]:
    """A low-level SDK server whose listing and calls read ``tools`` as it is at that moment."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.listed() for t in tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        calls.append((params.name, arguments))
        tool = next((t for t in tools if t.name == params.name), None)
        if tool is None:
            return types.CallToolResult(content=[types.TextContent(text=f"no tool {params.name}")], is_error=True)
        if tool.behaviour == "hang":
            await asyncio.Event().wait()
        if tool.behaviour == "crash":
            if on_crash is None:
                os._exit(3)
            await on_crash()
            await asyncio.Event().wait()
        text = tool.reply if tool.behaviour == "text" else json.dumps(arguments, sort_keys=True)
        return types.CallToolResult(content=[types.TextContent(text=text)])

    return Server("pepper-loopback", on_list_tools=list_tools, on_call_tool=call_tool)


class LoopbackMcp:
    """The SDK's streamable HTTP server app on a free 127.0.0.1 port (uvicorn, in this event loop)."""

    def __init__(self, tools: list[LoopbackTool] | None = None, *, token: str | None = None):
        self.tools: list[LoopbackTool] = list(tools or [])
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.token = token
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        import uvicorn

        app: Any = build_server(self.tools, self.calls, on_crash=self._crash).streamable_http_app(host="127.0.0.1")
        if self.token is not None:
            app = _RequireBearer(app, self.token)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, log_level="critical", lifespan="on", timeout_graceful_shutdown=0)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="loopback-mcp")
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)

    async def _crash(self) -> None:
        """Stop answering at once, mid-call, as a server process that died."""
        self._stopping = asyncio.create_task(self.stop(), name="loopback-mcp-crash")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def restart(self) -> None:
        """Serve again on the same port (a server that came back)."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> LoopbackMcp:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


class _RequireBearer:
    def __init__(self, app: Any, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


def stdio_command(tools: list[LoopbackTool]) -> list[str]:
    """The argv that serves ``tools`` over stdio: this file run as a script (it needs only the SDK,
    so the child finds it whatever its environment)."""
    spec = json.dumps([t.__dict__ for t in tools])
    return [sys.executable, os.path.abspath(__file__), spec]


async def _serve_stdio(spec: str) -> None:
    from mcp.server.stdio import stdio_server

    tools = [LoopbackTool(**item) for item in json.loads(spec)]
    server = build_server(tools, [])
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    asyncio.run(_serve_stdio(sys.argv[1]))


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_TEXT = {"type": "string"}
_NUMBER = {"type": "number"}
_REPO = {"owner": _TEXT, "repo": _TEXT}


def github_tools() -> list[LoopbackTool]:
    """A subset of GitHub's MCP server (github/github-mcp-server): its tool names, input schemas
    and read-only hints, with canned answers. The two writes carry no read-only hint, as there."""

    def read(name: str, description: str, schema: dict[str, Any], reply: str) -> LoopbackTool:
        return LoopbackTool(name, description, schema, read_only=True, behaviour="text", reply=reply)

    return [
        read("get_me", "Get details of the authenticated GitHub user.", _schema({}, []), '{"login": "ada"}'),
        read(
            "list_notifications",
            "Lists all GitHub notifications for the authenticated user.",
            _schema({"filter": _TEXT, "owner": _TEXT, "repo": _TEXT, "perPage": _NUMBER}, []),
            '[{"repository": "acme/api", "subject": {"title": "CI failing on main", "type": "Issue"}, "unread": true}]',
        ),
        read(
            "search_pull_requests",
            "Search for pull requests in GitHub repositories using issues search syntax.",
            _schema({"query": _TEXT, "perPage": _NUMBER}, ["query"]),
            '{"total_count": 1, "items": [{"number": 42, "title": "Add retries", "repository": "acme/api",'
            ' "user": "bob", "created_at": "2025-05-28"}]}',
        ),
        read(
            "search_issues",
            "Search for issues in GitHub repositories using issues search syntax.",
            _schema({"query": _TEXT, "perPage": _NUMBER}, ["query"]),
            '{"total_count": 0, "items": []}',
        ),
        read(
            "list_pull_requests",
            "List pull requests in a GitHub repository.",
            _schema({**_REPO, "state": _TEXT}, ["owner", "repo"]),
            '[{"number": 42, "title": "Add retries", "updated_at": "2025-06-01"}]',
        ),
        read(
            "list_issues",
            "List issues in a GitHub repository.",
            _schema({**_REPO, "state": _TEXT}, ["owner", "repo"]),
            '[{"number": 7, "title": "Timeouts under load", "updated_at": "2025-04-02"}]',
        ),
        read(
            "pull_request_read",
            "Get information on a specific pull request in GitHub repository.",
            _schema({"method": _TEXT, **_REPO, "pullNumber": _NUMBER}, ["method", "owner", "repo", "pullNumber"]),
            '{"number": 42, "state": "open", "mergeable": true, "requested_reviewers": ["ada"]}',
        ),
        read(
            "issue_read",
            "Get information about a specific issue in a GitHub repository.",
            _schema({"method": _TEXT, **_REPO, "issue_number": _NUMBER}, ["method", "owner", "repo", "issue_number"]),
            '{"number": 7, "state": "open", "comments": 3}',
        ),
        LoopbackTool(
            "add_issue_comment",
            "Add a comment to a specific issue in a GitHub repository.",
            _schema({**_REPO, "issue_number": _NUMBER, "body": _TEXT}, ["owner", "repo", "issue_number", "body"]),
            read_only=None,
        ),
        LoopbackTool(
            "merge_pull_request",
            "Merge a pull request in a GitHub repository.",
            _schema({**_REPO, "pullNumber": _NUMBER, "merge_method": _TEXT}, ["owner", "repo", "pullNumber"]),
            read_only=False,
            destructive=True,
        ),
    ]


async def direct_sdk_call_times(url: str, tool: str, arguments: dict[str, Any], n: int) -> list[float]:
    """Milliseconds of each of ``n`` calls made with the SDK's own client on one session (what
    ``bench/mcp_calls.py`` compares Pepper's client with)."""
    import time

    from mcp.client import Client

    times: list[float] = []
    async with Client(url, cache=None) as client:
        await client.list_tools()
        for _ in range(n):
            started = time.perf_counter()
            await client.call_tool(tool, arguments)
            times.append((time.perf_counter() - started) * 1000)
    return times
