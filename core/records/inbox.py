"""The email inbox's records: webhook tokens already seen (replays), and where a reply is copied."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def claim_webhook_token(db: Queries, token: str, *, keep_seconds: int) -> bool:
    """Remember a webhook token; False when it was seen before (a replay). Prunes the ones older
    than ``keep_seconds``."""
    await db.execute("DELETE FROM email_webhook_tokens WHERE seen_at < now() - make_interval(secs => $1)", keep_seconds)
    claimed = await db.fetchval(
        "INSERT INTO email_webhook_tokens (token) VALUES ($1) ON CONFLICT DO NOTHING RETURNING true", token
    )
    return bool(claimed)


async def owner_address(db: Queries, account_id: UUID) -> str | None:
    """The account's own address for CC: its first verified email handle."""
    return await db.fetchval(
        "SELECT value FROM handles WHERE account_id = $1 AND kind = 'email' AND verified_at IS NOT NULL"
        " ORDER BY verified_at, created_at LIMIT 1",
        account_id,
    )


async def recent_inbound(db: Queries, account_id: UUID, since: Any, limit: int = 200) -> list[Any]:
    """Mail that arrived at Pepper's address from the person since ``since``, newest first: its
    id, when, and what the channel recorded (``meta``: sender, subject, text, attachments)."""
    return list(
        await db.fetch(
            """
            SELECT m.id, m.created_at, m.body, m.meta FROM messages m
            JOIN conversations c ON c.id = m.conversation_id
            WHERE c.account_id = $1 AND m.channel = 'email' AND m.direction = 'inbound' AND m.created_at >= $2
            ORDER BY m.created_at DESC LIMIT $3
            """,
            account_id,
            since,
            limit,
        )
    )
