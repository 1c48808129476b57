"""The answering service: availability lookups over a calendar of 5,000 events, and the time from
a call's end to the owner's notification being sent.

* ``check_availability`` (the tool, as a caller's session runs it: free/busy, holds, the owner's
  rules) for a random working day, over Pepper's own calendar with 4,600 single events and 400
  series.
* ``OwnerNotifier.after_call`` for a call with a message: claim the message, build the notice,
  send it as SMS through the Twilio SDK to the loopback Twilio peer. In a real call this starts
  as soon as the session's records are written after the hang-up.

    PYTHONPATH=. .venv/bin/python bench/answering.py [--queries 200] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from answering_service.notify import OwnerNotifier
from answering_service.rules import Rules, parse_hours
from answering_service.tools import CallerCall, make_tools
from core.identity import add_handle, assign_line, create_account
from core.settings import Settings
from core.store import Database
from core.testing.calendar_data import SERIES, SINGLES, fill_calendar
from core.testing.figures import p99
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.twilio_peer import TwilioPeer
from core.tools.context import SessionContext
from core.tools.registry import Tool, ToolContext, ToolOutcome


def _stats(label: str, times: list[float]) -> None:
    times.sort()
    print(f"{label}: median {statistics.median(times):.1f} ms, p99 {p99(times):.1f} ms ({len(times)} runs)")


async def nothing(ctx, args):  # type: ignore[no-untyped-def]
    return ToolOutcome.ok("")


async def bench(queries: int, calls: int) -> None:
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url, max_size=4)
        try:
            account = await create_account(db, "Bench", timezone="Europe/Paris")
            rng = random.Random(5000)
            now = datetime.now(UTC)
            await fill_calendar(db, account.id, now - timedelta(days=30), rng, days=365)
            rules = dataclasses.replace(Rules(account.id, timezone="Europe/Paris"), booking_enabled=True,
                                        working_hours=parse_hours("mon-fri=08:00-18:00"), horizon_days=300)  # fmt: skip
            end_call = Tool("end_call", "", {"type": "object", "properties": {}}, nothing, area="answering")
            tools = {t.name: t for t in make_tools(CallerCall("CAbench", account.id, None, None, rules),
                                                   end_call=end_call)}  # fmt: skip
            session = SessionContext(kind="call", trust="third_party", channel="answering", account_id=account.id)
            times = []
            for n in range(queries + 10):
                day = (now + timedelta(days=rng.randrange(1, 300))).date().isoformat()
                ctx = ToolContext(session, db, datetime.now(UTC))
                t = time.perf_counter()
                await tools["check_availability"].handler(ctx, {"date": day, "appointment_type": "meeting"})
                if n >= 10:
                    times.append((time.perf_counter() - t) * 1000)
            _stats(f"check_availability for one day over {SINGLES + SERIES} events", times)

            await add_handle(db, account.id, "phone", "+14155552671", verified=True)
            await assign_line(db, "+14155550100", "personal", account.id)
            async with TwilioPeer(auth_token="bench-token") as twilio:
                from core.adapters.twilio.rest import TwilioMessenger

                settings = Settings(twilio_account_sid=twilio.account_sid, twilio_auth_token="bench-token",
                                    twilio_api_url=twilio.api_url)  # fmt: skip
                messenger = TwilioMessenger(settings)

                async def send_sms(to: str, from_: str, body: str) -> None:
                    await messenger.send(to=to, from_=from_, body=body, status_callback=None)

                notifier = OwnerNotifier(db, send_sms=send_sms, public_url="https://pepper.example.org")
                times = []
                for n in range(calls):
                    sid = f"CAbench{n:06d}"
                    await db.execute(
                        "INSERT INTO calls (call_sid, account_id, line_number, route) VALUES ($1, $2, $3, 'answering')",
                        sid, account.id, "+14155550100",
                    )  # fmt: skip
                    await db.execute(
                        "INSERT INTO answering_calls (call_sid, account_id, caller, ended_at)"
                        " VALUES ($1, $2, $3, now())",
                        sid, account.id, "+14155559999",
                    )  # fmt: skip
                    await db.execute(
                        "INSERT INTO answering_messages (call_sid, account_id, caller_name, callback_number, reason,"
                        " urgency) VALUES ($1, $2, 'Grace', '+14155559999', 'About the talk', 'normal')",
                        sid, account.id,
                    )  # fmt: skip
                    t = time.perf_counter()
                    await notifier.after_call(sid)
                    times.append((time.perf_counter() - t) * 1000)
                await messenger.close()
                assert len(twilio.sent) == calls
            _stats("call end to the owner's SMS accepted by Twilio (loopback)", times)
        finally:
            await db.close()
            await factory.drop(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(bench(args.queries, args.calls))


if __name__ == "__main__":
    main()
