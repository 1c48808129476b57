"""A throwaway Postgres for tests: one server per run, a fresh database per test.

The server is the embedded one (or ``PEPPER_TEST_DATABASE_URL``, an external server with
pgvector whose user may create databases). Migrations run once into a template database; a
:class:`DatabaseFactory` clones it with ``CREATE DATABASE ... TEMPLATE``, which copies files
instead of replaying SQL but still takes a second or so on a busy machine. A
:class:`DatabasePool` hands out such clones and, when a test is done with one, puts it back in the
template's state (much cheaper than a new clone) in a thread of its own while the next test runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import itertools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from core.store.database import Database, ensure_pgvector
from core.store.embedded import EmbeddedPostgres
from core.store.migrations import apply_migrations

log = logging.getLogger(__name__)

T = TypeVar("T")

# One template per pytest-xdist worker: with PEPPER_TEST_DATABASE_URL the workers share a server.
TEMPLATE = "pepper_template" + (f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else "")


def with_database(dsn: str, name: str) -> str:
    """The same server DSN pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


# The test suite's server is thrown away with its run: nothing it holds must outlive a crash of
# the machine, so it never waits for the disk (a commit, a CREATE DATABASE's checkpoint), which was
# much of the fast test loop's time. Benchmarks keep a durable server: they measure those waits.
# Nor does it analyze on its own: autovacuum reaching the template (a migration's seeded rows)
# gave later clones planner statistics that earlier ones lacked and that a recycled database has
# cleared, so a clone's state depended on when it was made. Tests ANALYZE what they need.
DISPOSABLE_SERVER = {"fsync": "off", "full_page_writes": "off", "autovacuum": "off"}


@contextmanager
def test_server(*, disposable: bool = False) -> Iterator[str]:
    """Yield an admin DSN for a Postgres server that lives as long as the context (``disposable``:
    one that never waits for the disk, for the test suite)."""
    external = os.environ.get("PEPPER_TEST_DATABASE_URL")
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="pepper-test-pg-"))
    pg = EmbeddedPostgres(root, settings=DISPOSABLE_SERVER if disposable else None)
    try:
        yield pg.start()
    finally:
        pg.stop(discard=True)
        shutil.rmtree(root, ignore_errors=True)


class DatabaseFactory:
    """Makes migrated databases from a template on one server."""

    _names = itertools.count()

    def __init__(self, admin_dsn: str):
        self.admin_dsn = admin_dsn
        self._prefix = f"t{os.getpid()}_"

    async def prepare_template(self) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{TEMPLATE}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(with_database(self.admin_dsn, TEMPLATE))
        try:
            await ensure_pgvector(conn, "the test server")
            await apply_migrations(conn)
        finally:
            await conn.close()

    async def create(self, *, template: str = TEMPLATE) -> str:
        """A new database cloned from ``template``; returns its DSN."""
        name = f"{self._prefix}{next(self._names)}"
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        finally:
            await admin.close()
        return with_database(self.admin_dsn, name)

    async def create_empty(self) -> str:
        return await self.create(template="template0")

    async def drop(self, dsn: str) -> None:
        name = urlsplit(dsn).path.lstrip("/")
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    async def open(self) -> Database:
        return await Database.open(await self.create())


@asynccontextmanager
async def bench_database(*, max_size: int = 2) -> AsyncIterator[Database]:
    """A migrated database on a durable server of its own, for a benchmark (its commits wait for
    the disk, as a user's do): opened, then closed and dropped with the server."""
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url, max_size=max_size)
        try:
            yield db
        finally:
            await db.close()
            await factory.drop(url)


# What a migrated database's schema consists of, as one digest: the objects in its own schemas,
# their columns, defaults, constraints, indexes, triggers, functions and types, its extensions,
# policies and database settings. A test that changed any of these gets a new clone.
_SCHEMA_DIGEST = """
WITH ns AS (
    SELECT oid FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg\\_toast%'
      AND nspname NOT LIKE 'pg\\_temp\\_%'
), rel AS (SELECT oid FROM pg_class WHERE relnamespace IN (SELECT oid FROM ns))
SELECT md5(concat_ws('|',
    (SELECT string_agg(format('%s %s %s', oid, nspname, nspacl), ',' ORDER BY oid) FROM pg_namespace
     WHERE oid IN (SELECT oid FROM ns)),
    (SELECT string_agg(format('%s %s %s %s %s %s %s', oid, relname, relkind, relnamespace, relpersistence,
                              relrowsecurity, relacl), ',' ORDER BY oid) FROM pg_class
     WHERE oid IN (SELECT oid FROM rel)),
    (SELECT string_agg(format('%s %s %s %s %s %s %s %s %s %s', attrelid, attnum, attname, atttypid, atttypmod,
                              attnotnull, atthasdef, attisdropped, attidentity, attgenerated), ','
                       ORDER BY attrelid, attnum) FROM pg_attribute WHERE attrelid IN (SELECT oid FROM rel)),
    (SELECT string_agg(format('%s %s', oid, pg_get_expr(adbin, adrelid)), ',' ORDER BY oid) FROM pg_attrdef
     WHERE adrelid IN (SELECT oid FROM rel)),
    (SELECT string_agg(format('%s %s %s %s', oid, conname, convalidated, pg_get_constraintdef(oid)), ','
                       ORDER BY oid) FROM pg_constraint WHERE connamespace IN (SELECT oid FROM ns)),
    (SELECT string_agg(format('%s %s %s', indexrelid, indisvalid, indisready), ',' ORDER BY indexrelid)
     FROM pg_index WHERE indrelid IN (SELECT oid FROM rel)),
    (SELECT string_agg(format('%s %s %s %s', oid, tgname, tgenabled, tgfoid), ',' ORDER BY oid) FROM pg_trigger
     WHERE tgrelid IN (SELECT oid FROM rel)),
    (SELECT string_agg(format('%s %s %s %s', oid, proname, md5(prosrc), proconfig), ',' ORDER BY oid) FROM pg_proc
     WHERE pronamespace IN (SELECT oid FROM ns)),
    (SELECT string_agg(format('%s %s', oid, typname), ',' ORDER BY oid) FROM pg_type
     WHERE typnamespace IN (SELECT oid FROM ns)),
    (SELECT string_agg(format('%s %s', oid, enumlabel), ',' ORDER BY oid) FROM pg_enum),
    (SELECT string_agg(format('%s %s', extname, extversion), ',' ORDER BY extname) FROM pg_extension),
    (SELECT string_agg(format('%s %s', oid, md5(ev_action::text)), ',' ORDER BY oid) FROM pg_rewrite
     WHERE ev_class IN (SELECT oid FROM rel)),
    (SELECT string_agg(oid::text, ',' ORDER BY oid) FROM pg_policy),
    (SELECT string_agg(oid::text, ',' ORDER BY oid) FROM pg_event_trigger),
    (SELECT string_agg(oid::text, ',' ORDER BY oid) FROM pg_default_acl),
    (SELECT string_agg(format('%s %s', setrole, setconfig), ',' ORDER BY setrole) FROM pg_db_role_setting
     WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
    (SELECT format('%s %s %s', datconnlimit, datallowconn, datacl) FROM pg_database
     WHERE datname = current_database()),
    (SELECT count(*) FROM pg_largeobject_metadata)
))
"""


# The relations in the database's own schemas; ``written``: a table whose file is not empty (it
# holds rows, or held some: a clone's empty tables have no pages at all).
_RELATIONS = """
SELECT c.oid, c.relkind::text, n.nspname AS schema, c.relname AS name,
       format('%I.%I', n.nspname, c.relname) AS qualified, c.relkind = 'r' AND pg_relation_size(c.oid) > 0 AS written
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%'
  AND n.nspname NOT LIKE 'pg\\_temp\\_%'
"""
# The planner's size estimates of every relation made after initdb (tables, indexes, TOAST).
_SIZES = "SELECT oid, relpages, reltuples, relallvisible FROM pg_class WHERE oid >= 16384"


class _Rows(NamedTuple):
    """A table's rows in the template."""

    schema: str
    table: str
    columns: list[str]  # all but generated ones
    data: bytes  # COPY text format
    digest: str  # see _rows_digest


@dataclass(frozen=True)
class _Fresh:
    """What a clone of the template holds, to put a used database back in that state."""

    relations: frozenset[int]
    schema: str
    rows: dict[int, _Rows]  # by table
    sequences: list[tuple[str, int, bool]]  # name, last_value, is_called
    sizes: list[tuple[int, int, float, int]]  # oid, relpages, reltuples, relallvisible

    @classmethod
    async def read(cls, conn: asyncpg.Connection) -> _Fresh:
        relations = await conn.fetch(_RELATIONS)
        rows: dict[int, _Rows] = {}
        sequences = []
        for rel in relations:
            if rel["relkind"] == "S":
                value, called = await conn.fetchrow(f"SELECT last_value, is_called FROM {rel['qualified']}")
                sequences.append((rel["qualified"], value, called))
            elif rel["relkind"] == "r" and await conn.fetchval(f"SELECT EXISTS (SELECT FROM {rel['qualified']})"):
                columns = await conn.fetchval(
                    "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute"
                    " WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = ''",
                    rel["oid"],
                )
                copied = io.BytesIO()
                await conn.copy_from_table(rel["name"], schema_name=rel["schema"], columns=columns, output=copied)
                digest = await _rows_digest(conn, rel["qualified"])
                rows[rel["oid"]] = _Rows(rel["schema"], rel["name"], columns, copied.getvalue(), digest)
        sizes = [tuple(r) for r in await conn.fetch(_SIZES)]
        schema = await conn.fetchval(_SCHEMA_DIGEST)
        return cls(frozenset(r["oid"] for r in relations), schema, rows, sequences, sizes)  # type: ignore[arg-type]

    async def restore(self, conn: asyncpg.Connection) -> bool:
        """Put ``conn``'s database back in this state; False when it cannot be (its schema changed).

        Tables made since (a person's search-index partition, a model's index) are dropped.
        Every table written to is emptied: DELETE, then VACUUM, which gives back all its pages, so
        new rows go where they would in a clone (a TRUNCATE would do too, but it must take every
        table referring to it along, and rebuilding all their indexes costs as much as a clone).
        The template's rows are copied back where they changed, every sequence is set where it
        was, and the planner's view is the clone's: its size estimates put back, statistics and
        activity counters cleared. Triggers and foreign keys are off meanwhile (a superuser's
        ``session_replication_role``): emptying and refilling tables must not touch others.
        """
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            relations = await conn.fetch(_RELATIONS)
            made = [r for r in relations if r["oid"] not in self.relations]
            for kinds, drop in (("rp", "TABLE"), ("S", "SEQUENCE"), ("iI", "INDEX")):
                names = [r["qualified"] for r in made if r["relkind"] in kinds]
                if names:
                    await conn.execute(f"DROP {drop} IF EXISTS {', '.join(names)}")
            if await conn.fetchval(_SCHEMA_DIGEST) != self.schema:
                return False
            written = [r for r in relations if r["written"] and r["oid"] in self.relations]
            emptied = [
                r
                for r in written
                if r["oid"] not in self.rows or await _rows_digest(conn, r["qualified"]) != self.rows[r["oid"]].digest
            ]
            for table in emptied:
                await conn.execute(f"DELETE FROM {table['qualified']}")
        oids = [r["oid"] for r in emptied]
        if emptied:
            await conn.execute(f"VACUUM {', '.join(r['qualified'] for r in emptied)}")
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            if await conn.fetchval("SELECT bool_or(pg_relation_size(t) > 0) FROM unnest($1::oid[]) t", oids):
                return False  # VACUUM could not give all the pages back
            for seeded in (self.rows[oid] for oid in oids if oid in self.rows):
                await conn.copy_to_table(
                    seeded.table, schema_name=seeded.schema, columns=seeded.columns, source=io.BytesIO(seeded.data)
                )
            await conn.execute(
                "UPDATE pg_class c SET relpages = f.pages, reltuples = f.tuples, relallvisible = f.visible"
                " FROM unnest($1::oid[], $2::int[], $3::real[], $4::int[]) AS f(oid, pages, tuples, visible)"
                " WHERE c.oid = f.oid"
                " AND (c.relpages, c.reltuples, c.relallvisible) IS DISTINCT FROM (f.pages, f.tuples, f.visible)",
                *map(list, zip(*self.sizes, strict=True)),
            )
            await conn.execute("DELETE FROM pg_statistic WHERE starelid = ANY($1::oid[])", oids)
            if self.sequences:
                await conn.execute(
                    "SELECT setval(name::regclass, value, called) FROM unnest($1::text[], $2::int8[], $3::bool[])"
                    " AS s(name, value, called)",
                    *map(list, zip(*self.sequences, strict=True)),
                )
        await conn.execute("SELECT pg_stat_reset()")
        return True


async def _rows_digest(conn: asyncpg.Connection, table: str) -> str:
    # The row versions' places too (ctid): an updated row is a new version elsewhere, even if
    # its values are back to what they were.
    return await conn.fetchval(f"SELECT md5(string_agg(ctid::text || t::text, ',' ORDER BY ctid)) FROM {table} t")


class DatabasePool:
    """Migrated databases for tests, ready before they are asked for: ``await acquire()`` one,
    ``release`` it when done.

    A released database is put back in the state of a new clone of the template (see
    :meth:`_Fresh.restore`): the same schema, the rows the migrations left, every sequence
    where it was. One whose schema a test changed, or one the pool cannot clean, is dropped
    and replaced by a new clone. The work runs in a thread with its own event loop, one piece at
    a time, so it goes on while a test runs, whichever loop the test uses or blocks; ``quiet()``
    holds it off. Cleaning needs a superuser (the embedded server's); with a lesser user the
    pool only clones ahead and drops after.
    """

    def __init__(self, factory: DatabaseFactory, *, size: int = 3):
        self.factory, self.size = factory, size
        self.recycled = self.cloned = 0
        self._fresh: _Fresh | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-databases", daemon=True)
        self._ready: asyncio.Queue[str | BaseException] | None = None
        self._busy: asyncio.Lock | None = None
        self._work: list[concurrent.futures.Future[None]] = []
        self._names: set[str] = set()

    def start(self) -> None:
        self._thread.start()
        self._call(self._start()).result()
        for _ in range(self.size):
            self._track(self._call(self._add()))

    async def acquire(self) -> str:
        """The DSN of a database in the template's state, for the caller alone until released."""
        name = await asyncio.wait_for(asyncio.wrap_future(self._call(self._take())), timeout=120)
        return with_database(self.factory.admin_dsn, name)

    def release(self, dsn: str) -> None:
        """Give a database back (its connections are closed for it); returns at once."""
        self._track(self._call(self._renew(urlsplit(dsn).path.lstrip("/"))))

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Inside, the pool does nothing on the server (what it had begun is finished first)."""
        assert self._busy is not None
        self._call(self._busy.acquire()).result()
        try:
            yield
        finally:
            self._loop.call_soon_threadsafe(self._busy.release)

    def close(self, *, drop: bool = True) -> None:
        """Finish the work begun and stop; ``drop``: drop the databases too (not worth it on a
        server about to be deleted: the first DROP DATABASE waits for a checkpoint)."""
        concurrent.futures.wait(self._work, timeout=60)
        if drop:
            self._call(self._drop_all()).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, work: Coroutine[object, object, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def _track(self, work: concurrent.futures.Future[None]) -> None:
        self._work = [w for w in self._work if not w.done()] + [work]

    async def _start(self) -> None:
        self._ready, self._busy = asyncio.Queue(), asyncio.Lock()
        conn = await asyncpg.connect(with_database(self.factory.admin_dsn, TEMPLATE))
        try:
            if await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
                self._fresh = await _Fresh.read(conn)
        finally:
            await conn.close()

    async def _take(self) -> str:
        assert self._ready is not None
        got = await self._ready.get()
        if isinstance(got, BaseException):
            raise got
        return got

    async def _add(self) -> None:
        assert self._busy is not None
        async with self._busy:
            await self._clone()

    async def _renew(self, name: str) -> None:
        assert self._ready is not None and self._busy is not None
        async with self._busy:
            if await self._clean(name):
                self.recycled += 1
                await self._ready.put(name)
                return
            self._names.discard(name)
            try:
                await self.factory.drop(with_database(self.factory.admin_dsn, name))
            except (OSError, asyncpg.PostgresError):
                log.warning("could not drop test database %s", name, exc_info=True)
            await self._clone()

    async def _clone(self) -> None:
        assert self._ready is not None
        try:
            name = urlsplit(await self.factory.create()).path.lstrip("/")
        except Exception as exc:  # the test that waits for this database fails with the cause
            await self._ready.put(exc)
            return
        self._names.add(name)
        self.cloned += 1
        await self._ready.put(name)

    async def _clean(self, name: str) -> bool:
        if self._fresh is None:
            return False
        try:
            admin = await asyncpg.connect(self.factory.admin_dsn)
            try:  # what the test left connected (a pool it did not close, a child process)
                await admin.execute(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                    " WHERE datname = $1 AND pid <> pg_backend_pid()",
                    name,
                )
            finally:
                await admin.close()
            conn = await asyncpg.connect(with_database(self.factory.admin_dsn, name))
            try:
                return await self._fresh.restore(conn)
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError):
            log.warning("could not clean test database %s; cloning another", name, exc_info=True)
            return False

    async def _drop_all(self) -> None:
        for name in list(self._names):
            await self.factory.drop(with_database(self.factory.admin_dsn, name))
