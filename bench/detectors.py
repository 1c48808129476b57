"""The calendar's detectors over one busy week: 200 events (a tenth of them overlapping, most
at one of ten saved places), 30 open todos (some with due dates or lengths), 20 notes and 20
mails in Pepper's inbox (some with dates, two with invitations).

Each run is ``run_detectors`` for the week with every detector promoted: the snapshot (events,
todos, notes, mail), the five detectors, the travel-time estimates (offline: straight-line
distance) and the upsert of what they found. Prints the median and p99 beside a baseline from
the same run: ``list_events`` for the same week, just loading the events.

    PYTHONPATH=. .venv/bin/python bench/detectors.py [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from core.identity import add_handle, create_account
from core.quality.detectors import SUGGESTERS, promote
from core.store import Database
from core.suggestions import run_detectors
from core.testing.figures import ms_figures
from core.testing.postgres import bench_database
from core.tools.areas.calendar import list_events
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event
from core.tools.areas.places import save_place
from core.tools.connectors import Connectors

START = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)  # a Monday
WEEK = timedelta(days=7)
PLACES = [(f"Place {i}", 48.80 + i * 0.01, 2.25 + i * 0.015) for i in range(10)]
INVITE = (
    "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nMETHOD:REQUEST\r\nPRODID:-//bench//EN\r\nBEGIN:VEVENT\r\nUID:{uid}\r\n"
    "DTSTAMP:20260301T000000Z\r\nDTSTART:20260305T170000Z\r\nDTEND:20260305T180000Z\r\nSUMMARY:Invited {uid}\r\n"
    "END:VEVENT\r\nEND:VCALENDAR\r\n"
)


async def fill(db: Database, account_id, rng: random.Random) -> None:  # type: ignore[no-untyped-def]
    calendar_id = await ensure_pepper_calendar(db, account_id)
    for label, lat, lon in PLACES:
        await save_place(db, account_id, label, lat, lon)
    conversation = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account_id)
    async with db.pool.acquire() as conn, conn.transaction():
        for i in range(200):
            day = rng.randrange(7)
            start = START + timedelta(days=day, minutes=30 * rng.randrange(0, 24))
            end = start + timedelta(minutes=rng.choice((30, 45, 60, 90)))
            location = rng.choice(PLACES)[0] if rng.random() < 0.7 else None
            await insert_event(conn, account_id, calendar_id, title=f"Meeting {i}", start=start, end=end,
                               tzid="Europe/Paris", location=location)  # fmt: skip
        for i in range(30):
            title = rng.choice((f"Task {i}", f"Report {i} due 6 March", f"Call {i} (30 min)", f"Essay {i} (2h)"))
            await conn.execute("INSERT INTO todos (account_id, title) VALUES ($1, $2)", account_id, title)
        for i in range(20):
            body = f"Note {i}: the form is due 5 March" if i % 4 == 0 else f"Note {i}: nothing dated"
            await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, $2)", account_id, body)
        for i in range(20):
            text = f"Dinner {i} on 4 March at 19:30?" if i % 3 == 0 else f"Just a message {i}."
            meta = {"sender": "ada@example.org", "subject": f"Mail {i}", "text": text,
                    "calendars": [INVITE.format(uid=f"u{i}")] if i < 2 else []}  # fmt: skip
            await conn.execute(
                "INSERT INTO messages (conversation_id, channel, direction, body, meta, created_at)"
                " VALUES ($1, 'email', 'inbound', $2, $3::jsonb, $4)",
                conversation, text, json.dumps(meta), START - timedelta(hours=i),
            )  # fmt: skip


async def bench(runs: int) -> None:
    async with bench_database() as db:
        account = await create_account(db, "Bench", timezone="Europe/Paris")
        await add_handle(db, account.id, "email", "ada@example.org", verified=True)
        await fill(db, account.id, random.Random(200))
        for name in SUGGESTERS:
            await promote(db, name, START)
        connectors = Connectors()
        tz = ZoneInfo("Europe/Paris")
        times, baseline = [], []
        report = None
        for n in range(runs + 5):
            t = time.perf_counter()
            listing = await list_events(db, connectors, account.id, START, START + WEEK, tz)
            t_base = time.perf_counter()
            report = await run_detectors(db, connectors, account.id, START, window=WEEK)
            if n >= 5:  # warm-up
                baseline.append((t_base - t) * 1000)
                times.append((time.perf_counter() - t_base) * 1000)
        assert report is not None
        found = ", ".join(f"{k} {v}" for k, v in report.found.items())
        print(f"{runs} runs over one week of {len(listing.events)} events; found per run: {found}")
        print(f"  run_detectors (all five)   {ms_figures(times)}")
        print(f"  baseline (list_events)     {ms_figures(baseline)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    asyncio.run(bench(parser.parse_args().runs))


if __name__ == "__main__":
    main()
