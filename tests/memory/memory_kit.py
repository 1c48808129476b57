"""Helpers for memory tests: messages, turns and summaries at chosen times."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

# Wednesday 4 June 2025, mid-afternoon in Paris.
NOW = datetime(2025, 6, 4, 13, 0, tzinfo=UTC)


async def conversation(db: Any, account_id: UUID) -> UUID:
    return await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account_id)


async def say(
    db: Any, account_id: UUID, at: datetime, body: str, *, channel: str = "sms", inbound: bool = True,
    turn_id: UUID | None = None,
) -> int:  # fmt: skip
    """Record a message at a chosen time; returns its id."""
    return await db.fetchval(
        "INSERT INTO messages (conversation_id, channel, direction, body, created_at, turn_id)"
        " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        await conversation(db, account_id),
        channel,
        "inbound" if inbound else "outbound",
        body,
        at,
        turn_id,
    )


async def turn(db: Any, account_id: UUID, at: datetime, *, kind: str = "live", calls: list[dict] | None = None,
               reply: str | None = None, channel: str = "sms") -> UUID:  # fmt: skip
    return await db.fetchval(
        "INSERT INTO turns (conversation_id, channel, kind, started_at, tool_calls, reply, status)"
        " VALUES ($1, $2, $3, $4, $5::jsonb, $6, 'delivered') RETURNING id",
        await conversation(db, account_id),
        channel,
        kind,
        at,
        json.dumps(calls or []),
        reply,
    )


async def summary(db: Any, account_id: UUID, period: str, starts_on: date, body: str) -> int:
    from core.memory.periods import period_end, span

    tz = await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id)
    start, until = span(period, starts_on, tz)  # type: ignore[arg-type]
    return await db.fetchval(
        "INSERT INTO memory_summaries (account_id, period, starts_on, ends_on, covers_from, covers_until, body,"
        " messages, turns) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, 0) RETURNING id",
        account_id,
        period,
        starts_on,
        date.fromordinal(period_end(period, starts_on).toordinal() - 1),  # type: ignore[arg-type]
        start,
        until,
        body,
    )


def sent_text(received: Any) -> str:
    """Everything a request to the peer carried, as one string."""
    return json.dumps(received.body, ensure_ascii=False)
