"""What the web app's dashboard pages read: calls with their transcripts, and the figures its
plots draw (call response times, turns and tokens per day). Every read is within one account."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from core.store.queries import Queries


def _jsonb(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def calls_of(db: Queries, account_id: UUID, limit: int = 100) -> list[Any]:
    """The account's calls, newest first: owner calls and the answering service's."""
    return await db.fetch(
        """
        SELECT c.call_sid, c.route, c.status, c.caller, c.line_number, c.started_at, c.ended_at, c.end_reason,
               coalesce(a.summary, c.summary) AS summary, a.caller AS answering_caller,
               (SELECT count(*) FROM answering_messages m WHERE m.call_sid = c.call_sid) AS messages,
               (SELECT count(*) FROM answering_bookings b WHERE b.call_sid = c.call_sid) AS bookings
        FROM calls c LEFT JOIN answering_calls a ON a.call_sid = c.call_sid
        WHERE c.account_id = $1 OR a.account_id = $1
        ORDER BY c.started_at DESC LIMIT $2
        """,
        account_id,
        limit,
    )


async def call_detail(db: Queries, account_id: UUID, call_sid: str) -> dict[str, Any] | None:
    """One call of the account: its row, both sides of the transcript with the tool calls, its
    figures, and for an answering call the message taken and the bookings made."""
    call = await db.fetchrow(
        """
        SELECT c.*, a.transcript AS answering_transcript, a.summary AS answering_summary, a.line_type,
               a.caller_name_lookup
        FROM calls c LEFT JOIN answering_calls a ON a.call_sid = c.call_sid
        WHERE c.call_sid = $1 AND (c.account_id = $2 OR a.account_id = $2)
        """,
        call_sid,
        account_id,
    )
    if call is None:
        return None
    turn = None
    if call["turn_id"] is not None:
        turn = await db.fetchrow("SELECT rounds, tool_calls, timings, usage FROM turns WHERE id = $1", call["turn_id"])
    lines = _jsonb(turn["rounds"]) if turn is not None else []
    if not lines and call["answering_transcript"] is not None:
        lines = _jsonb(call["answering_transcript"])
    return {
        "call": call,
        "lines": [line for line in lines if isinstance(line, dict)],
        "tools": _jsonb(turn["tool_calls"]) if turn is not None else [],
        "stats": _jsonb(call["stats"]) or {},
        "message": await db.fetchrow("SELECT * FROM answering_messages WHERE call_sid = $1", call_sid),
        "bookings": await db.fetch("SELECT * FROM answering_bookings WHERE call_sid = $1 ORDER BY starts_at", call_sid),
    }


async def call_response_times(db: Queries, account_id: UUID, since: datetime) -> list[tuple[datetime, list[float]]]:
    """Per call since ``since``: when it started and its response times (ms from the caller
    stopping to Pepper's first audio), as the call engine recorded them."""
    rows = await db.fetch(
        "SELECT started_at, stats -> 'response_ms' AS ms FROM calls WHERE account_id = $1 AND started_at >= $2"
        " AND stats ? 'response_ms' ORDER BY started_at",
        account_id,
        since,
    )
    return [(r["started_at"], [float(v) for v in _jsonb(r["ms"]) or []]) for r in rows]


async def recent_call_latency(db: Queries, account_id: UUID, limit: int = 30) -> list[dict[str, Any]]:
    """The account's latest ``limit`` calls with timed replies, oldest first: ``call_sid``,
    ``model_ms`` and ``relay_ms`` (per reply, as the call engine recorded them)."""
    rows = await db.fetch(
        """
        SELECT c.call_sid, c.stats -> 'model_ms' AS model_ms, c.stats -> 'relay_ms' AS relay_ms
        FROM calls c LEFT JOIN answering_calls a ON a.call_sid = c.call_sid
        WHERE (c.account_id = $1 OR a.account_id = $1) AND jsonb_typeof(c.stats -> 'model_ms') = 'array'
          AND c.stats -> 'model_ms' <> '[]'::jsonb
        ORDER BY c.started_at DESC LIMIT $2
        """,
        account_id,
        limit,
    )
    return [{"call_sid": r["call_sid"], "model_ms": _jsonb(r["model_ms"]), "relay_ms": _jsonb(r["relay_ms"])}
            for r in reversed(rows)]  # fmt: skip


async def turns_per_day(db: Queries, account_id: UUID, since: datetime, timezone: str) -> list[Any]:
    """Turns and tokens (in, out) per local day since ``since``."""
    return await db.fetch(
        """
        SELECT (t.started_at AT TIME ZONE $3)::date AS day, count(*) AS turns,
               coalesce(sum((t.usage ->> 'input_tokens')::bigint), 0)::bigint AS input_tokens,
               coalesce(sum((t.usage ->> 'output_tokens')::bigint), 0)::bigint AS output_tokens
        FROM turns t JOIN conversations c ON c.id = t.conversation_id
        WHERE c.account_id = $1 AND t.started_at >= $2
        GROUP BY 1 ORDER BY 1
        """,
        account_id,
        since,
        timezone,
    )
