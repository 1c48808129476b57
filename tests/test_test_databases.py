"""The test databases: one a test is done with comes back as a new clone of the template would be."""

from __future__ import annotations

import re

import asyncpg

from core import identity
from core.memory.index import ensure_model_index
from core.store import Database
from core.testing.postgres import DatabaseFactory, DatabasePool


async def _state(dsn: str) -> dict[str, object]:
    """What a test could see of a database: every table's rows and where they lie, the sequences,
    the relations with the planner's size estimates and statistics, the functions."""
    conn = await asyncpg.connect(dsn)
    try:
        relations = await conn.fetch(
            "SELECT oid, relname::text, relkind::text, relpages, reltuples, relallvisible,"
            " CASE WHEN relkind IN ('r', 't') THEN pg_relation_size(oid) END AS bytes"
            " FROM pg_class WHERE oid >= 16384 ORDER BY relname"
        )
        state: dict[str, object] = {"relations": [tuple(r)[1:] for r in relations]}
        for rel in relations:
            name = f'public."{rel["relname"]}"'
            if rel["relkind"] == "r":
                state[name] = [tuple(r) for r in await conn.fetch(f"SELECT ctid::text, t::text FROM {name} t")]
            elif rel["relkind"] == "S":
                state[name] = tuple(await conn.fetchrow(f"SELECT last_value, is_called FROM {name}"))
        state["statistics"] = await conn.fetchval("SELECT count(*) FROM pg_statistic WHERE starelid >= 16384")
        state["functions"] = sorted(
            r[0]
            for r in await conn.fetch("SELECT proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        )
        return state
    finally:
        await conn.close()


async def _places(dsn: str) -> dict[str, list[str]]:
    """Where each table's rows lie."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch("SELECT relname::text FROM pg_class WHERE oid >= 16384 AND relkind = 'r'")
        places = {}
        for (table,) in tables:
            key = re.sub("^memory_index_[0-9a-f]{32}$", "memory_index_<person>", table)
            places[key] = [r[0] for r in await conn.fetch(f'SELECT ctid::text FROM public."{table}"')]
        return places
    finally:
        await conn.close()


async def _use(dsn: str) -> None:
    """What tests do to their database: rows in many tables, partitions and an index made by the
    code, a migration's own rows changed, statistics, a connection left open."""
    db = await Database.open(dsn, max_size=2)
    try:
        ada = await identity.create_account(db, "Ada")
        bob = await identity.create_account(db, "Bob")
        await db.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'kept')", ada.id)
        await db.execute("INSERT INTO todos (account_id, title) VALUES ($1, 'bins')", bob.id)
        await db.execute("DELETE FROM accounts WHERE id = $1", bob.id)  # its partition goes too
        await ensure_model_index(db, "test-model", 3)
        await db.execute("UPDATE schema_migrations SET name = name WHERE version = 1")
        await db.execute("UPDATE memory_index_state SET message_cursor = 7")
        await db.execute("SELECT nextval('memory_index_id')")
        await db.execute("ANALYZE accounts")
    finally:
        await db.close()


async def test_a_used_database_comes_back_as_a_new_clone_would_be(db_factory: DatabaseFactory):
    pool = DatabasePool(db_factory, size=1)
    pool.start()
    fresh = await db_factory.create()
    try:
        used = await pool.acquire()
        await _use(used)
        left_open = await asyncpg.connect(used)
        pool.release(used)
        again = await pool.acquire()
        assert again == used and (pool.cloned, pool.recycled) == (1, 1)
        assert left_open.is_closed() or (await _closed(left_open))
        assert await _state(again) == await _state(fresh)
        # New rows land where they would in a clone.
        for dsn in (again, fresh):
            db = await Database.open(dsn, max_size=1)
            try:
                await identity.create_account(db, "Cy")
            finally:
                await db.close()
        assert await _places(again) == await _places(fresh)
        pool.release(again)
    finally:
        pool.close()
        await db_factory.drop(fresh)


async def _closed(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return True
    await conn.close()
    return False


async def test_a_database_whose_schema_a_test_changed_is_replaced_by_a_new_clone(db_factory: DatabaseFactory):
    pool = DatabasePool(db_factory, size=1)
    pool.start()
    try:
        used = await pool.acquire()
        conn = await asyncpg.connect(used)
        await conn.execute("CREATE FUNCTION refuse() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        await conn.close()
        pool.release(used)
        again = await pool.acquire()
        assert again != used and (pool.cloned, pool.recycled) == (2, 0)
        assert "refuse" not in (await _state(again))["functions"]  # type: ignore[operator]
        pool.release(again)
    finally:
        pool.close()
