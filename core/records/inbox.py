"""The email inbox's records: webhook tokens already seen (replays), and where a reply is copied."""

from __future__ import annotations

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
