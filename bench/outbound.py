"""Time from a due task to the Twilio ``Calls`` request, beside a text message in the same run.

100 tasks due at once (each delivering by phone), on the embedded Postgres, run by the real
scheduler on a scripted model that answers at once (no model time), delivering through the gateway's
deliverer and the twilio SDK to the loopback Twilio, which timestamps each request as it arrives.
Pepper's own time per run is from its claim (``task_runs.started_at``) to the ``Calls`` request
reaching Twilio: the scheduled turn, its records, the number check at the point of dialing, the
attempt's row and the SDK request; "deliver" is the delivery alone (the turn done, to the request).
The baseline is the same 100 runs delivering by SMS (the
``Messages`` request), so the difference is what placing a call adds. "Due to request" also counts
the wait for one of the scheduler's run slots.

    PYTHONPATH=. .venv/bin/python bench/outbound.py [--tasks 100] [--slots 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.figures import p99
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, reply
from core.testing.twilio_peer import TwilioPeer
from gateway.composition import outbound_from_settings
from gateway.scheduled import GatewayDeliverer
from text_loop import HarnessDeps
from text_loop.scheduler import Scheduler, SchedulerConfig

TOKEN = "bench-auth-token"
OWNER, LINE = "+14155552671", "+14155550100"


async def _seed(db: Database, account_id, tasks: int, channel: str) -> None:
    await db.execute("TRUNCATE task_runs, scheduled_tasks, outbound_calls RESTART IDENTITY CASCADE")
    await db.execute(
        """
        INSERT INTO scheduled_tasks (account_id, title, prompt, schedule, next_run_at, deliver_to)
        SELECT $1, 'task ' || n, 'Brief me.', '{"kind": "once", "at": "2025-01-01T08:00:00+00:00"}', NULL,
               ARRAY[$3]
        FROM generate_series(1, $2) n
        """,
        account_id,
        tasks,
        channel,
    )
    await db.execute(
        "INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at) SELECT id, now(), now(), now()"
        " FROM scheduled_tasks"
    )


class TimedDeliverer(GatewayDeliverer):
    """The gateway's deliverer, noting when each delivery starts (the scheduled turn is done)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started: list[float] = []

    async def deliver(self, request):
        self.started.append(time.time())
        return await super().deliver(request)


async def _round(db: Database, settings: Settings, twilio: TwilioPeer, account_id, args, channel: str):
    await _seed(db, account_id, args.tasks, channel)
    twilio.calls.clear()
    twilio.sent.clear()
    models = ScriptedModels(default=reply("Your day: three meetings and no deadlines."))
    outbound = outbound_from_settings(settings, db)
    messenger = None
    if channel == "sms":
        from core.adapters.twilio.rest import TwilioMessenger

        messenger = TwilioMessenger(settings)
    deliverer = TimedDeliverer(settings, db, messenger, outbound=outbound)
    config = SchedulerConfig(slots=args.slots, lease=timedelta(minutes=5), catch_up=timedelta(days=1))
    scheduler = Scheduler(HarnessDeps(db=db, models=models), deliverer, config)
    try:
        ran = await scheduler.run_due()
    finally:
        await outbound.aclose()
        if messenger is not None:
            await messenger.close()
    assert ran == args.tasks, ran
    arrivals = [c.received_at for c in twilio.calls] if channel == "call" else [m.received_at for m in twilio.sent]
    assert len(arrivals) == args.tasks, len(arrivals)
    rows = await db.fetch("SELECT started_at, due_at FROM task_runs ORDER BY started_at")
    # Requests and runs in the same order: each run's request leaves it in its slot, the runs in
    # claim order; matched by rank, the k-th request to the k-th claim (a lower bound on neither).
    started = sorted(r["started_at"].timestamp() for r in rows)
    due = rows[0]["due_at"].timestamp()
    own = [(a - s) * 1000 for a, s in zip(sorted(arrivals), started, strict=True)]
    waited = [(a - due) * 1000 for a in arrivals]
    delivering = [(a - s) * 1000 for a, s in zip(sorted(arrivals), sorted(deliverer.started), strict=True)]
    return own, waited, delivering


def _line(label: str, values: list[float]) -> str:
    return f"{label:<34} median {statistics.median(values):8.1f} ms   p99 {p99(values):8.1f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url, max_size=args.slots + 4)
        async with TwilioPeer(auth_token=TOKEN) as twilio:
            settings = Settings(database_url=url, public_url="https://pepper.example.org",
                                twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
                                twilio_api_url=twilio.api_url)  # fmt: skip
            account = await identity.create_account(db, "Bench", timezone="UTC")
            await identity.add_handle(db, account.id, "phone", OWNER, verified=True)
            await identity.assign_line(db, LINE, "personal", account.id)
            try:
                print(f"{args.tasks} due tasks, {args.slots} run slots, scripted model, loopback Twilio, "
                      f"embedded Postgres, {datetime.now(UTC):%Y-%m-%d}")  # fmt: skip
                figures: dict[str, tuple[list[float], ...]] = {"call": ([], [], []), "sms": ([], [], [])}
                for _ in range(args.rounds):
                    for channel in ("sms", "call"):
                        measured = await _round(db, settings, twilio, account.id, args, channel)
                        for into, values in zip(figures[channel], measured, strict=True):
                            into.extend(values)
                print(_line("baseline: claim -> Messages request", figures["sms"][0]))
                print(_line("call: claim -> Calls request", figures["call"][0]))
                print(_line("baseline: due -> Messages request", figures["sms"][1]))
                print(_line("call: due -> Calls request", figures["call"][1]))
                print(_line("baseline: deliver -> Messages request", figures["sms"][2]))
                print(_line("call: deliver -> Calls request", figures["call"][2]))
            finally:
                await db.close()


if __name__ == "__main__":
    asyncio.run(main())
