"""The asyncpg pool Pepper shares between calls, messages and the scheduler.

``Database.open`` checks the server, makes sure pgvector is there, applies migrations and only
then opens the pool, whose connections have the ``vector`` type registered. Driver errors become
:class:`~core.errors.StoreError` subclasses whose messages name the problem, never the password.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pgvector.asyncpg import register_vector

from core.errors import DatabaseUnavailable, MissingPgvector, StoreError
from core.store.migrations import MIGRATION_LOCK_KEY, Migration, apply_migrations, shipped_versions

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT = 10.0
# How long a write that may wait (a call's records) is retried while the database is out of
# reach: a restart of Postgres, embedded or external, takes seconds.
RETRY_WITHIN = 120.0

# A select-list item that makes the transaction it runs in commit without waiting for the disk.
# Inside a single statement it covers that statement's own transaction in the same round trip,
# where ``SET LOCAL`` needs a transaction block and two more. Only for what a later durable commit
# flushes anyway (the write-ahead log is written in order) or what a crash may lose.
NO_FLUSH = "set_config('synchronous_commit', 'off', true)"


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced, for messages and logs."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DATABASE_URL>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# What a lost or refused connection raises, from the driver: the server went away (restart,
# shutdown, a network cut) or is not taking connections yet.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it came from) says the database could not be reached or dropped
    the connection: worth a retryable answer (503), not a 500. An ``OSError`` counts only when the
    driver raised it (a socket to Postgres), not any I/O of the request's own."""
    current: BaseException | None = exc
    for _ in range(6):  # a short chain: the driver's error, and what wrapped it
        if current is None:
            return False
        if isinstance(current, _CONNECTION_ERRORS):
            return True
        if isinstance(current, OSError) and _raised_in_driver(current):
            return True
        current = current.__cause__ or current.__context__
    return False


async def when_reachable(
    work: Callable[..., Awaitable[T]], *args: Any, what: str, within: float = RETRY_WITHIN, every: float = 0.5
) -> T:
    """Run ``work(*args)``; while it fails because the database cannot be reached (``unreachable``: a
    restart, a cut connection), run it again every ``every`` seconds, for up to ``within`` seconds,
    then raise the last error. Other errors are raised at once. For writes that can wait and are
    safe to repeat (a call's records, written off its audio path)."""
    deadline = asyncio.get_running_loop().time() + within
    warned = False
    while True:
        try:
            return await work(*args)
        except Exception as exc:
            if not unreachable(exc) or asyncio.get_running_loop().time() + every > deadline:
                raise
            if not warned:
                log.warning("the database is out of reach; %s is retried until it is back: %s", what, exc)
                warned = True
        await asyncio.sleep(every)


def _raised_in_driver(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if "/asyncpg/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


async def connect(dsn: str, *, connect_timeout: float = CONNECT_TIMEOUT) -> asyncpg.Connection:
    """One connection, with driver errors turned into clear ``StoreError``s."""
    where = redact_dsn(dsn)
    try:
        return await asyncpg.connect(dsn, timeout=connect_timeout)
    except asyncio.CancelledError:
        raise
    except asyncpg.InvalidCatalogNameError as exc:
        raise DatabaseUnavailable(f"database does not exist at {where}: {exc}", retryable=False) from exc
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as exc:
        raise DatabaseUnavailable(f"database refused the login at {where}: {exc}", retryable=False) from exc
    except (OSError, socket.gaierror, TimeoutError, asyncpg.CannotConnectNowError) as exc:
        raise DatabaseUnavailable(f"cannot reach the database at {where}: {exc}") from exc
    except (ValueError, asyncpg.ClientConfigurationError) as exc:
        raise DatabaseUnavailable(
            f"DATABASE_URL is not a valid Postgres URL ({where}): {exc}", retryable=False
        ) from exc
    except asyncpg.PostgresError as exc:
        raise DatabaseUnavailable(f"database at {where} refused the connection: {exc}") from exc


async def ensure_pgvector(conn: asyncpg.Connection, where: str) -> None:
    available = await conn.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")
    if not available:
        raise MissingPgvector(
            f"the Postgres server at {where} has no pgvector extension; install pgvector on it, "
            "or unset DATABASE_URL to use Pepper's embedded Postgres"
        )
    try:
        # Under the migrations' lock: two servers starting at once on an empty database would both
        # find it missing, and IF NOT EXISTS does not stop the second one's insert from failing on
        # the catalog's unique key (scripts/suite-two-servers found this).
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except asyncpg.PostgresError as exc:
        raise MissingPgvector(
            f"pgvector is installed on {where} but could not be enabled ({exc}); "
            "run CREATE EXTENSION vector as a superuser once"
        ) from exc


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


async def nice_local_backend(conn: asyncpg.Connection, nice: int, *, idle: bool = False) -> bool:
    """Run this connection's Postgres backend at CPU niceness ``nice`` or lower priority, if it is ours
    (``idle``: in the idle scheduling class too, where the system has it).

    A turn worker runs nicer than the web server so acknowledgements come first, but most of a
    turn's CPU is spent in the Postgres backends serving it, which would still compete at the
    server's priority. Only a backend on this machine (a Unix socket or loopback) that is a
    ``postgres`` process is touched: a pid from a remote server names nothing here.
    True when the backend now runs at least that nice.
    """
    if nice <= 0:
        return False
    pid = conn.get_server_pid()
    try:
        address = await conn.fetchval("SELECT host(inet_server_addr())")
        if address not in (None, "127.0.0.1", "::1"):
            return False
        return _renice_own_postgres(pid, nice, idle)
    except (OSError, asyncpg.PostgresError) as exc:  # not ours after all, or not allowed: leave it
        log.debug("left the priority of Postgres backend %s as it was: %s", pid, exc)
        return False


def _renice_own_postgres(pid: int, nice: int, idle: bool) -> bool:
    # /proc is in memory: this read does not block the loop. A backend of another user (the
    # embedded server runs as its own user when Pepper runs as root) is refused by the kernel
    # unless we may renice it.
    if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
        return False
    if os.getpriority(os.PRIO_PROCESS, pid) < nice:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    if idle:
        to_idle_class(pid)
    return True


def to_idle_class(pid: int) -> bool:
    """Put a process (0: this one) in the idle scheduling class, if the system has it: it runs
    only on a core nothing else wants. True when it is there."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    return True


class PoolConnection(asyncpg.Connection):  # type: ignore[misc]
    """A pool connection whose holder can promise to leave no session state behind.

    asyncpg resets every connection it takes back (``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL``): one round trip per lease, which on a text turn's four leases costs
    about as much as four of its statements. A holder that only runs statements and transactions
    (no LISTEN, session-level SET or advisory lock, cursor outside a transaction) calls
    :meth:`skip_reset`, and that one lease goes back without it. An open transaction is still
    rolled back, by asyncpg, whatever the holder promised.
    """

    __slots__ = ("_skip_reset",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip_reset = False

    def skip_reset(self) -> None:
        """This lease leaves no session state: release it without the reset query."""
        self._skip_reset = True


async def _reset_unless_skipped(conn: PoolConnection) -> None:
    """The main pool's reset: asyncpg's reset query, unless the holder promised it is not needed."""
    if conn._skip_reset:
        conn._skip_reset = False
        return
    query = conn.get_reset_query()
    if query:
        await conn.execute(query)


class Database:
    """An open pool on a migrated database."""

    def __init__(self, pool: asyncpg.Pool, dsn: str):
        self.pool = pool
        self.dsn = dsn

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        migrations: list[Migration] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        backend_nice: int = 0,
        backend_idle: bool = False,
    ) -> Database:
        """``backend_nice``: run the pool's Postgres backends that nice, when they are on this machine
        (``backend_idle``: in the idle scheduling class too)."""
        where = redact_dsn(dsn)
        conn = await connect(dsn)
        try:
            await ensure_pgvector(conn, where)
            await apply_migrations(conn, migrations)
        except asyncpg.PostgresError as exc:
            raise StoreError(f"migrating the database at {where} failed: {exc}") from exc
        finally:
            await conn.close()
        try:
            init = _init_connection
            if backend_nice > 0:

                async def init(conn: asyncpg.Connection) -> None:
                    # Niced first: looking the vector type up is a new backend's costliest query.
                    await nice_local_backend(conn, backend_nice, idle=backend_idle)
                    await _init_connection(conn)

            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, init=init, timeout=CONNECT_TIMEOUT,
                connection_class=PoolConnection, reset=_reset_unless_skipped,
            )  # fmt: skip
        except (OSError, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(f"cannot open a pool on {where}: {exc}") from exc
        return cls(pool, dsn)

    async def close(self) -> None:
        await self.pool.close()

    async def side_pool(self, *, max_size: int, settings: dict[str, str], min_size: int = 1) -> Database:
        """A second pool on the same (already migrated) database whose sessions carry ``settings``.

        It is for single statements and short transactions, never LISTEN, advisory locks, cursors
        or SET: a connection goes back to the pool without asyncpg's reset query, a round trip
        per use that on a hot path costs as much as the statement (an open transaction is still
        rolled back).
        """
        try:
            pool = await asyncpg.create_pool(
                self.dsn, min_size=min_size, max_size=max_size, init=_init_connection, timeout=CONNECT_TIMEOUT,
                server_settings=settings, reset=_keep_session, connection_class=PoolConnection,
            )  # fmt: skip
        except (OSError, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(f"cannot open a pool on {redact_dsn(self.dsn)}: {exc}") from exc
        return Database(pool, self.dsn)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self.pool.acquire() as conn, conn.transaction():
            yield conn

    async def execute(self, query: str, *args: Any) -> str:
        return await self.pool.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.pool.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self.pool.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.pool.fetchval(query, *args)

    async def health(self) -> dict[str, Any]:
        """What the health endpoint reports; raises ``DatabaseUnavailable`` when the store is down."""
        try:
            async with self.pool.acquire(timeout=2.0) as conn:
                applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        except asyncio.CancelledError:
            raise
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise DatabaseUnavailable(f"database check failed: {exc}") from exc
        pending = [v for v in shipped_versions() if v not in applied]
        return {"schema_version": max(applied, default=None), "pending_migrations": len(pending)}


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A side pool's reset: nothing beyond asyncpg's own rollback of an open transaction."""
