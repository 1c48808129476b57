"""Who may use the web chat and the API: the owner's password, browser sessions and API tokens.

Secrets handed to clients (session cookies, API tokens) are random 32-byte tokens; only their
SHA-256 is stored, so a database leak does not leak working credentials.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from core import identity
from core.errors import InvalidInput, NotFound
from core.identity import Executor

SESSION_LIFETIME = timedelta(days=14)
MIN_PASSWORD_LENGTH = 10
_hasher = PasswordHasher()
# Verified against when the login is unknown, so a wrong login costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True)
class WebSession:
    account_id: UUID
    csrf_token: str


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_hash(token: str) -> bytes:
    """What is stored for a secret handed out (a session cookie, an API token, an OAuth state), never the secret."""
    return _digest(token)


async def set_web_password(db: Executor, account_id: UUID, login: str, password: str) -> identity.Handle:
    """Give the account a web login (a verified ``web`` handle) with this password."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidInput(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    handle = await identity.find_handle(db, "web", login)
    if handle is None:
        handle = await identity.add_handle(db, account_id, "web", login, verified=True)
    elif handle.account_id != account_id:
        raise InvalidInput("that web login belongs to another account")
    await db.execute(
        """
        INSERT INTO web_credentials (handle_id, password_hash) VALUES ($1, $2)
        ON CONFLICT (handle_id) DO UPDATE SET password_hash = EXCLUDED.password_hash, updated_at = now()
        """,
        handle.id,
        _hasher.hash(password),
    )
    # A new password signs every browser out.
    await db.execute("DELETE FROM web_sessions WHERE account_id = $1", account_id)
    return handle


async def check_web_login(db: Executor, login: str, password: str) -> UUID | None:
    """The account for a correct login and password; None otherwise (in constant-ish time)."""
    row = None
    handle = await identity.find_handle(db, "web", login)
    if handle is not None and handle.verified:
        row = await db.fetchrow("SELECT password_hash FROM web_credentials WHERE handle_id = $1", handle.id)
    stored = row["password_hash"] if row else _DUMMY_HASH
    try:
        ok = _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        ok = False
    return handle.account_id if ok and row is not None and handle is not None else None


async def create_session(db: Executor, account_id: UUID) -> tuple[str, WebSession]:
    """A new browser session: (cookie token, session)."""
    token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    await db.execute(
        "INSERT INTO web_sessions (token_hash, account_id, csrf_token, expires_at) VALUES ($1, $2, $3, now() + $4)",
        _digest(token),
        account_id,
        csrf,
        SESSION_LIFETIME,
    )
    return token, WebSession(account_id, csrf)


async def session_for(db: Executor, token: str | None) -> WebSession | None:
    if not token:
        return None
    row = await db.fetchrow(
        "SELECT account_id, csrf_token FROM web_sessions WHERE token_hash = $1 AND expires_at > now()",
        _digest(token),
    )
    return WebSession(row["account_id"], row["csrf_token"]) if row else None


async def end_session(db: Executor, token: str | None) -> None:
    if token:
        await db.execute("DELETE FROM web_sessions WHERE token_hash = $1", _digest(token))


async def create_api_token(db: Executor, account_id: UUID, name: str) -> str:
    token = "pep_" + secrets.token_urlsafe(32)
    try:
        await db.execute(
            "INSERT INTO api_tokens (token_hash, account_id, name) VALUES ($1, $2, $3)",
            _digest(token),
            account_id,
            name,
        )
    except Exception as exc:  # a foreign-key violation: no such account
        raise NotFound(f"no account {account_id}") from exc
    return token


async def account_for_token(db: Executor, token: str | None) -> UUID | None:
    if not token:
        return None
    return await db.fetchval(
        "UPDATE api_tokens SET last_used_at = now() WHERE token_hash = $1 RETURNING account_id", _digest(token)
    )


async def revoke_api_tokens(db: Executor, account_id: UUID) -> int:
    status = await db.execute("DELETE FROM api_tokens WHERE account_id = $1", account_id)
    return int(status.split()[-1])
