"""A throwaway Postgres for tests: one server per run, a fresh database per test.

The server is the embedded one (or ``PEPPER_TEST_DATABASE_URL``, an external server with
pgvector whose user may create databases). Migrations run once into a template database; each
test gets ``CREATE DATABASE ... TEMPLATE``, which copies files instead of replaying SQL.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from core.store.database import Database, ensure_pgvector
from core.store.embedded import EmbeddedPostgres
from core.store.migrations import apply_migrations

TEMPLATE = "pepper_template"


def with_database(dsn: str, name: str) -> str:
    """The same server DSN pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


@contextmanager
def test_server() -> Iterator[str]:
    """Yield an admin DSN for a Postgres server that lives as long as the context."""
    external = os.environ.get("PEPPER_TEST_DATABASE_URL")
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="pepper-test-pg-"))
    pg = EmbeddedPostgres(root)
    try:
        yield pg.start()
    finally:
        pg.stop()
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
