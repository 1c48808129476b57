"""A busy synthetic calendar for the benchmarks: 4,600 single events and 400 recurring series in
Europe/Paris (so any month-long window can cross a DST change), in Pepper's own calendar."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from core.store import Database
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event

SINGLES, SERIES = 4600, 400
RULES = ("FREQ=DAILY", "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR", "FREQ=WEEKLY", "FREQ=MONTHLY;COUNT=24")


async def fill_calendar(db: Database, account_id: Any, origin: datetime, rng: random.Random, *, days: int) -> None:
    """Singles on 15-minute boundaries over ``days`` from ``origin``; series starting in its first year."""
    calendar_id = await ensure_pepper_calendar(db, account_id)
    async with db.pool.acquire() as conn, conn.transaction():
        for i in range(SINGLES):
            start = origin + timedelta(minutes=15 * rng.randrange(0, 4 * 24 * days))
            end = start + timedelta(minutes=rng.choice((15, 30, 60, 90)))
            await insert_event(conn, account_id, calendar_id, title=f"e{i}", start=start, end=end, tzid="Europe/Paris")
        for i in range(SERIES):
            start = origin + timedelta(days=rng.randrange(0, 365), hours=rng.randrange(7, 19))
            await insert_event(
                conn, account_id, calendar_id, title=f"s{i}", start=start, end=start + timedelta(minutes=45),
                tzid="Europe/Paris", rrule=RULES[i % len(RULES)],
            )  # fmt: skip
