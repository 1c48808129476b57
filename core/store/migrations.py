"""Versioned SQL migrations, applied at start in order, each in its own transaction.

Files live beside this module as ``migrations/NNNN_name.sql``. A session-level advisory lock
serialises concurrent starts: a second process waits for the first, then finds nothing to do.
A start interrupted mid-migration leaves that migration rolled back (the transaction never
committed), so the next start applies it again from the beginning.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

log = logging.getLogger(__name__)

# Arbitrary but fixed: 'pepper' in ASCII, as a bigint key for pg_advisory_lock.
MIGRATION_LOCK_KEY = 0x706570706572
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    folder = resources.files("core.store") / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


@functools.cache
def shipped_versions() -> tuple[int, ...]:
    """The versions this build ships, read from disk once."""
    return tuple(m.version for m in load_migrations())


_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def applied_versions(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return set()
    return {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}


async def pending_migrations(conn: asyncpg.Connection, migrations: list[Migration] | None = None) -> list[Migration]:
    migrations = load_migrations() if migrations is None else migrations
    done = await applied_versions(conn)
    return [m for m in migrations if m.version not in done]


async def apply_migrations(conn: asyncpg.Connection, migrations: list[Migration] | None = None) -> list[int]:
    """Apply every pending migration; return the versions applied by this call."""
    migrations = load_migrations() if migrations is None else migrations
    applied: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(_CREATE_LEDGER)
        done = await applied_versions(conn)
        for migration in migrations:
            if migration.version in done:
                continue
            log.info("applying migration %04d_%s", migration.version, migration.name)
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            applied.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied
