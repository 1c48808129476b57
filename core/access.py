"""Who may use the web chat and the API: the owner's password, browser sessions and API tokens.

Secrets handed to clients (session cookies, API tokens) are random 32-byte tokens; only their
SHA-256 is stored, so a database leak does not leak working credentials.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
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


@dataclass
class _Failures:
    """One login's or one address's failed sign-ins."""

    count: float = 0.0  # as of ``at`` (an address's fades, see LoginThrottle)
    at: float = 0.0  # the last attempt let through, or its failure: a wait counts from here
    pending: int = 0  # checks in flight, counted as failures


class LoginThrottle:
    """Exponential backoff on failed sign-ins, per login and per client address, and a bound on
    the checks in flight.

    The first ``per_login`` failures of a login (``per_address`` of an address) cost nothing;
    after that an attempt must wait ``base`` seconds after the last one, twice as long with every
    further failure, at most ``cap`` (1 s, 2 s, 4 s ... 15 minutes). Attempts still being checked
    count as failures, so guesses sent together do not slip through together, and at most
    ``max_pending`` checks wait in all. A refused attempt costs no argon2 check and changes
    nothing; its ``retry_after`` is the wait left, in whole seconds. A success clears its login's
    failures and takes its own attempt back from the address. An address forgets one failure every
    ``address_decay`` seconds (addresses are shared: a household, an office); a login forgets its
    failures ``forget_after`` seconds after the last one. In memory, per process: the web server
    is the one process that signs people in. At most ``MAX_KEYS`` logins and as many addresses are
    remembered: when full, those with nothing held against them go first, then the least recently
    seen.
    """

    MAX_KEYS = 10_000

    def __init__(
        self, *, per_login: int = 5, per_address: int = 20, base: float = 1.0, cap: float = 15 * 60,
        address_decay: float = 5 * 60, forget_after: float = 24 * 3600, max_pending: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.per_login, self.per_address, self.base, self.cap = per_login, per_address, base, cap
        self.address_decay, self.forget_after, self.max_pending = address_decay, forget_after, max_pending
        self.clock = clock
        self.pending = 0
        self._logins: dict[str, _Failures] = {}
        self._addresses: dict[str, _Failures] = {}

    def _failures(self, entry: _Failures, now: float, *, address: bool) -> float:
        """The entry's failures now, before any still being checked."""
        if address:
            return max(0.0, entry.count - (now - entry.at) / self.address_decay)
        return 0.0 if now - entry.at >= self.forget_after else entry.count

    def _wait(self, entry: _Failures, now: float, free: int, *, address: bool) -> float:
        failures = math.ceil(self._failures(entry, now, address=address)) + entry.pending
        if failures < free:
            return 0.0
        wait = min(self.cap, self.base * 2.0 ** min(failures - free, 64))
        return max(0.0, entry.at + wait - now)

    def _entry(self, book: dict[str, _Failures], key: str, now: float, *, address: bool) -> _Failures:
        entry = book.pop(key, None)
        if entry is None:
            if len(book) >= self.MAX_KEYS:
                for idle in [
                    k for k, e in book.items() if not e.pending and not self._failures(e, now, address=address)
                ]:
                    del book[idle]
                while len(book) >= self.MAX_KEYS:  # all held against: forget the least recently seen
                    del book[next(iter(book))]
            entry = _Failures(at=now)
        book[key] = entry  # the most recently seen last
        return entry

    def retry_after(self, login: str, address: str) -> float:
        """Seconds until an attempt for this login from this address would be let through (0: now)."""
        now = self.clock()
        by_login, by_address = self._logins.get(_login_key(login)), self._addresses.get(address)
        return max(
            self._wait(by_login, now, self.per_login, address=False) if by_login else 0.0,
            self._wait(by_address, now, self.per_address, address=True) if by_address else 0.0,
        )

    @contextmanager
    def attempt(self, login: str, address: str) -> Iterator[LoginAttempt]:
        """``with throttle.attempt(login, address) as attempt``: refused when ``attempt.retry_after``
        is set; else mark ``attempt.succeeded()`` on a correct password (a failure is the default)."""
        wait = self.retry_after(login, address)
        if wait > 0 or self.pending >= self.max_pending:
            yield LoginAttempt(retry_after=max(1, math.ceil(wait)))
            return
        now = self.clock()
        entries = (
            (self._entry(self._logins, _login_key(login), now, address=False), False),
            (self._entry(self._addresses, address, now, address=True), True),
        )
        for entry, is_address in entries:
            entry.count, entry.at = self._failures(entry, now, address=is_address), now
            entry.pending += 1
        self.pending += 1
        attempt = LoginAttempt()
        try:
            yield attempt
        finally:
            self.pending -= 1
            done = self.clock()
            for entry, is_address in entries:
                entry.pending -= 1
                if attempt.ok and not is_address:
                    entry.count = 0.0
                elif not attempt.ok:
                    entry.count, entry.at = self._failures(entry, done, address=is_address) + 1, done


def _login_key(login: str) -> str:
    return login.strip().lower()[:100]


@dataclass
class LoginAttempt:
    retry_after: int | None = None  # refused: seconds to wait
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
