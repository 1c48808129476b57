"""One-time Media Stream tokens as stored (``call_stream_tokens``): only a digest of each."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from core.store.queries import Queries


async def record_token(db: Queries, digest: bytes, call_sid: str, ttl: timedelta) -> None:
    """Store the token's digest for ``call_sid``, expiring after ``ttl``; prune tokens long expired."""
    await db.execute(
        "INSERT INTO call_stream_tokens (token_hash, call_sid, expires_at) VALUES ($1, $2, now() + $3::interval)",
        digest,
        call_sid,
        ttl,
    )
    # Expired tokens are useless; prune them as new ones are issued.
    await db.execute("DELETE FROM call_stream_tokens WHERE expires_at < now() - interval '1 hour'")


async def burn_token(db: Queries, digest: bytes) -> Any:
    """Mark the token used: its ``call_sid``, whether it was ``reused`` and whether it had ``expired``;
    None for an unknown token."""
    return await db.fetchrow(
        """
        UPDATE call_stream_tokens t SET used_at = now()
        FROM (SELECT token_hash, used_at AS was_used FROM call_stream_tokens WHERE token_hash = $1 FOR UPDATE) old
        WHERE t.token_hash = old.token_hash
        RETURNING t.call_sid, old.was_used IS NOT NULL AS reused, t.expires_at < now() AS expired
        """,
        digest,
    )
