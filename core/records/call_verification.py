"""Failed proofs of who a caller is, and one-time codes sent (``call_verification_attempts``).

Each row is one ``kind`` of event (``voice.verification`` names them) for an account, the calling
number (``source``) and whether the carrier attested the call; what was tried is never stored.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from core.store.queries import Queries


async def lock_account(db: Queries, account_id: UUID) -> None:
    """Wait for the account's row until the transaction ends: calls on other processes count and
    record their attempts for one account one at a time."""
    await db.execute("SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE", account_id)


async def record_attempt(
    db: Queries, account_id: UUID, source: str | None, call_sid: str, kind: str, *, attested: bool
) -> int:
    """Record one event; its id."""
    return await db.fetchval(
        "INSERT INTO call_verification_attempts (account_id, source, call_sid, kind, attested)"
        " VALUES ($1, $2, $3, $4, $5) RETURNING id",
        account_id,
        source,
        call_sid,
        kind,
        attested,
    )


async def wrong_pins(
    db: Queries, account_id: UUID, source: str | None, *, attested: bool, window: float
) -> tuple[int, int]:
    """The wrong PINs of the last ``window`` seconds on the ``attested`` side: how many for the
    account, and how many from the calling number ``source``."""
    row = await db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE account_id = $1) AS for_account,
               count(*) FILTER (WHERE source = $2) AS from_source
        FROM call_verification_attempts
        WHERE kind = 'pin-wrong' AND created_at > now() - $3::interval AND (account_id = $1 OR source = $2)
          AND attested = $4
        """,
        account_id,
        source,
        timedelta(seconds=window),
        attested,
    )
    return row["for_account"], row["from_source"]


async def locked_within(db: Queries, account_id: UUID, *, attested: bool, window: float) -> bool:
    """Whether a lock of the account's PIN path (``pin-locked``) was recorded in the last ``window`` seconds."""
    return bool(
        await db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM call_verification_attempts WHERE account_id = $1 AND kind = 'pin-locked'"
            " AND attested = $3 AND created_at > now() - $2::interval)",
            account_id,
            timedelta(seconds=window),
            attested,
        )
    )


async def codes_sent_this_hour(db: Queries, account_id: UUID, *, attested: bool) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM call_verification_attempts WHERE account_id = $1 AND kind = 'code-sent'"
        " AND attested = $2 AND created_at > now() - interval '1 hour'",
        account_id,
        attested,
    )


async def forget_code_send(db: Queries, claim: int) -> None:
    """Take back a claimed code send (``record_attempt`` of ``code-sent``) whose text did not go."""
    await db.execute("DELETE FROM call_verification_attempts WHERE id = $1 AND kind = 'code-sent'", claim)


# Every count reads the last hour (``voice.verification``'s window, an hour by default): a month
# covers any window an owner would set, and the table stops growing with every wrong PIN.
RETENTION = timedelta(days=30)


async def prune_attempts(db: Queries, now: datetime, retention: timedelta = RETENTION) -> int:
    """Delete attempts older than ``retention``; how many went."""
    status = await db.execute("DELETE FROM call_verification_attempts WHERE created_at < $1", now - retention)
    return int(status.split()[-1])
