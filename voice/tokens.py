"""One-time Media Stream tokens: issued with the TwiML, checked once on the media socket.

Only a SHA-256 of each token is stored. A token is bound to one ``CallSid``, expires quickly, and
is burnt by its first use, even a failed one (a token presented for another call has leaked).
Kept in Postgres so any process behind the load balancer can accept the stream.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from core.records import call_tokens
from core.store.queries import Queries

TokenProblem = Literal["unknown", "reused", "expired", "foreign"]


@dataclass(frozen=True)
class TokenCheck:
    ok: bool
    problem: TokenProblem | None = None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def issue_token(db: Queries, call_sid: str, ttl: timedelta) -> str:
    token = secrets.token_urlsafe(32)
    await call_tokens.record_token(db, _digest(token), call_sid, ttl)
    return token


async def consume_token(db: Queries, token: str | None, call_sid: str) -> TokenCheck:
    """Burn the token and say whether it admits this call."""
    if not token:
        return TokenCheck(False, "unknown")
    row = await call_tokens.burn_token(db, _digest(token))
    if row is None:
        return TokenCheck(False, "unknown")
    if row["reused"]:
        return TokenCheck(False, "reused")
    if row["expired"]:
        return TokenCheck(False, "expired")
    if not secrets.compare_digest(row["call_sid"], call_sid):
        return TokenCheck(False, "foreign")
    return TokenCheck(True)
