"""A scheduler in a process of its own, for fault tests (kill -9, several processes on one database).

    python tests/scheduler/scheduler_worker.py DSN OWNER [--hang] [--lease SECONDS]

Runs the real scheduler and the real harness against ``DSN`` with a model that answers
"brief from OWNER" (or, with ``--hang``, never answers), delivering to chat, until SIGTERM.
Prints ``ready`` once the scheduler runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from datetime import timedelta

from core.models.types import Prompt
from core.settings import Settings
from core.store import Database
from core.testing.scripted import reply


class _Model:
    def __init__(self, owner: str, hang: bool):
        self.owner, self.hang = owner, hang

    async def generate(self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False):
        if self.hang:
            await asyncio.sleep(3600)
        return reply(f"brief from {self.owner}")


async def main(argv: list[str]) -> None:
    from gateway.scheduled import GatewayDeliverer
    from text_loop import HarnessDeps
    from text_loop.scheduler import Scheduler, SchedulerConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("owner")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    db = await Database.open(args.dsn, max_size=4)
    deps = HarnessDeps(db=db, models=_Model(args.owner, args.hang))  # type: ignore[arg-type]
    config = SchedulerConfig(
        lease=timedelta(seconds=args.lease), heartbeat=timedelta(seconds=args.lease / 4), poll=0.1, slots=4
    )
    scheduler = Scheduler(deps, GatewayDeliverer(Settings(), db), config, owner=args.owner)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    scheduler.start()
    print("ready", flush=True)
    await stop.wait()
    await scheduler.stop(5)
    await db.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
