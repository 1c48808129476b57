"""SMS webhook acknowledgement latency at a steady request rate, and the duplicate storm's outcome.

    .venv/bin/python bench/sms_webhook.py [--rate 200] [--seconds 10]

Pepper runs on a real socket over an embedded Postgres; a loopback Twilio signs each webhook and
receives the replies; a loopback OpenAI answers the turns the webhooks start. Requests are sent
open-loop at ``--rate`` per second, each a new signed message from the verified owner. The figure
is the time from sending a webhook to receiving Pepper's empty-TwiML acknowledgement (target p99
<= 20 ms). As a baseline, the same rate against ``/healthz`` (the framework plus one database
round trip) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import aiohttp

from core import identity
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.twilio_peer import TwilioPeer

TOKEN = "bench-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def open_loop(rate: int, seconds: float, send) -> list[float]:  # type: ignore[no-untyped-def]
    latencies: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        await send(i)
        latencies.append((time.perf_counter() - started) * 1000)

    tasks = []
    begin = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i), name=f"bench-request-{i}"))
    await asyncio.gather(*tasks)
    return latencies


async def main(rate: int, seconds: float) -> None:
    with test_server() as admin_dsn:
        factory = DatabaseFactory(admin_dsn)
        await factory.prepare_template()
        db_url = await factory.create()
        db = await Database.open(db_url, max_size=20)
        ada = await identity.create_account(db, "Ada")
        await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
        async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
            results: list = []
            model.script(*(reply_text("ok") for _ in range(int(rate * seconds) * 2 + 200)))
            port = free_port()
            env = {
                **os.environ, "DATABASE_URL": db_url, "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_PORT": str(port),
                "PEPPER_MEDIA_PORT": "0",
                "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
                "PEPPER_TWILIO_API_URL": twilio.api_url, "OPENAI_API_KEY": "sk-bench",
                "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "60",
            }  # fmt: skip
            server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=subprocess.DEVNULL
            )
            try:
                await wait_healthy(port)
                await run_all(port, db, twilio, results, rate, seconds)
            finally:
                server.send_signal(signal.SIGTERM)
                await asyncio.wait_for(server.wait(), 120)
        await db.close()
    baseline, acks, storm_turns, storm_sent = results

    print(f"SMS webhook acknowledgement, {rate} req/s for {seconds:.0f} s ({len(acks)} requests), ms")
    print(f"{'':28} {'median':>8} {'p99':>8}")
    print(f"{'baseline: GET /healthz':28} {statistics.median(baseline):8.2f} {p99(baseline):8.2f}")
    print(f"{'POST /twilio/sms (ack)':28} {statistics.median(acks):8.2f} {p99(acks):8.2f}")
    print(f"target p99 <= 20 ms -> {'met' if p99(acks) <= 20 else 'NOT met'}")
    print(f"duplicate storm (50 x one MessageSid): {storm_turns} turn(s), {storm_sent} reply(ies)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_healthy(port: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("pepper serve did not become healthy")


async def run_all(port, db, twilio, results, rate, seconds) -> None:  # type: ignore[no-untyped-def]
    local = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def health(_: int) -> None:
            async with session.get(local + "/healthz") as response:
                assert response.status == 200, await response.text()

        async def webhook(i: int) -> None:
            form = twilio.inbound_message(sender=OWNER, to=LINE, body=f"message {i}")
            status, _ = await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
            assert status == 200, status

        baseline = await open_loop(rate, seconds, health)
        acks = await open_loop(rate, seconds, webhook)
        await twilio.wait_for_sent(len(acks), within=600)

        # The duplicate storm: 50 concurrent deliveries of one MessageSid.
        before_turns = await db.fetchval("SELECT count(*) FROM turns")
        before_sent = len(twilio.sent)
        form = twilio.inbound_message(sender=OWNER, to=LINE, body="storm")
        await asyncio.gather(
            *(twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session) for _ in range(50))
        )
        await twilio.wait_for_sent(before_sent + 1, within=60)
        await asyncio.sleep(1.0)
        storm_turns = await db.fetchval("SELECT count(*) FROM turns") - before_turns
        storm_sent = len(twilio.sent) - before_sent
    results.extend([baseline, acks, storm_turns, storm_sent])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds))
