"""Connections and transactions on the pool: what code running several statements takes from
``core.store``. ``db`` is a :class:`~core.store.Database` or a connection already held."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

log = logging.getLogger(__name__)


@asynccontextmanager
async def connection(db: Any, *, stateless: bool = False) -> AsyncIterator[Any]:
    """One connection for a batch of queries: from the pool of a ``Database``, or ``db`` itself
    when it already is a connection. Saves a pool round trip (acquire, reset) per query.

    ``stateless``: the holder leaves no session state behind (no LISTEN, session-level SET or
    advisory lock, cursor outside a transaction), so the connection goes back to the pool without
    the reset round trip (``core.store.database.PoolConnection``)."""
    pool = getattr(db, "pool", None)
    if pool is None:
        yield db
        return
    async with pool.acquire() as conn:
        if stateless:
            skip = getattr(conn, "skip_reset", None)  # a pool not opened by ``Database`` has none
            if skip is not None:
                skip()
        yield conn


# The connection whose transaction ``transaction(wait_for_disk=False)`` began by hand (``BEGIN``
# and ``SET LOCAL`` in one round trip, which asyncpg's transactions cannot send): a ``transaction``
# nested in it takes a savepoint of its own, as asyncpg refuses to nest in a transaction it did not
# begin. Code inside such a transaction uses this helper, never ``conn.transaction()``.
_BEGUN_BY_HAND: ContextVar[Any] = ContextVar("pepper_begun_by_hand", default=None)
_savepoints = itertools.count()


@asynccontextmanager
async def transaction(db: Any, *, wait_for_disk: bool = True) -> AsyncIterator[Any]:
    """A transaction on ``db`` (a ``Database`` or a connection); yields the connection.

    ``wait_for_disk=False`` commits without waiting for the disk: only when the caller makes a
    durable commit afterwards, before anyone is told of the change (see ``ToolContext``).
    """
    async with connection(db) as conn:
        if _BEGUN_BY_HAND.get() is conn:
            async with _savepoint(conn):
                yield conn
        elif wait_for_disk or conn.is_in_transaction():
            async with conn.transaction():
                if not wait_for_disk:
                    await conn.execute("SET LOCAL synchronous_commit TO OFF")
                yield conn
        else:
            await conn.execute("BEGIN; SET LOCAL synchronous_commit TO OFF")
            token = _BEGUN_BY_HAND.set(conn)
            try:
                yield conn
            except BaseException:
                await _rollback(conn, "ROLLBACK")
                raise
            finally:
                _BEGUN_BY_HAND.reset(token)
            await conn.execute("COMMIT")


@asynccontextmanager
async def _savepoint(conn: Any) -> AsyncIterator[None]:
    name = f"pepper_{next(_savepoints)}"
    await conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        await _rollback(conn, f"ROLLBACK TO SAVEPOINT {name}")
        raise
    await conn.execute(f"RELEASE SAVEPOINT {name}")


async def _rollback(conn: Any, statement: str) -> None:
    """Undo after a failure, keeping the failure: a rollback that fails too (the connection broke)
    is logged; the pool rolls back or closes the connection when it is given back."""
    try:
        await conn.execute(statement)
    except Exception:
        log.warning("rollback failed after an error: %s", statement, exc_info=True)
