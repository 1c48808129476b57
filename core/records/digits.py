"""Keys Pepper pressed on calls it placed (``call_digits``, migration 0290; ``voice.digits``)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from core.store.queries import Queries


def _context(row: Any) -> list[dict[str, Any]]:
    value = row["context"]
    return value if isinstance(value, list) else json.loads(value or "[]")


async def request(db: Queries, call_sid: str, account_id: UUID, digits: str, context: list[dict[str, Any]]) -> bool:
    """Record keys to press once the call's stream closed; False when some already wait."""
    inserted = await db.fetchval(
        "INSERT INTO call_digits (call_sid, account_id, digits, context) VALUES ($1, $2, $3, $4::jsonb)"
        " ON CONFLICT (call_sid) WHERE status = 'pending' DO NOTHING RETURNING true",
        call_sid,
        account_id,
        digits,
        json.dumps(context),
    )
    return bool(inserted)


async def take_pending(db: Queries, call_sid: str, end_reason: str) -> Any:
    """The keys waiting for this call, now marked played, if its stream ended to press them (the
    call's ``end_reason``: a stream that ended for another reason, say the model failing, plays
    nothing); None otherwise (once only)."""
    return await db.fetchrow(
        "UPDATE call_digits d SET status = 'played', played_at = now() FROM calls c"
        " WHERE d.call_sid = $1 AND d.status = 'pending' AND c.call_sid = d.call_sid AND c.end_reason = $2"
        " RETURNING d.id, d.digits, d.requested_at, d.played_at",
        call_sid,
        end_reason,
    )


async def last_played(db: Queries, call_sid: str) -> tuple[str, list[dict[str, Any]]] | None:
    """(the keys last played on this call, the call's transcript until then), or None."""
    row = await db.fetchrow(
        "SELECT digits, context FROM call_digits WHERE call_sid = $1 AND status = 'played' ORDER BY id DESC LIMIT 1",
        call_sid,
    )
    return None if row is None else (row["digits"], _context(row))


async def for_call(db: Queries, call_sid: str) -> list[Any]:
    """Every press of a call, in order: digits, status, requested_at, played_at."""
    return await db.fetch(
        "SELECT digits, status, requested_at, played_at FROM call_digits WHERE call_sid = $1 ORDER BY id", call_sid
    )
