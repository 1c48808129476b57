"""The store: migrations under concurrency and interruption, pgvector, and clear errors."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg
import pytest

from core.errors import DatabaseUnavailable, MissingPgvector
from core.store.database import Database, connect, ensure_pgvector, redact_dsn
from core.store.embedded import SERVER_SETTINGS, EmbeddedPostgres, wheel_bin_dir
from core.store.migrations import Migration, apply_migrations, load_migrations, pending_migrations
from core.store.pool import connection
from core.testing.postgres import DatabaseFactory


def test_shipped_migrations_have_distinct_increasing_numbers():
    versions = [m.version for m in load_migrations()]
    assert versions[0] == 1 and versions == sorted(set(versions))


async def test_a_fresh_database_is_migrated_and_vectors_round_trip(db: Database):
    assert await db.fetchval("SELECT max(version) FROM schema_migrations") == load_migrations()[-1].version
    async with db.pool.acquire() as conn:
        await conn.execute("CREATE TABLE vec_check (e vector(3))")
        await conn.execute("INSERT INTO vec_check VALUES ($1)", [1.0, 2.0, 3.0])
        value = await conn.fetchval("SELECT e FROM vec_check")
    assert value.to_list() == [1.0, 2.0, 3.0]
    assert (await db.health())["pending_migrations"] == 0


async def test_a_side_pool_keeps_its_session_settings_and_rolls_back_an_open_transaction(db: Database):
    side = await db.side_pool(max_size=1, settings={"application_name": "pepper-side"})
    try:
        async with side.pool.acquire() as conn:
            await conn.execute("BEGIN")  # left open by mistake
            await conn.execute("INSERT INTO accounts (name) VALUES ('never')")
        async with side.pool.acquire() as conn:  # the same session (one connection), not reset
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SHOW application_name") == "pepper-side"
        assert await db.fetchval("SELECT count(*) FROM accounts WHERE name = 'never'") == 0
    finally:
        await side.close()


async def test_a_stateless_lease_goes_back_without_the_reset_and_any_other_lease_is_reset(db: Database):
    one = await Database.open(db.dsn, max_size=1)  # one connection: every lease is the same session
    try:
        async with connection(one, stateless=True) as conn:
            await conn.execute("SET application_name = 'left-behind'")  # breaks the promise, to see it kept
        async with connection(one) as conn:  # not reset: the promise was taken at its word
            assert await conn.fetchval("SHOW application_name") == "left-behind"
        async with connection(one) as conn:  # the lease before was an ordinary one: reset
            assert await conn.fetchval("SHOW application_name") == ""
            await conn.execute("BEGIN")  # left open by mistake
        async with connection(one, stateless=True) as conn:
            await conn.execute("BEGIN")  # left open by mistake
            await conn.execute("INSERT INTO accounts (name) VALUES ('rolled back')")
        async with connection(one) as conn:  # an open transaction is rolled back all the same
            assert not conn.is_in_transaction()
        assert await db.fetchval("SELECT count(*) FROM accounts WHERE name = 'rolled back'") == 0
    finally:
        await one.close()


async def test_a_pool_for_background_work_runs_its_local_backends_nicer(db: Database, db_url: str):
    """Turn workers open their pool so: the backends doing a turn's work yield the CPU as the worker does."""
    nicer = await Database.open(db_url, max_size=2, backend_nice=7, backend_idle=True)
    try:
        async with nicer.pool.acquire() as a, nicer.pool.acquire() as b:
            pids = [a.get_server_pid(), b.get_server_pid()]
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [7, 7]
        assert [os.sched_getscheduler(pid) for pid in pids] == [os.SCHED_IDLE] * 2
        async with db.pool.acquire() as plain:  # the web server's pool is left as it is
            assert os.getpriority(os.PRIO_PROCESS, plain.get_server_pid()) == os.getpriority(os.PRIO_PROCESS, 0)
            assert os.sched_getscheduler(plain.get_server_pid()) == os.SCHED_OTHER
    finally:
        await nicer.close()


async def test_two_processes_migrating_at_once_apply_each_migration_once(db_factory: DatabaseFactory):
    dsn = await db_factory.create_empty()
    slow = [
        Migration(1, "first", "CREATE EXTENSION IF NOT EXISTS vector; CREATE TABLE a (id int); SELECT pg_sleep(0.3)"),
        Migration(2, "second", "CREATE TABLE b (id int)"),
    ]
    conns = [await connect(dsn) for _ in range(2)]
    try:
        results = await asyncio.gather(*(apply_migrations(c, slow) for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert sorted(v for r in results for v in r) == [1, 2]  # every version applied exactly once
    conn = await connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == 2
    finally:
        await conn.close()


async def test_servers_starting_at_once_on_an_empty_database_each_enable_pgvector(db_factory: DatabaseFactory):
    """CREATE EXTENSION IF NOT EXISTS alone is not safe at once: the second insert into the catalog
    fails on its unique key (scripts/suite-two-servers found it). Several rounds, as it is a race."""
    for _ in range(3):
        dsn = await db_factory.create_empty()
        conns = [await connect(dsn) for _ in range(4)]
        try:
            await asyncio.gather(*(ensure_pgvector(c, "the test database") for c in conns))
            assert await conns[0].fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == 1
        finally:
            for c in conns:
                await c.close()
            await db_factory.drop(dsn)


async def test_a_failed_migration_rolls_back_and_the_next_start_completes_it(db_factory: DatabaseFactory):
    dsn = await db_factory.create_empty()
    good = [
        Migration(1, "one", "CREATE TABLE one (id int)"),
        Migration(2, "two", "CREATE TABLE two (id int); INSERT INTO two VALUES (1)"),
    ]
    broken = [good[0], Migration(2, "two", "CREATE TABLE two (id int); SELECT no_such_function()")]
    conn = await connect(dsn)
    try:
        with pytest.raises(asyncpg.UndefinedFunctionError):
            await apply_migrations(conn, broken)
        # Migration 1 committed; migration 2 left nothing behind.
        assert await conn.fetchval("SELECT to_regclass('two')") is None
        assert [m.version for m in await pending_migrations(conn, good)] == [2]
        assert await apply_migrations(conn, good) == [2]
        assert await conn.fetchval("SELECT count(*) FROM two") == 1
    finally:
        await conn.close()


async def test_a_process_killed_mid_migration_leaves_it_to_the_next_start(db_factory: DatabaseFactory, tmp_path):
    dsn = await db_factory.create_empty()
    script = tmp_path / "migrate.py"
    script.write_text(
        "import asyncio, asyncpg, sys\n"
        "from core.store.migrations import Migration, apply_migrations\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    await apply_migrations(conn, [Migration(1, 'slow', "
        '"CREATE TABLE half (id int); SELECT pg_sleep(2)")])\n'
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), dsn)
    conn = await connect(dsn)
    try:
        for _ in range(200):  # wait until the migration is inside its transaction
            if await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(2)%' AND pid <> pg_backend_pid()"
            ):
                break
            await asyncio.sleep(0.05)
        proc.kill()
        await proc.wait()
        # The server rolls the dead client's transaction back once its statement ends.
        fixed = [Migration(1, "slow", "CREATE TABLE half (id int)")]
        assert await asyncio.wait_for(apply_migrations(conn, fixed), 20) == [1]
        assert await conn.fetchval("SELECT to_regclass('half') IS NOT NULL")
    finally:
        await conn.close()


async def test_unreachable_database_is_one_clear_error_without_the_password():
    dsn = "postgresql://pepper:s3cret@127.0.0.1:9/pepper"
    with pytest.raises(DatabaseUnavailable) as err:
        await Database.open(dsn)
    assert "s3cret" not in str(err.value)
    assert "127.0.0.1:9" in str(err.value)
    assert redact_dsn(dsn) == "postgresql://pepper:***@127.0.0.1:9/pepper"


async def test_a_database_that_does_not_exist_is_named(pg_server: str):
    from core.testing.postgres import with_database

    with pytest.raises(DatabaseUnavailable, match="does not exist"):
        await Database.open(with_database(pg_server, "no_such_db"))


async def test_a_server_without_pgvector_gets_one_clear_error(postgres_without_pgvector: str):
    with pytest.raises(MissingPgvector, match="no pgvector extension"):
        await Database.open(postgres_without_pgvector)


def test_embedded_postgres_restarts_on_its_data_and_keeps_it(tmp_path: Path):
    pg = EmbeddedPostgres(tmp_path)
    dsn = pg.start()

    async def write_then_read(value: int | None) -> int:
        conn = await asyncpg.connect(dsn)
        try:
            if value is not None:
                await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
            return await conn.fetchval("SELECT v FROM kept")
        finally:
            await conn.close()

    assert asyncio.run(write_then_read(42)) == 42
    pg.stop()
    assert not pg.is_running()
    pg.start()
    try:
        assert asyncio.run(write_then_read(None)) == 42
    finally:
        pg.stop()


def test_a_server_stopped_to_be_discarded_skips_the_shutdown_checkpoint(tmp_path: Path):
    pg = EmbeddedPostgres(tmp_path)
    pg.start()
    pg.stop(discard=True)
    assert not pg.is_running()
    control = subprocess.run(
        [str(wheel_bin_dir() / "pg_controldata"), str(pg.pgdata)], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"cluster state:\s+in production", control)  # a clean stop says "shut down"


def test_the_embedded_server_starts_with_its_settings(tmp_path: Path):
    pg = EmbeddedPostgres(tmp_path)

    async def settings(dsn: str) -> dict[str, str]:
        conn = await asyncpg.connect(dsn)
        try:
            return {name: await conn.fetchval("SELECT current_setting($1)", name) for name in SERVER_SETTINGS}
        finally:
            await conn.close()

    try:
        assert asyncio.run(settings(pg.start())) == SERVER_SETTINGS
    finally:
        pg.stop()


def test_an_interrupted_initdb_does_not_block_the_next_start(tmp_path: Path):
    # What a crash during the first start leaves behind: a half-made scratch cluster.
    (tmp_path / "postgres.init").mkdir()
    (tmp_path / "postgres.init" / "garbage").write_text("half written")
    pg = EmbeddedPostgres(tmp_path)
    pg.start()
    try:
        assert pg.is_running()
        assert not (tmp_path / "postgres.init").exists()
    finally:
        pg.stop()


async def _login_as(dsn: str, role: str) -> bool:
    """Whether a connection as ``role`` through the embedded server's socket is let in."""
    from urllib.parse import urlsplit

    parts = urlsplit(dsn)
    try:
        conn = await asyncpg.connect(dsn.replace(f"{parts.username}@", f"{role}@", 1))
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError):
        return False
    await conn.close()
    return True


def _as_other_user(pg: EmbeddedPostgres) -> subprocess.CompletedProcess:
    """Another local account (``nobody``) trying the superuser through the socket with psql."""
    psql = str(wheel_bin_dir() / "psql")
    return subprocess.run(
        [psql, "-h", str(pg.socket_dir), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1", "-w"],
        user="nobody", capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("long_path", [False, True], ids=["short", "long"])
def test_only_peppers_own_user_reaches_the_embedded_postgres(tmp_path: Path, long_path: bool):
    # The short case needs a path that fits a socket whatever the temporary root is (a long
    # PYTEST_DEBUG_TEMPROOT once turned it into the long case).
    root = tmp_path if long_path else Path(tempfile.mkdtemp(prefix="pp-", dir="/tmp"))
    data_dir = root / ("d" * 90 if long_path else "data")
    data_dir.mkdir()
    pg = EmbeddedPostgres(data_dir)
    dsn = pg.start()
    try:
        sock = pg.socket_dir
        assert (sock / ".s.PGSQL.5432").exists()
        info = sock.lstat()
        server_uid = pwd.getpwnam("embedded_postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == server_uid
        if not long_path:
            assert sock.parent == data_dir

        async def roles() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("CREATE ROLE mallory LOGIN")
                assert {r["auth_method"] for r in await conn.fetch("SELECT auth_method FROM pg_hba_file_rules")} == {
                    "peer"
                }
            finally:
                await conn.close()
            # Reaching the socket is not enough to pick a role: only the mapped one is let in.
            assert await _login_as(dsn, "mallory") is False
            assert await _login_as(dsn, "postgres") is True

        asyncio.run(roles())
        if os.geteuid() == 0:
            other = _as_other_user(pg)
            assert other.returncode != 0, other.stdout
    finally:
        pg.stop()
        if not long_path:
            shutil.rmtree(root, ignore_errors=True)


def test_a_data_dir_made_with_trust_and_left_running_is_upgraded(tmp_path: Path):
    pg = EmbeddedPostgres(tmp_path)
    dsn = pg.start()

    async def keep(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(keep("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7); CREATE ROLE mallory LOGIN"))
    pg.stop()
    # What an older Pepper left: trust authentication, its socket in the cluster folder, and the
    # server still running after that Pepper died.
    (pg.pgdata / "pg_hba.conf").write_text("local all all trust\n")
    pg._run("pg_ctl", "-D", str(pg.pgdata), "-w", "-t", "60", "-l", str(pg.pgdata / "server.log"),
            "-o", f"-h '' -k {pg.pgdata}", "start")  # fmt: skip
    old = f"postgresql://mallory@/postgres?host={pg.pgdata}"
    assert asyncio.run(_login_as(old, "mallory")) is True  # the hole, before the upgrade
    try:
        dsn = pg.start()

        async def after() -> int:
            assert await _login_as(dsn, "mallory") is False
            conn = await asyncpg.connect(dsn)
            try:
                return await conn.fetchval("SELECT v FROM kept")
            finally:
                await conn.close()

        assert asyncio.run(after()) == 7
        assert not (pg.pgdata / ".s.PGSQL.5432").exists()
    finally:
        pg.stop()
