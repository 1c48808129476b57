"""Claims per second with concurrent workers over many due occurrences, and double claims.

20,000 due occurrences (one per task) on the embedded Postgres; 8 workers, each on its own
connection, claim with ``core.scheduling.runs.claim`` (``FOR UPDATE SKIP LOCKED`` and a
lease) until none is left. Prints claims per second, the median and p99 time of one claim call,
and the number of occurrences claimed more than once (from the workers' tallies and from the
store's ``attempts``).

    PYTHONPATH=. .venv/bin/python bench/scheduler.py [--tasks 20000] [--workers 8] [--batch 1 4 16] [--no-flush]

Each claim call is one transaction; with batch 1 its commit flush dominates on a slow disk. The
scheduler claims up to its free run slots per call (``SchedulerConfig.slots``, 4 by default).

Target: >= 2,000 claims/s and 0 double claims.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from core.identity import create_account
from core.scheduling.runs import claim
from core.store import Database
from core.testing.postgres import DatabaseFactory, test_server


async def _seed(db: Database, tasks: int) -> None:
    account = await create_account(db, "Bench", timezone="Europe/Paris")
    await db.execute("TRUNCATE task_runs, scheduled_tasks RESTART IDENTITY CASCADE")
    await db.execute(
        """
        INSERT INTO scheduled_tasks (account_id, title, prompt, schedule, next_run_at)
        SELECT $1, 'task ' || n, 'Brief me.', '{"kind": "daily", "days": [0,1,2,3,4,5,6], "at": "08:00"}', now()
        FROM generate_series(1, $2) n
        """,
        account.id,
        tasks,
    )
    await db.execute(
        """
        INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at)
        SELECT id, now() - interval '1 minute', due, due
        FROM (SELECT id, now() - interval '1 minute' - (id % 300) * interval '1 second' AS due FROM scheduled_tasks) s
        """
    )
    await db.execute("ANALYZE task_runs")


async def _round(db: Database, workers: int, batch: int) -> tuple[float, list[float], int, int]:
    claimed: Counter[int] = Counter()
    latencies: list[float] = []
    now = datetime.now(UTC)

    async def worker(n: int) -> None:
        async with db.pool.acquire() as conn:
            while True:
                started = time.perf_counter()
                got = await claim(conn, f"bench-{n}", now, lease=timedelta(minutes=5), limit=batch)
                latencies.append((time.perf_counter() - started) * 1000)
                if not got:
                    return
                claimed.update(c.run_id for c in got)

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(workers)))
    elapsed = time.perf_counter() - started
    doubles = sum(1 for count in claimed.values() if count > 1)
    doubles += await db.fetchval("SELECT count(*) FROM task_runs WHERE attempts > 1")
    return len(claimed) / elapsed, latencies, doubles, len(claimed)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--no-flush", action="store_true", help="run with synchronous_commit off")
    args = parser.parse_args()
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        if args.no_flush:
            from urllib.parse import urlsplit

            admin = await Database.open(url, max_size=1)
            await admin.execute(f'ALTER DATABASE "{urlsplit(url).path.lstrip("/")}" SET synchronous_commit = off')
            await admin.close()
        db = await Database.open(url, max_size=args.workers + 1)
        try:
            flush = "synchronous_commit off" if args.no_flush else "commits flushed to disk"
            print(f"{args.tasks} due occurrences, {args.workers} workers, embedded Postgres, {flush}")
            for batch in args.batch:
                await _seed(db, args.tasks)
                rate, latencies, doubles, total = await _round(db, args.workers, batch)
                p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 100 else max(latencies)
                print(
                    f"batch {batch:>3}: {rate:8.0f} claims/s  claimed {total}  "
                    f"claim call median {statistics.median(latencies):.2f} ms  p99 {p99:.2f} ms  "
                    f"double claims {doubles}"
                )
        finally:
            await db.close()
    print("target: >= 2000 claims/s, 0 double claims")


if __name__ == "__main__":
    asyncio.run(main())
