"""Free/busy over one month for a calendar of 5,000 events, some of them recurring.

The calendar (Pepper's own, in Postgres) holds 4,600 single events spread over two years and
400 series (daily, weekdays, weekly, monthly; in Europe/Paris, so the month crosses a DST
change). Each query asks ``free_busy`` for a random 30-day window inside the year and includes
the Postgres round trips and the recurrence expansion. Prints the median and p99.

    PYTHONPATH=. .venv/bin/python bench/calendar.py [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from core.identity import create_account
from core.store import Database
from core.testing.postgres import DatabaseFactory, test_server
from core.tools.areas.calendar import free_busy
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event

SINGLES = 4600
SERIES = 400
RULES = ("FREQ=DAILY", "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR", "FREQ=WEEKLY", "FREQ=MONTHLY;COUNT=24")


async def fill(db: Database, account_id, rng: random.Random) -> None:
    calendar_id = await ensure_pepper_calendar(db, account_id)
    origin = datetime(2025, 1, 1, tzinfo=UTC)
    async with db.pool.acquire() as conn, conn.transaction():
        for i in range(SINGLES):
            start = origin + timedelta(minutes=15 * rng.randrange(0, 4 * 24 * 730))
            end = start + timedelta(minutes=rng.choice((15, 30, 60, 90)))
            await insert_event(conn, account_id, calendar_id, title=f"e{i}", start=start, end=end, tzid="Europe/Paris")
        for i in range(SERIES):
            start = origin + timedelta(days=rng.randrange(0, 365), hours=rng.randrange(7, 19))
            await insert_event(
                conn, account_id, calendar_id, title=f"s{i}", start=start, end=start + timedelta(minutes=45),
                tzid="Europe/Paris", rrule=RULES[i % len(RULES)],
            )  # fmt: skip


async def bench(queries: int) -> None:
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url, max_size=2)
        try:
            account = await create_account(db, "Bench", timezone="Europe/Paris")
            rng = random.Random(5000)
            t0 = time.perf_counter()
            await fill(db, account.id, rng)
            print(f"filled {SINGLES + SERIES} events in {time.perf_counter() - t0:.1f} s")
            times, intervals = [], []
            for n in range(queries + 10):
                start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(days=rng.randrange(0, 335))
                t = time.perf_counter()
                busy = await free_busy(db, account.id, start, start + timedelta(days=30))
                if n >= 10:  # warm-up
                    times.append((time.perf_counter() - t) * 1000)
                    intervals.append(len(busy))
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(
                f"free_busy over 30 days, {queries} queries: median {statistics.median(times):.1f} ms, "
                f"p99 {p99:.1f} ms (busy intervals per month: median {statistics.median(intervals):.0f})"
            )
        finally:
            await db.close()
            await factory.drop(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(bench(args.queries))


if __name__ == "__main__":
    main()
