"""Postgres with pgvector: embedded by default, external when ``DATABASE_URL`` is set."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import DatabaseUnavailable, StartupError, StoreError
from core.settings import Settings
from core.store.database import Database, connect, ensure_pgvector, redact_dsn, unreachable, when_reachable
from core.store.embedded import DataDirLock, EmbeddedPostgres
from core.store.migrations import load_migrations, pending_migrations
from core.store.sessions import CONNECTION_LIMIT_SQL

__all__ = [
    "Database",
    "EmbeddedPostgres",
    "StoreReport",
    "embedded_dsn",
    "inspect_store",
    "open_store",
    "prepare_data_dir",
    "redact_dsn",
    "unreachable",
    "when_reachable",
]

log = logging.getLogger(__name__)

EMBEDDED_DATABASE = "pepper"
# The web server's pool under ``pepper serve``: webhooks, web chat and admin pages each hold a
# connection for a statement or a short transaction. Part of the server's connection budget
# (``gateway.budget.connections_needed``).
SERVING_POOL_SIZE = 20


def prepare_data_dir(path: Path) -> Path:
    """Create the data dir if needed and prove it is writable; raise ``StartupError`` if not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StartupError(f"data dir {path} is not usable: {reason}") from exc
    return path


async def create_database_if_missing(admin_dsn: str, name: str) -> None:
    conn = await connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


@asynccontextmanager
async def embedded_dsn(data_dir: Path, *, serving: bool = False) -> AsyncIterator[str]:
    """The DSN of the Pepper database in the embedded Postgres of ``data_dir``, running meanwhile.

    ``serving=True`` takes the data dir lock and owns the server, stopping it on exit. Otherwise a
    running server's Postgres is used when one holds the lock, and else it is started (and the
    database created) for the duration.
    """
    lock = DataDirLock(data_dir)
    pg = EmbeddedPostgres(data_dir)
    if not serving and lock.is_held_elsewhere():
        if not pg.is_running():
            raise DatabaseUnavailable(f"a Pepper server holds {data_dir} but its embedded Postgres is not running")
        yield pg.dsn(EMBEDDED_DATABASE)
        return

    lock.acquire()
    try:
        admin_dsn = await asyncio.to_thread(pg.start)
        try:
            await create_database_if_missing(admin_dsn, EMBEDDED_DATABASE)
            yield pg.dsn(EMBEDDED_DATABASE)
        finally:
            await asyncio.to_thread(pg.stop)
    finally:
        lock.release()


@asynccontextmanager
async def open_store(settings: Settings, *, serving: bool) -> AsyncIterator[Database]:
    """Open the migrated store for this process.

    ``serving=True`` (``pepper serve``) takes the data dir lock and owns the embedded Postgres,
    stopping it on exit. ``serving=False`` (admin commands, ``doctor``) uses a running server's
    Postgres when one holds the lock, and otherwise starts it for the duration of the command.
    """
    pool = SERVING_POOL_SIZE if serving else 2
    if settings.database_url is not None:
        db = await Database.open(settings.database_url.get_secret_value(), max_size=pool)
        try:
            yield db
        finally:
            await db.close()
        return

    async with embedded_dsn(prepare_data_dir(settings.data_dir), serving=serving) as dsn:
        db = await Database.open(dsn, max_size=pool)
        try:
            yield db
        finally:
            await db.close()


@dataclass
class StoreReport:
    """What ``pepper doctor`` says about the store. ``problem`` set means the server cannot run."""

    kind: str
    location: str
    state: str
    problem: str | None = None
    schema_version: int | None = None
    pending_migrations: int | None = None
    accounts: int | None = None
    lines: list[tuple[str, str, str]] = field(default_factory=list)
    line_voice: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # (number, engine, transport)
    connection_limit: int | None = None  # see CONNECTION_LIMIT_SQL
    slot_settings: list[tuple[str, str, str]] = field(default_factory=list)  # (where, slot, occupant)


async def _describe(report: StoreReport, dsn: str) -> None:
    conn = await connect(dsn)
    try:
        await ensure_pgvector(conn, report.location)
        report.connection_limit = await conn.fetchval(CONNECTION_LIMIT_SQL)
        report.pending_migrations = len(await pending_migrations(conn))
        if report.pending_migrations < len(load_migrations()):
            report.schema_version = await conn.fetchval("SELECT max(version) FROM schema_migrations")
            report.accounts = await conn.fetchval("SELECT count(*) FROM accounts")
            # to_jsonb: a store whose migrations are pending may not have the newer columns yet.
            rows = await conn.fetch(
                "SELECT l.number, l.kind, a.name, to_jsonb(l) ->> 'voice_engine' AS engine,"
                " to_jsonb(l) ->> 'voice_transport' AS transport"
                " FROM phone_lines l JOIN accounts a ON a.id = l.account_id ORDER BY l.kind, l.number"
            )
            report.lines = [(r["number"], r["kind"], r["name"]) for r in rows]
            report.line_voice = [(r["number"], r["engine"], r["transport"]) for r in rows]
            if await conn.fetchval("SELECT to_regclass('slot_settings') IS NOT NULL"):
                rows = await conn.fetch(
                    "SELECT s.scope || coalesce(' ' || coalesce(h.name, a.name), '') AS scope, s.slot, s.occupant"
                    " FROM slot_settings s LEFT JOIN households h ON h.id = s.scope_id"
                    " LEFT JOIN accounts a ON a.id = s.scope_id ORDER BY 1, 2"
                )
                report.slot_settings = [(r["scope"], r["slot"], r["occupant"]) for r in rows]
    finally:
        await conn.close()


async def inspect_store(settings: Settings) -> StoreReport:
    """Look at the store without changing it: nothing is created or migrated."""
    if settings.database_url is not None:
        dsn = settings.database_url.get_secret_value()
        report = StoreReport("external", redact_dsn(dsn), "reachable")
        try:
            await _describe(report, dsn)
        except StoreError as exc:
            report.state, report.problem = "unusable", exc.message
        return report

    report = StoreReport("embedded", str(settings.data_dir / "postgres"), "not created yet")
    try:
        data_dir = prepare_data_dir(settings.data_dir)
    except StartupError as exc:
        report.state, report.problem = "unusable", exc.message
        return report
    pg = EmbeddedPostgres(data_dir)
    if not (pg.pgdata / "PG_VERSION").exists():
        report.state = "not created yet (the first `pepper serve` creates it)"
        return report
    lock = DataDirLock(data_dir)
    try:
        if lock.is_held_elsewhere():
            report.state = "running (a Pepper server holds the data dir)"
            if not await asyncio.to_thread(pg.is_running):
                report.problem = "a Pepper server holds the data dir but its Postgres is not running"
                return report
            await _describe(report, pg.dsn(EMBEDDED_DATABASE))
            return report
        report.state = "stopped (started briefly to look)"
        lock.acquire()
        try:
            await asyncio.to_thread(pg.start)
            try:
                await create_database_if_missing(pg.dsn(), EMBEDDED_DATABASE)
                await _describe(report, pg.dsn(EMBEDDED_DATABASE))
            finally:
                await asyncio.to_thread(pg.stop)
        finally:
            lock.release()
    except (StoreError, StartupError) as exc:
        report.problem = exc.message
    return report
