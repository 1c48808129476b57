"""Postgres sessions: connections of their own that LISTEN on a channel, the sessions the server
has, and how many it allows.

A :class:`Listener` is for announcements (``pg_notify``) only: a process keeps one per channel,
outside any pool, and its backend pid names the process to the others (``calls.held_by``).
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from core.errors import DatabaseUnavailable
from core.store.queries import Queries

# What a statement raises when the database cannot be reached or refuses it; a loop that must go on
# through an outage (a turn worker's) catches these and tries again.
# (InterfaceError: a connection the server closed, or one left mid-protocol when it went away.)
DRIVER_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    DatabaseUnavailable,
)

# How many connections an ordinary role may open: superuser-reserved slots (and PG 16's
# reserved_connections) are not counted, so a budget held to it holds whichever role connects.
CONNECTION_LIMIT_SQL = """
SELECT current_setting('max_connections')::int
     - current_setting('superuser_reserved_connections')::int
     - coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0)
"""


class Listener:
    """One connection listening on ``channel``; ``announced(payload)`` runs for each announcement,
    in the event loop. Announcements made while it is closed are lost, not queued."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @classmethod
    async def open(
        cls, dsn: str, channel: str, announced: Callable[[str], None], *, application_name: str | None = None,
        closed: Callable[[], None] | None = None,
    ) -> Listener:  # fmt: skip
        """Connect and listen. ``application_name`` names the session in ``pg_stat_activity``;
        ``closed()`` runs, in the event loop, when the session ends (closed, cut, or ended by
        the server)."""
        settings = {"application_name": application_name} if application_name is not None else None
        conn = await asyncpg.connect(dsn, server_settings=settings)
        try:
            await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: announced(payload))
            if closed is not None:
                conn.add_termination_listener(lambda _conn: closed())
        except BaseException:
            await conn.close()
            raise
        return cls(conn)

    @property
    def pid(self) -> int:
        """The session's backend pid (in ``pg_stat_activity`` while the session lives)."""
        return int(self._conn.get_server_pid())

    def is_closed(self) -> bool:
        return bool(self._conn.is_closed())

    async def rename(self, application_name: str) -> None:
        await self._conn.execute("SELECT set_config('application_name', $1, false)", application_name)

    async def close(self) -> None:
        await self._conn.close()


class Announcer:
    """One connection of its own for ``pg_notify``, outside any pool: announcements made while a
    caller holds a pool connection (a turn in its tool round) never wait for a second one.
    Not for concurrent use: one task sends through it."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def announce(self, channel: str, payload: str) -> None:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn, server_settings={"application_name": "pepper-announcer"})
        await self._conn.execute("SELECT pg_notify($1, $2)", channel, payload)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


async def connection_limit(db: Queries) -> int:
    """How many connections the server lets an ordinary role open (``CONNECTION_LIMIT_SQL``)."""
    return int(await db.fetchval(CONNECTION_LIMIT_SQL))


async def sessions_named(db: Queries, pattern: str) -> int:
    """How many sessions on this database have an ``application_name`` LIKE ``pattern``."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1",
            pattern,
        )
    )
