"""MCP servers a person connected (``connections`` rows of provider ``mcp``), the tools each one
listed, what the person approved (``mcp_tools``, migration 0120) and live writes waiting for the
person's yes (``mcp_confirmations``).

A tool's state follows from its row: ``approved`` (the listed fingerprint is the approved one),
``held`` (approved once, the definition changed since), ``waiting`` (never approved),
``rejected`` (this exact definition was rejected), ``gone`` (no longer listed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from core.errors import InvalidInput, NotFound
from core.store.queries import Queries

CONFIRMATION_MINUTES = 30


@dataclass(frozen=True)
class McpServer:
    id: UUID
    account_id: UUID
    name: str
    config: dict[str, Any]
    sealed: bytes | None
    created_at: datetime


@dataclass(frozen=True)
class McpToolRow:
    server: str
    connection_id: UUID
    name: str
    definition: dict[str, Any]
    fingerprint: str
    listed: bool
    approved: dict[str, Any] | None
    approved_fingerprint: str | None
    rejected_fingerprint: str | None
    safe_unattended: bool

    @property
    def state(self) -> str:
        if not self.listed:
            return "gone"
        if self.approved_fingerprint == self.fingerprint:
            return "approved"
        if self.rejected_fingerprint == self.fingerprint:
            return "rejected"
        if self.approved_fingerprint is not None:
            return "held"
        return "waiting"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _server(row: Any) -> McpServer:
    return McpServer(row["id"], row["account_id"], row["label"], _json(row["config"]), row["sealed"], row["created_at"])


_SERVER_COLUMNS = "id, account_id, label, config, sealed, created_at"


async def add_server(db: Queries, account_id: UUID, name: str, config: dict[str, Any], sealed: bytes | None) -> UUID:
    """Store a new server; ``InvalidInput`` when the account already has one of that name."""
    try:
        return await db.fetchval(
            "INSERT INTO connections (account_id, provider, label, config, sealed) VALUES ($1, 'mcp', $2, $3, $4)"
            " RETURNING id",
            account_id,
            name,
            json.dumps(config),
            sealed,
        )
    except asyncpg.UniqueViolationError:
        raise InvalidInput(f"an MCP server named {name!r} is already connected; nothing changed") from None


async def servers_of(db: Queries, account_id: UUID) -> list[McpServer]:
    rows = await db.fetch(
        f"SELECT {_SERVER_COLUMNS} FROM connections WHERE account_id = $1 AND provider = 'mcp' ORDER BY label",
        account_id,
    )
    return [_server(r) for r in rows]


async def server_named(db: Queries, account_id: UUID, name: str) -> McpServer:
    row = await db.fetchrow(
        f"SELECT {_SERVER_COLUMNS} FROM connections WHERE account_id = $1 AND provider = 'mcp' AND label = $2",
        account_id,
        name,
    )
    if row is None:
        raise NotFound(f"no MCP server named {name!r} is connected")
    return _server(row)


async def remove_server(db: Queries, server_id: UUID) -> None:
    """Forget the server, its token and every decision about its tools (the rows cascade)."""
    await db.execute("DELETE FROM connections WHERE id = $1 AND provider = 'mcp'", server_id)


_TOOL_COLUMNS = (
    "c.label AS server, t.connection_id, t.name, t.definition, t.fingerprint, t.listed, t.approved,"
    " t.approved_fingerprint, t.rejected_fingerprint, t.safe_unattended"
)


def _tool(row: Any) -> McpToolRow:
    return McpToolRow(
        row["server"],
        row["connection_id"],
        row["name"],
        _json(row["definition"]),
        row["fingerprint"],
        row["listed"],
        _json(row["approved"]),
        row["approved_fingerprint"],
        row["rejected_fingerprint"],
        row["safe_unattended"],
    )


async def _tools(db: Queries, where_order: str, arg: UUID) -> list[McpToolRow]:
    rows = await db.fetch(
        f"SELECT {_TOOL_COLUMNS} FROM mcp_tools t JOIN connections c ON c.id = t.connection_id {where_order}", arg
    )
    return [_tool(r) for r in rows]


async def tools_of(db: Queries, server_id: UUID) -> list[McpToolRow]:
    return await _tools(db, "WHERE t.connection_id = $1 ORDER BY t.name", server_id)


async def record_listing(db: Queries, server_id: UUID, listed: list[tuple[str, dict[str, Any], str]]) -> None:
    """What the server listed now: ``(name, definition, fingerprint)`` each. Approvals stay as they
    were (a changed definition is then held); tools it no longer lists are marked gone."""
    await db.execute(
        """
        WITH now_listed AS (
            SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(name text, definition jsonb, fingerprint text)
        ), upserted AS (
            INSERT INTO mcp_tools (connection_id, name, definition, fingerprint)
            SELECT $1, name, definition, fingerprint FROM now_listed
            ON CONFLICT (connection_id, name) DO UPDATE
                SET definition = excluded.definition, fingerprint = excluded.fingerprint, listed = true,
                    listed_at = now()
            RETURNING name
        )
        UPDATE mcp_tools SET listed = false
        WHERE connection_id = $1 AND listed AND name NOT IN (SELECT name FROM now_listed)
        """,
        server_id,
        json.dumps([{"name": n, "definition": d, "fingerprint": f} for n, d, f in listed]),
    )


async def decide(
    db: Queries, server_id: UUID, name: str, *, approve: bool, safe_unattended: bool = False
) -> McpToolRow:
    """Approve (or reject) the tool's definition as last listed; returns the row after."""
    if approve:
        sql = (
            "UPDATE mcp_tools SET approved = definition, approved_fingerprint = fingerprint,"
            " rejected_fingerprint = NULL, safe_unattended = $3, decided_at = now()"
            " WHERE connection_id = $1 AND name = $2 AND listed RETURNING name"
        )
        args: tuple[Any, ...] = (server_id, name, safe_unattended)
    else:
        sql = (
            "UPDATE mcp_tools SET rejected_fingerprint = fingerprint, approved = NULL, approved_fingerprint = NULL,"
            " safe_unattended = false, decided_at = now() WHERE connection_id = $1 AND name = $2 RETURNING name"
        )
        args = (server_id, name)
    if await db.fetchval(sql, *args) is None:
        raise NotFound(f"the server lists no tool named {name!r} (run pepper mcp tools to list again)")
    return next(t for t in await tools_of(db, server_id) if t.name == name)


async def account_tools(db: Queries, account_id: UUID) -> list[McpToolRow]:
    """Every tool of every MCP server of the account, by server then name."""
    return await _tools(db, "WHERE c.account_id = $1 AND c.provider = 'mcp' ORDER BY c.label, t.name", account_id)


async def pending_approvals(db: Queries, account_id: UUID) -> list[McpToolRow]:
    """The approvals queue: tools that wait for a first approval or are held after a change."""
    return [t for t in await account_tools(db, account_id) if t.state in ("waiting", "held")]


async def propose_call(db: Queries, conversation_id: UUID, call_key: str, turn_id: UUID) -> None:
    """Record a write waiting for the person's yes; the conversation's expired proposals go."""
    await db.execute(
        f"""
        WITH expired AS (
            DELETE FROM mcp_confirmations
            WHERE conversation_id = $1 AND call_key <> $2
                AND created_at <= now() - interval '{CONFIRMATION_MINUTES} minutes'
        )
        INSERT INTO mcp_confirmations (conversation_id, call_key, turn_id) VALUES ($1, $2, $3)
        ON CONFLICT (conversation_id, call_key) DO UPDATE SET turn_id = excluded.turn_id, created_at = now()
        """,
        conversation_id,
        call_key,
        turn_id,
    )


async def take_confirmed_call(db: Queries, conversation_id: UUID, call_key: str, turn_id: UUID) -> bool:
    """True (and the proposal used up) when this call was proposed in an earlier turn of the
    conversation within the last 30 minutes; a proposal from this same turn does not count."""
    found = await db.fetchval(
        "DELETE FROM mcp_confirmations WHERE conversation_id = $1 AND call_key = $2 AND turn_id <> $3"
        f" AND created_at > now() - interval '{CONFIRMATION_MINUTES} minutes' RETURNING 1",
        conversation_id,
        call_key,
        turn_id,
    )
    return found is not None
