"""Who may use the web chat and the API: the owner's password, browser sessions and API tokens.

Secrets handed to clients (session cookies, API tokens) are random 32-byte tokens; only their
SHA-256 is stored, so a database leak does not leak working credentials.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from argon2 import PasswordHasher

from core import identity
from core.errors import InvalidInput, NotFound
from core.store.queries import Queries

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


async def set_web_password(db: Queries, account_id: UUID, login: str, password: str) -> identity.Handle:
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
        await identity.argon2_hash(password),
    )
    # A new password signs every browser out.
    await db.execute("DELETE FROM web_sessions WHERE account_id = $1", account_id)
    return handle


async def check_web_login(db: Queries, login: str, password: str) -> UUID | None:
    """The account for a correct login and password; None otherwise (in constant-ish time).

    The argon2 check runs on the bounded argon2 threads (``identity.argon2_verify``), never on
    the event loop. Callers facing the network admit the attempt through a :class:`LoginThrottle`
    first.
    """
    row = None
    handle = await identity.find_handle(db, "web", login)
    if handle is not None and handle.verified:
        row = await db.fetchrow("SELECT password_hash FROM web_credentials WHERE handle_id = $1", handle.id)
    stored = row["password_hash"] if row else _DUMMY_HASH
    ok = await identity.argon2_verify(stored, password)
    return handle.account_id if ok and row is not None and handle is not None else None


class LoginThrottle:
    """Failed sign-ins per login and per address within a sliding window, and checks in flight.

    An attempt is admitted only while its login has fewer than ``per_login`` failures (attempts
    still being checked count as failures), its address fewer than ``per_address``, and fewer than
    ``max_pending`` checks wait in all; a refused attempt costs no argon2 check. A success takes
    its own attempt back; failures age out after ``window`` seconds. In memory, per process: the
    web server is the one process that signs people in.
    """

    MAX_KEYS = 10_000  # logins and addresses remembered; beyond this the idle ones are forgotten

    def __init__(
        self, *, per_login: int = 5, per_address: int = 20, window: float = 15 * 60, max_pending: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.per_login, self.per_address, self.window, self.max_pending = per_login, per_address, window, max_pending
        self.clock = clock
        self.pending = 0
        self._logins: dict[str, deque[float]] = {}
        self._addresses: dict[str, deque[float]] = {}

    def _recent(self, book: dict[str, deque[float]], key: str, limit: int, now: float) -> deque[float]:
        times = book.get(key)
        if times is None:
            if len(book) >= self.MAX_KEYS:
                for stale in [k for k, v in book.items() if not v or v[-1] <= now - self.window]:
                    del book[stale]
                if len(book) >= self.MAX_KEYS:  # all busy: forget the oldest key
                    del book[next(iter(book))]
            times = book[key] = deque(maxlen=limit)
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    @contextmanager
    def attempt(self, login: str, address: str) -> Iterator[LoginAttempt | None]:
        """``with throttle.attempt(login, address) as attempt``: None when refused; else mark
        ``attempt.succeeded()`` on a correct password (a failure is the default)."""
        now = self.clock()
        by_login = self._recent(self._logins, login.strip().lower()[:100], self.per_login, now)
        by_address = self._recent(self._addresses, address, self.per_address, now)
        if len(by_login) >= self.per_login or len(by_address) >= self.per_address or self.pending >= self.max_pending:
            yield None
            return
        by_login.append(now)
        by_address.append(now)
        self.pending += 1
        attempt = LoginAttempt()
        try:
            yield attempt
        finally:
            self.pending -= 1
            if attempt.ok:
                for times in (by_login, by_address):
                    if now in times:
                        times.remove(now)


@dataclass
class LoginAttempt:
    ok: bool = False

    def succeeded(self) -> None:
        self.ok = True


async def create_session(db: Queries, account_id: UUID) -> tuple[str, WebSession]:
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


async def session_for(db: Queries, token: str | None) -> WebSession | None:
    if not token:
        return None
    row = await db.fetchrow(
        "SELECT account_id, csrf_token FROM web_sessions WHERE token_hash = $1 AND expires_at > now()",
        _digest(token),
    )
    return WebSession(row["account_id"], row["csrf_token"]) if row else None


async def end_session(db: Queries, token: str | None) -> None:
    if token:
        await db.execute("DELETE FROM web_sessions WHERE token_hash = $1", _digest(token))


async def create_api_token(db: Queries, account_id: UUID, name: str) -> str:
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


async def account_for_token(db: Queries, token: str | None) -> UUID | None:
    if not token:
        return None
    return await db.fetchval(
        "UPDATE api_tokens SET last_used_at = now() WHERE token_hash = $1 RETURNING account_id", _digest(token)
    )


async def revoke_api_tokens(db: Queries, account_id: UUID) -> int:
    status = await db.execute("DELETE FROM api_tokens WHERE account_id = $1", account_id)
    return int(status.split()[-1])
