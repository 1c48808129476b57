"""Folders lent for a ``pepper chat --folder`` session (``lent_folders``, migration 0121) and the
calls to their tools, which the CLI answers (``lent_folder_calls``).

Every function that takes a folder id also takes the account: a folder or call of another
account is as unknown as one that never existed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal
from uuid import UUID

from core.store.queries import Queries

# A lending lapses when the CLI has not asked for calls for this long (it asks every second).
LAPSE_SECONDS = 60


def _active(table: str = "") -> str:
    prefix = f"{table}." if table else ""
    return f"{prefix}ended_at IS NULL AND {prefix}seen_at > now() - interval '{LAPSE_SECONDS} seconds'"


_ACTIVE = _active()


async def lend(db: Queries, account_id: UUID, tools: list[dict[str, Any]]) -> UUID:
    return await db.fetchval(
        "INSERT INTO lent_folders (account_id, tools) VALUES ($1, $2) RETURNING id", account_id, json.dumps(tools)
    )


async def end(db: Queries, account_id: UUID, folder_id: UUID) -> bool:
    found = await db.fetchval(
        "UPDATE lent_folders SET ended_at = now() WHERE id = $1 AND account_id = $2 AND ended_at IS NULL RETURNING 1",
        folder_id,
        account_id,
    )
    return found is not None


async def is_active(db: Queries, account_id: UUID, folder_id: UUID) -> bool:
    return bool(
        await db.fetchval(
            f"SELECT EXISTS (SELECT FROM lent_folders WHERE id = $1 AND account_id = $2 AND {_ACTIVE})",
            folder_id,
            account_id,
        )
    )


async def active_for(
    db: Queries, account_id: UUID, message_ids: Sequence[int]
) -> tuple[UUID, list[dict[str, Any]]] | None:
    """The lending the turn's messages name (``meta.folder_id``, set by the session that lends it)
    if it has not lapsed: its id and declared tools. A message of any other chat names none."""
    if not message_ids:
        return None
    row = await db.fetchrow(
        f"""
        SELECT f.id, f.tools FROM lent_folders f
        JOIN messages m ON m.meta ->> 'folder_id' = f.id::text
        WHERE m.id = ANY($2::bigint[]) AND f.account_id = $1 AND {_active("f")}
        ORDER BY m.id DESC LIMIT 1
        """,
        account_id,
        list(message_ids),
    )
    if row is None:
        return None
    tools = row["tools"]
    return row["id"], json.loads(tools) if isinstance(tools, str) else tools


async def waiting_calls(db: Queries, account_id: UUID, folder_id: UUID) -> list[dict[str, Any]] | None:
    """The calls the CLI has not answered yet (and the lending is kept alive); None: no such
    active lending of this account."""
    alive = await db.fetchval(
        f"UPDATE lent_folders SET seen_at = now() WHERE id = $1 AND account_id = $2 AND {_ACTIVE} RETURNING 1",
        folder_id,
        account_id,
    )
    if alive is None:
        return None
    rows = await db.fetch(
        "SELECT id, name, arguments FROM lent_folder_calls WHERE folder_id = $1 AND answered_at IS NULL"
        " ORDER BY created_at",
        folder_id,
    )
    return [{"id": str(r["id"]), "name": r["name"], "arguments": _json(r["arguments"])} for r in rows]


async def add_call(db: Queries, folder_id: UUID, name: str, arguments: dict[str, Any]) -> UUID:
    return await db.fetchval(
        "INSERT INTO lent_folder_calls (folder_id, name, arguments) VALUES ($1, $2, $3) RETURNING id",
        folder_id,
        name,
        json.dumps(arguments),
    )


async def answer(
    db: Queries, account_id: UUID, folder_id: UUID, call_id: UUID, result: str, is_error: bool
) -> Literal["answered", "duplicate", "unknown"]:
    row = await db.fetchrow(
        "SELECT c.answered_at FROM lent_folder_calls c JOIN lent_folders f ON f.id = c.folder_id"
        " WHERE c.id = $1 AND c.folder_id = $2 AND f.account_id = $3",
        call_id,
        folder_id,
        account_id,
    )
    if row is None:
        return "unknown"
    done = await db.fetchval(
        "UPDATE lent_folder_calls SET result = $2, is_error = $3, answered_at = now()"
        " WHERE id = $1 AND answered_at IS NULL RETURNING 1",
        call_id,
        result,
        is_error,
    )
    return "answered" if done is not None else "duplicate"


async def result_of(db: Queries, call_id: UUID) -> tuple[str, bool] | None:
    row = await db.fetchrow(
        "SELECT result, is_error FROM lent_folder_calls WHERE id = $1 AND answered_at IS NOT NULL", call_id
    )
    return None if row is None else (row["result"], row["is_error"])


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
