"""Faults: kill -9 mid-run, two processes on one database, a Postgres restart while runs are due."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from core.identity import create_account
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.settings import Settings
from core.store import Database
from core.testing.scripted import ScriptedModels, reply
from gateway.scheduled import GatewayDeliverer
from text_loop import HarnessDeps
from text_loop.scheduler import Scheduler, SchedulerConfig

WORKER = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scheduler_worker.py")]


def _spawn(dsn: str, owner: str, *extra: str, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*WORKER, dsn, owner, *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def _due_tasks(db: Database, n: int) -> list[int]:
    account = await create_account(db, "Ada", timezone="Europe/Paris")
    ids = []
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    async with db.transaction() as conn:
        for i in range(n):
            task = await create_task(
                conn, account.id, title=f"t{i}", prompt="Brief me.", now=now,
                schedule=parse_schedule("in 1 minutes", now=now, timezone="Europe/Paris"),
            )  # fmt: skip
            ids.append(task.id)
        await conn.execute("UPDATE scheduled_tasks SET next_run_at = now() - interval '1 second'")
    return ids


async def _wait_for(db: Database, query: str, expected, within: float = 20.0, *args):
    deadline = time.monotonic() + within
    while True:
        value = await db.fetchval(query, *args)
        if value == expected or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def test_kill_9_mid_run_runs_again_after_the_lease_and_delivers_once(db, db_url, subprocess_env):
    [task_id] = await _due_tasks(db, 1)
    child = _spawn(db_url, "doomed", "--hang", "--lease", "2", env=subprocess_env)
    try:
        owner = await _wait_for(db, "SELECT lease_owner FROM task_runs WHERE task_id = $1", "doomed", 20.0, task_id)
        assert owner == "doomed"
        await _wait_for(db, "SELECT count(*) FROM turns WHERE kind = 'scheduled'", 1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
    models = ScriptedModels(default=reply("Your brief."))
    config = SchedulerConfig(lease=timedelta(seconds=2), heartbeat=timedelta(seconds=0.5))
    survivor = Scheduler(HarnessDeps(db=db, models=models), GatewayDeliverer(Settings(), db), config, owner="survivor")
    assert await survivor.run_due() == 0  # the dead process's lease still holds
    await asyncio.sleep(2.1)
    assert await survivor.run_due() == 1
    run = await db.fetchrow("SELECT status, attempts, lease_owner FROM task_runs WHERE task_id = $1", task_id)
    assert (run["status"], run["attempts"], run["lease_owner"]) == ("ran", 2, None)
    assert [r["body"] for r in await db.fetch("SELECT body FROM messages WHERE direction = 'outbound'")] == [
        "Your brief."
    ]
    assert await survivor.run_due() == 0


async def test_two_processes_never_run_one_occurrence_twice(db, db_url, subprocess_env):
    ids = await _due_tasks(db, 40)
    # A long lease: a heartbeat delayed by a busy machine must not look like a crash here.
    workers = [_spawn(db_url, f"w{i}", "--lease", "30", env=subprocess_env) for i in range(2)]
    try:
        done = await _wait_for(db, "SELECT count(*) FROM task_runs WHERE status = 'ran'", 40, 30.0)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=20)
            w.stdout.close()  # type: ignore[union-attr]
    assert done == 40
    assert await db.fetchval("SELECT count(*) FROM task_runs") == len(ids)
    assert await db.fetchval("SELECT max(attempts) FROM task_runs") == 1
    assert await db.fetchval("SELECT count(*) FROM turns WHERE kind = 'scheduled'") == 40
    bodies = [r["body"] for r in await db.fetch("SELECT body FROM messages WHERE direction = 'outbound'")]
    assert len(bodies) == 40
    assert await db.fetchval("SELECT count(DISTINCT key) FROM task_deliveries") == 40


@pytest.fixture
def own_postgres(tmp_path_factory):
    from core.store.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path_factory.mktemp("restart"))
    dsn = pg.start()
    yield pg, dsn
    pg.stop()


async def test_a_postgres_restart_while_runs_are_due_loses_nothing(own_postgres):
    pg, dsn = own_postgres
    db = await Database.open(dsn, max_size=2)
    try:
        ids = await _due_tasks(db, 3)
        models = ScriptedModels(default=reply("Your brief."))
        config = SchedulerConfig(poll=0.1, error_backoff=0.1, lease=timedelta(seconds=5))
        scheduler = Scheduler(HarnessDeps(db=db, models=models), GatewayDeliverer(Settings(), db), config)
        await asyncio.to_thread(pg.stop)
        scheduler.start()
        await asyncio.sleep(1.0)  # ticks fail while the database is down; the loop keeps going
        assert scheduler._loop_task is not None and not scheduler._loop_task.done()
        await asyncio.to_thread(pg.start)
        ran = await _wait_for(db, "SELECT count(*) FROM task_runs WHERE status = 'ran'", len(ids), 30.0)
        await scheduler.stop(5)
        assert ran == len(ids)
        assert await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound'") == len(ids)
    finally:
        await db.close()
