"""SMS webhook acknowledgement latency at a steady request rate, and the duplicate storm's outcome.

    .venv/bin/python bench/sms_webhook.py [--rate 200] [--seconds 10]

``pepper serve`` runs as a user runs it, in its own process with its turn-worker processes
(``PEPPER_TURN_WORKERS``, default 2), over a Postgres of its own; a loopback Twilio receives the
replies and a loopback OpenAI answers the turns the webhooks start (both in this process). The
load comes from a third process, so neither the peers nor the server slow the clock that
measures: requests are sent open-loop at ``--rate`` per second, each a new message from the
verified owner, signed as Twilio signs. The figure is the time from sending a webhook to
receiving Pepper's empty-TwiML acknowledgement (target p99 <= 20 ms), measured while the turns
of the earlier webhooks run. As a baseline, the same rate against ``/healthz`` (the framework
plus one database round trip) in the same run. Beside the latencies, the web server's CPU time
per request (from ``/proc``), which a busy machine inflates far less than latency.
``BENCH_SERVER_LOG=path`` keeps the server's log.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import multiprocessing
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


async def open_loop(rate: int, seconds: float, send) -> tuple[list[float], int]:  # type: ignore[no-untyped-def]
    """Latencies in ms of every request (failed ones too), and how many failed."""
    latencies: list[float] = []
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        started = time.perf_counter()
        try:
            ok = await send(i)
        except aiohttp.ClientError:  # refused or dropped: a failure, counted with its time
            ok = False
        failed += not ok
        latencies.append((time.perf_counter() - started) * 1000)

    tasks = []
    begin = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i), name=f"bench-request-{i}"))
    await asyncio.gather(*tasks)
    return latencies, failed


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
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=server_log()
            )
            try:
                await wait_healthy(port)
                await run_all(port, db, twilio, results, rate, seconds, server.pid)
            finally:
                server.send_signal(signal.SIGTERM)
                await asyncio.wait_for(server.wait(), 120)
        await db.close()
    (baseline, baseline_failed), (acks, acks_failed), storm_turns, storm_sent, cpu_ms = results

    print(f"SMS webhook acknowledgement, {rate} req/s for {seconds:.0f} s ({len(acks)} requests), ms")
    print(f"{'':28} {'median':>8} {'p99':>8} {'failed':>7} {'server CPU/req':>15}")
    for name, (values, failed), cpu in (
        ("baseline: GET /healthz", (baseline, baseline_failed), cpu_ms[0]),
        ("POST /twilio/sms (ack)", (acks, acks_failed), cpu_ms[1]),
    ):
        print(f"{name:28} {statistics.median(values):8.2f} {p99(values):8.2f} {failed:7} {cpu:15.2f}")
    print(f"target p99 <= 20 ms -> {'met' if p99(acks) <= 20 and not acks_failed else 'NOT met'}")
    print(f"duplicate storm (50 x one MessageSid): {storm_turns} turn(s), {storm_sent} reply(ies)")


def server_log():  # type: ignore[no-untyped-def]
    path = os.environ.get("BENCH_SERVER_LOG")
    return open(path, "w") if path else subprocess.DEVNULL


def load(port: int, kind: str, rate: int, seconds: float) -> tuple[list[float], int]:
    """In the load process: ``rate`` requests a second for ``seconds``; their latencies in ms."""
    return asyncio.run(_load(port, kind, rate, seconds))


async def _load(port: int, kind: str, rate: int, seconds: float) -> tuple[list[float], int]:
    local = f"http://127.0.0.1:{port}"
    signer = TwilioPeer(auth_token=TOKEN)  # not started: it only builds and signs the forms
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def health(_: int) -> bool:
            async with session.get(local + "/healthz") as response:
                await response.read()
                return response.status == 200

        async def webhook(i: int) -> bool:
            form = signer.inbound_message(sender=OWNER, to=LINE, body=f"message {i}")
            status, _ = await signer.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
            return status == 200

        return await open_loop(rate, seconds, health if kind == "health" else webhook)


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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_all(port, db, twilio, results, rate, seconds, server_pid) -> None:  # type: ignore[no-untyped-def]
    local = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # Steady state, as a server that has been up a while: the turn workers are up and answering.
        form = twilio.inbound_message(sender=OWNER, to=LINE, body="warm-up")
        await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
        await twilio.wait_for_sent(1, within=120)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            cpu = [cpu_seconds(server_pid)]
            baseline = await loop.run_in_executor(pool, load, port, "health", rate, seconds)
            cpu.append(cpu_seconds(server_pid))
            acks = await loop.run_in_executor(pool, load, port, "sms", rate, seconds)
            cpu.append(cpu_seconds(server_pid))
        cpu_ms = [(cpu[1] - cpu[0]) * 1000 / len(baseline[0]), (cpu[2] - cpu[1]) * 1000 / len(acks[0])]
        await twilio.wait_for_sent(1 + len(acks[0]) - acks[1], within=600)

        # The duplicate storm: 50 concurrent deliveries of one MessageSid, once every earlier
        # message is answered (an acknowledgement that timed out may still have been recorded).
        for _ in range(3000):
            if not await db.fetchval("SELECT count(*) FROM messages WHERE handling IN ('queued', 'running')"):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
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
    results.extend([baseline, acks, storm_turns, storm_sent, cpu_ms])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds))
