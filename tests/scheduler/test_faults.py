"""Faults: kill -9 mid-run, two processes on one database, a Postgres restart while runs are due."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, str(Path(__file__).resolve().parent / "scheduler_worker.py")]


READY_WITHIN = 60.0  # seconds for a worker to import, connect and start its scheduler on a loaded machine


class Worker:
    """A scheduler worker process; its stderr goes to a file the test shows when something fails."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path):
        self.proc, self.log = proc, log

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    async def stop(self, sig: int = signal.SIGTERM, within: float = 20.0) -> int:
        """Signal the worker and wait for it without blocking the event loop; kill it if it lingers."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            pytest.fail(f"worker did not exit within {within}s of signal {sig}; its stderr:\n{self.stderr()}")


async def _spawn(dsn: str, owner: str, *extra: str, env: dict[str, str], logs: Path) -> Worker:
    """Start a worker and wait (on the event loop, with a deadline) for it to print ``ready``."""
    log = logs / f"worker-{owner}.stderr"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *WORKER, dsn, owner, *extra, stdout=asyncio.subprocess.PIPE, stderr=err, env=env, cwd=ROOT
        )
    worker = Worker(proc, log)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), READY_WITHIN)
    except TimeoutError:
        line = b"<no line within the deadline>"
    if line.strip() != b"ready":
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        pytest.fail(
            f"worker {owner} did not start: first line {line!r}, exit code {proc.returncode}; "
            f"its stderr:\n{worker.stderr()}"
        )
    return worker


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


async def test_kill_9_mid_run_runs_again_after_the_lease_and_delivers_once(db, db_url, subprocess_env, tmp_path):
    [task_id] = await _due_tasks(db, 1)
    child = await _spawn(db_url, "doomed", "--hang", "--lease", "2", env=subprocess_env, logs=tmp_path)
    try:
        owner = await _wait_for(db, "SELECT lease_owner FROM task_runs WHERE task_id = $1", "doomed", 20.0, task_id)
        assert owner == "doomed", child.stderr()
        await _wait_for(db, "SELECT count(*) FROM turns WHERE kind = 'scheduled'", 1)
    finally:
        await child.stop(signal.SIGKILL)
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


async def test_two_processes_never_run_one_occurrence_twice(db, db_url, subprocess_env, tmp_path):
    ids = await _due_tasks(db, 40)
    # A long lease: a heartbeat delayed by a busy machine must not look like a crash here.
    # Both start together, so both are claiming while the occurrences are due.
    spawned = await asyncio.gather(
        *(_spawn(db_url, f"w{i}", "--lease", "30", env=subprocess_env, logs=tmp_path) for i in range(2)),
        return_exceptions=True,
    )
    workers = [w for w in spawned if isinstance(w, Worker)]
    if len(workers) < len(spawned):
        for w in workers:
            await w.stop()
        raise next(e for e in spawned if isinstance(e, BaseException))
    try:
        done = await _wait_for(db, "SELECT count(*) FROM task_runs WHERE status = 'ran'", 40, 30.0)
    finally:
        for w in workers:
            await w.stop()
    runs = await db.fetch("SELECT id, status, attempts, reason FROM task_runs WHERE attempts <> 1 OR status <> 'ran'")
    why = f"runs: {[dict(r) for r in runs]}\n" + "\n".join(f"{w.log.name}:\n{w.stderr()}" for w in workers)
    assert done == 40, why
    assert await db.fetchval("SELECT count(*) FROM task_runs") == len(ids)
    assert await db.fetchval("SELECT max(attempts) FROM task_runs") == 1, why
    assert await db.fetchval("SELECT count(*) FROM turns WHERE kind = 'scheduled'") == 40
    bodies = [r["body"] for r in await db.fetch("SELECT body FROM messages WHERE direction = 'outbound'")]
    assert len(bodies) == 40
    assert await db.fetchval("SELECT count(DISTINCT key) FROM task_deliveries") == 40


async def test_runs_in_every_slot_share_a_pool_of_one_connection_without_waiting_forever(db_url):
    """A run holds at most one pool connection at a time. A turn that queried the pool while holding
    a connection once deadlocked a process whose runs held the whole pool: their heartbeats starved,
    their leases expired, and another process ran the same occurrences a second time."""
    db = await Database.open(db_url, max_size=1)
    try:
        ids = await _due_tasks(db, 4)
        models = ScriptedModels(default=reply("Your brief."))
        config = SchedulerConfig(slots=4, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=0.05))
        scheduler = Scheduler(HarnessDeps(db=db, models=models), GatewayDeliverer(Settings(), db), config, owner="one")
        assert await asyncio.wait_for(scheduler.run_due(), 30.0) == len(ids)
        runs = await db.fetch("SELECT status, attempts FROM task_runs")
        assert [(r["status"], r["attempts"]) for r in runs] == [("ran", 1)] * len(ids)
        assert await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound'") == len(ids)
    finally:
        await db.close()


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


async def test_a_run_cancelled_while_it_gives_the_conversation_back_still_gives_it_back(db, monkeypatch):
    """The heartbeat cancels a run whose lease it cannot extend, and a run that has just finished is
    no longer running: cancelled while releasing the person's conversation, the release must still
    happen, or every other run (and message) of the person waits out the lease."""
    import text_loop.scheduler.service as service

    await _due_tasks(db, 1)
    release = service.release_hold

    async def cancelled_on_the_way(*args, **kwargs):  # the run is cancelled just as it releases
        [run] = [t for t in asyncio.all_tasks() if t.get_name().startswith("scheduled-turn-")]
        run.cancel()
        await release(*args, **kwargs)

    monkeypatch.setattr(service, "release_hold", cancelled_on_the_way)
    config = SchedulerConfig(slots=1, lease=timedelta(seconds=30), heartbeat=timedelta(seconds=30))
    models = ScriptedModels(default=reply("Your brief."))
    scheduler = Scheduler(HarnessDeps(db=db, models=models), GatewayDeliverer(Settings(), db), config, owner="one")
    with pytest.raises(asyncio.CancelledError):
        await scheduler.run_due()
    assert await db.fetchval("SELECT held_until FROM conversations") is None
