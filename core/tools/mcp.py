"""Tools from MCP servers a person connected: approvals pinned to each tool's full definition.

A server is a connection (``pepper mcp add``); each tool it lists waits for the person's approval,
which stores a fingerprint of the whole definition (name, title, description, input and output
schema, annotations, whether it writes). Only approved, unchanged tools become Pepper
:class:`~core.tools.registry.Tool` values, and only for that person's turns, behind a tool set
(area ``github`` for the server named ``github``, else ``mcp:<name>``), so a worker skill runs
them and the orchestrator never lists them.

Before a tool's first call in a turn the server's listing is read again; a tool whose definition
changed since it was approved is held: the call fails with that reason and no ``tools/call``
reaches the server. A tool whose annotations do not say read-only counts as a write: refused in
scheduled runs (unless the person marked it safe), and in live turns run only when the same call
comes again in a later turn, after the person answered. Results reach the model as labelled
untrusted blocks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from core.adapters.mcp.client import McpConnection, McpTarget, McpUnavailable, ToolDefinition
from core.errors import InvalidInput
from core.records import mcp as records
from core.records.mcp import McpServer, McpToolRow
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import mcp_result_block

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 20.0
SERVER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
# What a model provider accepts as a tool name, less room for the server's prefix.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
MAX_DESCRIPTION = 1024
GITHUB = "github"
GITHUB_TOKEN_ENV = "GITHUB_PERSONAL_ACCESS_TOKEN"


def fingerprint(definition: ToolDefinition) -> str:
    """SHA-256 over the canonical JSON of everything that decides what the tool does."""
    data = {**definition.as_dict(), "writes": not definition.read_only}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def area_of(server: str) -> str:
    return GITHUB if server == GITHUB else f"mcp:{server}"


def connection_name(server: str) -> str:
    return f"mcp:{server}"


def pepper_name(server: str, tool: str) -> str:
    return f"{server.replace('-', '_')}__{tool}"


def unusable(definition: ToolDefinition) -> str | None:
    """Why a listed tool can never be offered, whatever the person decides, or None."""
    if not TOOL_NAME.fullmatch(definition.name):
        return "its name has characters a tool name may not have"
    if definition.input_schema.get("type") != "object":
        return "its input schema is not a JSON object schema"
    return None


def target_of(server: McpServer, connectors: Connectors | None) -> McpTarget:
    token = None
    if server.sealed is not None:
        if connectors is None:
            raise InvalidInput("no key to open the server's token with")
        token = connectors.require_vault().unseal(server.sealed).get("token")
    config = server.config
    if config.get("transport") == "stdio":
        # A local server reads its token from the environment (GitHub's binary from its own name).
        env = () if token is None else ((GITHUB_TOKEN_ENV if server.name == GITHUB else "MCP_TOKEN", token),)
        return McpTarget("stdio", command=tuple(config["command"]), env=env)
    return McpTarget("http", url=config["url"], token=token)


class McpHub:
    """The process's MCP sessions, one per connected server, reused by every turn; and the
    listing each turn read (a tool's definition is checked against it before the call)."""

    def __init__(self, connectors: Connectors | None = None, *, timeout: float = DEFAULT_TIMEOUT):
        self.connectors = connectors
        self.timeout = timeout
        self._open: dict[UUID, tuple[McpTarget, McpConnection]] = {}
        self._listings: OrderedDict[tuple[UUID, Any], dict[str, str]] = OrderedDict()
        self._locks: dict[UUID, asyncio.Lock] = {}
        self._retired: list[McpConnection] = []

    def connection(self, server: McpServer) -> McpConnection:
        target = target_of(server, self.connectors)
        held = self._open.get(server.id)
        if held is not None and held[0] == target:
            return held[1]
        if held is not None:  # the token or address changed: the old session closes with the hub
            self._retired.append(held[1])
        conn = McpConnection(target, timeout=self.timeout, label=server.name)
        self._open[server.id] = (target, conn)
        return conn

    async def refresh(self, db: Queries, server: McpServer) -> list[McpToolRow]:
        """List the server's tools now, record them (changed ones are then held), and return the rows."""
        listed = await self.connection(server).list_tools()
        await records.record_listing(db, server.id, _unique((d.name, d.as_dict(), fingerprint(d)) for d in listed))
        return await records.tools_of(db, server.id)

    async def current(self, db: Queries, server: McpServer, turn: Any) -> dict[str, str]:
        """Each listed tool's fingerprint, read from the server once per turn."""
        if turn is None:  # outside a turn nothing may be remembered
            return {t.name: t.fingerprint for t in await self.refresh(db, server) if t.listed}
        key = (server.id, turn)
        found = self._listings.get(key)
        if found is not None:
            return found
        lock = self._locks.setdefault(server.id, asyncio.Lock())
        async with lock:
            found = self._listings.get(key)
            if found is None:
                found = {t.name: t.fingerprint for t in await self.refresh(db, server) if t.listed}
                self._listings[key] = found
                while len(self._listings) > 1000:
                    self._listings.popitem(last=False)
        return found

    async def close(self) -> None:
        held, self._open = self._open, {}
        retired, self._retired = self._retired, []
        for conn in [*(c for _, c in held.values()), *retired]:
            await conn.close()


def call_key(name: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps({"tool": name, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_tool(hub: McpHub, server: McpServer, row: McpToolRow) -> Tool | None:
    """The Pepper tool for an approved row (its approved definition, never a newer one), or None
    when the definition cannot be offered."""
    assert row.approved is not None and row.approved_fingerprint is not None
    definition = ToolDefinition.from_dict(row.approved)
    if unusable(definition) is not None:
        return None
    name = pepper_name(server.name, definition.name)
    approved_fingerprint = row.approved_fingerprint
    acts = not definition.read_only and not row.safe_unattended
    description = f"({server.name}) {definition.description}".strip()[:MAX_DESCRIPTION]

    async def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        session = ctx.session
        if not definition.read_only and session.kind != "scheduled" and not row.safe_unattended:
            if session.conversation_id is None or session.turn_id is None:
                return ToolOutcome.failed(f"{name} changes things and runs only in a conversation")
            key = call_key(name, args)
            if not await records.take_confirmed_call(ctx.db, session.conversation_id, key, session.turn_id):
                await records.propose_call(ctx.db, session.conversation_id, key, session.turn_id)
                return ToolOutcome.ok(
                    f"Not done yet: {definition.name} on {server.name} changes something, so it needs the person's "
                    "yes. Tell them exactly what it will do (with these arguments) and ask. If they agree in their "
                    "next message, make the same call again with the same arguments."
                )
        try:
            listed = await hub.current(ctx.db, server, session.turn_id)
        except McpUnavailable as exc:
            return ToolOutcome.failed(exc.message)
        now = listed.get(definition.name)
        if now is None:
            return ToolOutcome.failed(f"the {server.name} server no longer offers {definition.name}")
        if now != approved_fingerprint:
            log.warning("mcp tool held: its definition changed since approval: server=%s", server.name)
            return ToolOutcome.failed(
                f"{definition.name} on {server.name} is held: the server changed its definition since the person "
                "approved it, so Pepper did not call it. The person can review the change with pepper mcp tools"
            )
        try:
            result = await hub.connection(server).call_tool(definition.name, args)
        except McpUnavailable as exc:
            return ToolOutcome.failed(exc.message)
        block = mcp_result_block(server.name, definition.name, result.text)
        if result.is_error:
            return ToolOutcome.failed(f"{definition.name} reported an error:\n{block}")
        if not result.text.strip():
            return ToolOutcome.empty(f"{definition.name} on {server.name} returned nothing")
        return ToolOutcome.ok(block)

    return Tool(
        name=name,
        description=description,
        parameters=definition.input_schema,
        handler=handler,
        area=area_of(server.name),
        needs_connection=connection_name(server.name),
        acts=acts,
    )


async def account_tools(db: Queries, hub: McpHub, account_id: UUID) -> list[Tool]:
    """The person's approved MCP tools whose last listing still matches the approval."""
    servers = {s.id: s for s in await records.servers_of(db, account_id)}
    if not servers:
        return []
    tools: list[Tool] = []
    for row in await records.account_tools(db, account_id):
        if row.state != "approved" or row.connection_id not in servers:
            continue
        tool = build_tool(hub, servers[row.connection_id], row)
        if tool is not None:
            tools.append(tool)
    return tools


def server_toolsets(names: Iterable[str]) -> list[tuple[str, str]]:
    """``(tool set name, area)`` for each server other than GitHub's, whose set already exists."""
    return [(n, area_of(n)) for n in names if n != GITHUB]


def definition_diff(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed between an approved definition and the listed one, one line per part."""
    if before is None:
        return []
    lines: list[str] = []
    for key in ("title", "description", "input_schema", "output_schema", "annotations", "listed_twice"):
        old, new = before.get(key), after.get(key)
        if old != new:
            lines.append(f"{key}: {json.dumps(old, sort_keys=True)} -> {json.dumps(new, sort_keys=True)}")
    return lines


GITHUB_MCP_URL = "https://api.githubcopilot.com/mcp/"
GITHUB_BINARY = "github-mcp-server"  # GitHub's local server (github/github-mcp-server), run as ``... stdio``
# Tool set names a server may not take: they already mean a feature area (GitHub's server is the
# exception, it fills the ``github`` set).
RESERVED = frozenset(
    {"clock", "notes", "todos", "dossier", "contacts", "reminders", "tasks", "memory", "answering", "calendar"}
    | {"email", "feeds", "following", "web", "scheduler", "search"}
)


def parse_target(text: str | None, name: str, *, local: bool = False) -> dict[str, Any]:
    """The stored ``config`` of a server from what the person typed: an http(s) URL, or a command
    line run over stdio. GitHub's server needs no address: its remote server, or with ``local``
    its binary found on the PATH."""
    import shlex
    import shutil
    from urllib.parse import urlsplit

    if local:
        if name != GITHUB or text:
            raise InvalidInput("--local is for GitHub's server (pepper mcp add ACCOUNT github --local)")
        binary = shutil.which(GITHUB_BINARY)
        if binary is None:
            raise InvalidInput(f"{GITHUB_BINARY} is not on the PATH; leave out --local to use GitHub's remote server")
        return {"transport": "stdio", "command": [binary, "stdio"]}
    if not text:
        if name == GITHUB:
            return {"transport": "http", "url": GITHUB_MCP_URL}
        raise InvalidInput("give the server's URL or the command that runs it")
    text = text.strip()
    if text.startswith(("http://", "https://")):
        parts = urlsplit(text)
        if not parts.hostname:
            raise InvalidInput("the URL has no host")
        return {"transport": "http", "url": text}
    if "://" in text:
        raise InvalidInput("an MCP server is an http(s) URL or a command to run")
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise InvalidInput(f"cannot read the command: {exc}") from None
    if not argv:
        raise InvalidInput("the command is empty")
    return {"transport": "stdio", "command": argv}


def check_name(name: str) -> str:
    if not SERVER_NAME.fullmatch(name):
        raise InvalidInput("a server's name is lower-case letters, digits and '-', starting with a letter (at most 24)")
    if name in RESERVED:
        raise InvalidInput(f"{name!r} is the name of a tool set of Pepper's own; choose another name")
    return name


async def connect_server(
    db: Queries,
    hub: McpHub,
    account_id: UUID,
    name: str,
    target: str | None,
    token: str | None,
    *,
    local: bool = False,
) -> tuple[McpServer, list[McpToolRow]]:
    """Check that the server answers and lists tools, then store it (its token sealed) with what it
    listed, every tool waiting for approval. Nothing is stored when it does not answer."""
    from datetime import UTC, datetime

    check_name(name)
    config = parse_target(target, name, local=local)
    if any(s.name == name for s in await records.servers_of(db, account_id)):
        raise InvalidInput(f"an MCP server named {name!r} is already connected; nothing changed")
    sealed = hub.connectors.require_vault().seal({"token": token}) if token and hub.connectors else None
    if token and sealed is None:
        raise InvalidInput("no key to seal the token with")
    probe = McpServer(UUID(int=0), account_id, name, config, sealed, datetime.now(UTC))
    conn = McpConnection(target_of(probe, hub.connectors), timeout=hub.timeout, label=name)
    try:
        listed = await conn.list_tools()
    except McpUnavailable as exc:
        raise InvalidInput(f"{exc.message}; nothing was saved") from None
    finally:
        await conn.close()
    server_id = await records.add_server(db, account_id, name, config, sealed)
    server = await records.server_named(db, account_id, name)
    assert server.id == server_id
    rows = _unique((d.name, d.as_dict(), fingerprint(d)) for d in listed)
    await records.record_listing(db, server_id, rows)
    return server, await records.tools_of(db, server_id)


def _unique(rows: Iterable[tuple[str, dict[str, Any], str]]) -> list[tuple[str, dict[str, Any], str]]:
    """One row per name. A name listed twice with different definitions cannot be told apart (the
    server picks which one a call runs): its row shows the first, marked, with a fingerprint of
    both, which matches no approval of either, so it is held or waits."""
    seen: dict[str, tuple[str, dict[str, Any], str]] = {}
    for name, definition, print_ in rows:
        if name not in seen:
            seen[name] = (name, definition, print_)
            continue
        first = seen[name]
        if print_ != first[2]:
            both = hashlib.sha256(f"{first[2]}:{print_}".encode()).hexdigest()
            seen[name] = (name, {**first[1], "listed_twice": True}, both)
    return list(seen.values())
