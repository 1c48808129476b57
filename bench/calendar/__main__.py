"""Free/busy over one month for a calendar of 5,000 events, some of them recurring.

The calendar (Pepper's own, in Postgres) holds 4,600 single events spread over two years and
400 series (daily, weekdays, weekly, monthly; in Europe/Paris, so the month crosses a DST
change). Each query asks ``free_busy`` for a random 30-day window inside the year and includes
the Postgres round trips and the recurrence expansion. Prints the median and p99, beside a
baseline from the same run: the same windows read as raw rows in one query (Postgres alone, no
recurrence expansion, no merging).

    PYTHONPATH=. .venv/bin/python bench/calendar [--queries 200]

A folder run as a script, not ``bench/calendar.py``: a file of that name would be found as the
standard library's ``calendar`` by every other script run from ``bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from core.identity import create_account
from core.testing.calendar_data import SERIES, SINGLES, fill_calendar
from core.testing.figures import ms_figures
from core.testing.postgres import bench_database
from core.tools.areas.calendar import free_busy

# The baseline: every row the window touches, singles and series alike, straight from Postgres.
RAW = """
SELECT starts_at, ends_at, rrule FROM calendar_events
WHERE account_id = $1 AND status = 'confirmed' AND starts_at < $3
  AND (ends_at > $2 OR (rrule IS NOT NULL AND (series_until IS NULL OR series_until > $2)))
"""


async def bench(queries: int) -> None:
    async with bench_database() as db:
        account = await create_account(db, "Bench", timezone="Europe/Paris")
        rng = random.Random(5000)
        t0 = time.perf_counter()
        await fill_calendar(db, account.id, datetime(2025, 1, 1, tzinfo=UTC), rng, days=730)
        print(f"filled {SINGLES + SERIES} events in {time.perf_counter() - t0:.1f} s")
        times, baseline, intervals = [], [], []
        for n in range(queries + 10):
            start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(days=rng.randrange(0, 335))
            end = start + timedelta(days=30)
            t = time.perf_counter()
            await db.fetch(RAW, account.id, start, end)
            t_raw = time.perf_counter()
            busy = await free_busy(db, account.id, start, end)
            if n >= 10:  # warm-up
                baseline.append((t_raw - t) * 1000)
                times.append((time.perf_counter() - t_raw) * 1000)
                intervals.append(len(busy))
        print(f"{queries} queries over 30-day windows (busy intervals per month: "
              f"median {statistics.median(intervals):.0f})")  # fmt: skip
        print(f"  free_busy            {ms_figures(times)}")
        print(f"  baseline (raw rows)  {ms_figures(baseline)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(bench(args.queries))


if __name__ == "__main__":
    main()
