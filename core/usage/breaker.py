"""A circuit breaker on runaway loops: a conversation's turns, or a scheduled task's runs, that hit
the round cap or fail ``usage.breaker_failures`` times in a row within an hour pause it.

A paused conversation answers with :data:`PAUSED_REPLY` and calls no model; a paused task's runs
are recorded as missed. The owner is told once, when it trips. The pause ends after
:data:`PAUSE_FOR`, or at once with ``pepper breaker reset``. A turn that ends well clears the
strikes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from core.store.queries import Queries

WINDOW = timedelta(hours=1)
PAUSE_FOR = timedelta(hours=1)
# Turn statuses that count as a strike: the round cap, and the failures.
STRIKES = frozenset({"capped", "model-error", "empty", "harness-error"})
PAUSED_REPLY = (
    "I've paused this conversation for a while: my last answers kept failing or running too long. "
    "Please try again in an hour."
)


# A scalar SQL expression over the account id ``$1``: when the person's conversation was paused
# (NULL: no breaker row, or not paused), read on the statement that opens a turn.
BREAKER_SELECT = (
    "(SELECT coalesce(paused_at, 'epoch'::timestamptz) FROM breakers WHERE key = 'conversation:' || $1::text)"
)


def conversation_key_for(account_id: UUID) -> str:
    """The breaker of the person's one conversation."""
    return f"conversation:{account_id}"


def tripped_notice(what: str, strikes: int) -> str:
    return (
        f"Pepper paused {what}: {strikes} turns in a row within an hour ran out of rounds or failed. "
        f"It resumes in an hour, or at once with `pepper breaker reset`."
    )


@dataclass(frozen=True)
class Breaker:
    key: str
    account_id: UUID
    strikes: int
    paused_at: datetime | None
    reason: str | None


async def paused(db: Queries, key: str, now: datetime) -> bool:
    """True while ``key`` is paused."""
    at = await db.fetchval("SELECT paused_at FROM breakers WHERE key = $1", key)
    return at is not None and now - at < PAUSE_FOR


async def record(db: Queries, key: str, account_id: UUID, status: str, now: datetime, limit: int) -> bool:
    """Count one turn's ``status`` for ``key``; True when this turn trips the breaker."""
    if limit <= 0:
        return False
    if status not in STRIKES:
        await db.execute(
            "DELETE FROM breakers WHERE key = $1"
            " AND (paused_at IS NULL OR paused_at <= $2::timestamptz - $3::interval)",
            key,
            now,
            PAUSE_FOR,
        )
        return False
    row = await db.fetchrow(
        """
        INSERT INTO breakers AS b (key, account_id, strikes, first_at, reason) VALUES ($1, $2, 1, $3, $4)
        ON CONFLICT (key) DO UPDATE SET
            strikes = CASE WHEN b.first_at > $3::timestamptz - $5::interval AND b.paused_at IS NULL
                           THEN b.strikes + 1 ELSE 1 END,
            first_at = CASE WHEN b.first_at > $3::timestamptz - $5::interval AND b.paused_at IS NULL
                            THEN b.first_at ELSE $3 END,
            paused_at = NULL, reason = $4
        RETURNING strikes
        """,
        key,
        account_id,
        now,
        status,
        WINDOW,
    )
    if row["strikes"] < limit:
        return False
    await db.execute("UPDATE breakers SET paused_at = $2 WHERE key = $1", key, now)
    return True


async def list_breakers(db: Queries) -> list[Breaker]:
    rows = await db.fetch("SELECT key, account_id, strikes, paused_at, reason FROM breakers ORDER BY key")
    return [Breaker(r["key"], r["account_id"], r["strikes"], r["paused_at"], r["reason"]) for r in rows]


async def reset(db: Queries, key: str | None = None) -> int:
    """Clear ``key``'s breaker (None: every one); returns how many were cleared."""
    status = await db.execute("DELETE FROM breakers WHERE $1::text IS NULL OR key = $1", key)
    return int(status.split()[-1])
