"""Load (issue 31, suite 6): SMS webhook deliveries at a steady rate into one ``pepper serve``,
from many senders, every distinct message delivered many times over.

"50 duplicates per message" is read as Twilio's retries: every distinct message (one
``MessageSid``) is delivered ``duplicates`` times, all signed alike. The deliveries come in
generations of one new message per sender; a generation's deliveries (``senders`` messages times
``duplicates``) are shuffled over its share of the run, so each message's copies arrive spread
out, some close together, some concurrent with its first. At 200 deliveries a second for 60 s
from 100 senders with 50 copies: 12,000 deliveries of 240 distinct messages.

The load comes from a process of its own (``multiprocessing``, spawned before anything else
runs), so neither the peers nor the checks slow the clock that measures: a plain aiohttp client
with keep-alive, the forms encoded and signed (``core.adapters.twilio`` signatures) before the
clock starts, sent open loop. Every request's time from sending to the acknowledgement is kept;
as a baseline, the same rate of ``GET /healthz`` (the framework and one database round trip)
against the same server in the same run, just before.

What is checked, from the outside (loopback Twilio and the store):
- every delivery is acknowledged (2xx), every distinct message recorded once and in one finished
  turn, each turn answered by exactly one reply (sent to the Twilio peer once): no message lost,
  none answered twice (``core.testing.postgres_restart.verify``);
- a burst, the texts one sender sent before Pepper took them up, is answered by one turn: each
  turn's texts are one sender's, consecutive in the order they arrived, no turn was started by a
  copy (a turn per distinct burst, never one per delivery), and one sender's turns never overlap;
- the acknowledgements' p99 is at most ``P99_TARGET_MS`` (reported; the script fails on it, the
  CI-sized test does not time anything).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from urllib.parse import urlencode

import aiohttp

from core import identity
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DISPOSABLE_SERVER, DatabaseFactory
from core.testing.postgres_restart import LINE, OWNER, PUBLIC, TOKEN, verify
from core.testing.processes import free_port
from core.testing.suite import SuiteResult, harness, healthy, processes, spawn_serve, texts_settled
from core.testing.twilio_peer import TwilioPeer
from core.vault import generate_key

P99_TARGET_MS = 20.0

# What the load process sends back: latencies (ms), statuses, CPU seconds, wall seconds, when it began.
LoadRun = tuple[list[float], list[int], float, float, float]


@dataclass
class Result(SuiteResult):
    lost: int = 0
    duplicates: int = 0
    deliveries: int = 0
    distinct: int = 0
    copies: int = 0
    refused: int = 0  # deliveries not acknowledged with 2xx
    turns: int = 0
    replies: int = 0
    bursts: int = 0  # seen from outside: a sender's texts with no reply to them in between
    acks: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    load_cpu: float = 0.0
    load_seconds: float = 0.0

    @property
    def met(self) -> bool:
        return bool(self.acks) and p99(self.acks) <= P99_TARGET_MS and not self.refused

    def summary(self) -> str:
        def figures(values: list[float]) -> str:
            return f"median {statistics.median(values):.2f} ms p99 {p99(values):.2f} ms" if values else "none"

        return (
            f"load: cases run {self.cases}, failures {len(self.failures)}, messages lost: {self.lost},"
            f" duplicates: {self.duplicates}, {self.deliveries} deliveries ({self.distinct} messages x {self.copies}),"
            f" refused {self.refused}, {self.turns} turns, {self.replies} replies ({self.bursts} bursts seen from"
            f" outside); ack {figures(self.acks)} beside baseline GET /healthz {figures(self.baseline)};"
            f" target p99 <= {P99_TARGET_MS:.0f} ms {'met' if self.met else 'NOT met'};"
            f" load generator {self.load_cpu / max(self.load_seconds, 1e-9) * 100:.0f}% of a core; {self.times()}"
        )


def schedule(senders: list[str], distinct: int, copies: int, seed: int = 31) -> list[tuple[int, str]]:
    """The deliveries in sending order: ``(message index, sender)``; message ``m`` is sender
    ``m % len(senders)``'s. Each generation's copies are shuffled within the generation."""
    rng = random.Random(seed)
    order: list[tuple[int, str]] = []
    for first in range(0, distinct, len(senders)):
        generation = [m for m in range(first, min(first + len(senders), distinct)) for _ in range(copies)]
        rng.shuffle(generation)
        order.extend((m, senders[m % len(senders)]) for m in generation)
    return order


def load(port: int, kind: str, rate: int, requests: list[tuple[bytes, str]] | None, count: int) -> LoadRun:
    """In the load process: ``count`` requests at ``rate`` a second (``kind``: ``health``, or
    ``sms`` with each request's ``(body, signature)``); their latencies in ms, statuses, CPU
    seconds, wall seconds and when it began (``time.time()``)."""
    return asyncio.run(_load(port, kind, rate, requests, count))


async def _load(port: int, kind: str, rate: int, requests: list[tuple[bytes, str]] | None, count: int) -> LoadRun:
    url = f"http://127.0.0.1:{port}" + ("/healthz" if kind == "health" else "/twilio/sms")
    latencies = [0.0] * count
    statuses = [0] * count
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one(i: int) -> None:
            started = time.perf_counter()
            try:
                if requests is None:
                    async with session.get(url) as response:
                        await response.read()
                else:
                    body, signature = requests[i]
                    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature}
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                statuses[i] = response.status
            except (aiohttp.ClientError, TimeoutError):
                statuses[i] = 0
            latencies[i] = (time.perf_counter() - started) * 1000

        cpu, begin, wall = time.process_time(), time.perf_counter(), time.time()
        tasks = []
        for i in range(count):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        return latencies, statuses, time.process_time() - cpu, time.perf_counter() - begin, wall


async def run(
    *, seconds: float, rate: int, senders: int, duplicates: int, baseline_seconds: float = 5.0,
    disposable: bool = False, base_env: dict[str, str] | None = None, server_env: dict[str, str] | None = None,
) -> Result:  # fmt: skip
    """Run the suite; never raises for a failed check (see ``failures``). ``disposable``: the
    database never waits for the disk (the CI-sized test); the script keeps it durable, as served."""
    result = Result(copies=duplicates)
    root = Path(tempfile.mkdtemp(prefix="pepper-load-"))
    (root / "pg").mkdir()
    pg = EmbeddedPostgres(root / "pg", settings=DISPOSABLE_SERVER if disposable else None)
    spawn = multiprocessing.get_context("spawn")
    async with harness(result, root, partial(pg.stop, discard=True)):
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool, os.getpid)  # started now, before the server and peers
            factory = DatabaseFactory(await asyncio.to_thread(pg.start))
            await factory.prepare_template()
            dsn = await factory.create()
            async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
                distinct = max(1, int(rate * seconds) // duplicates)
                model.script(*[reply_text("Got it.")] * (distinct * 2 + 50))
                async with processes() as procs:
                    await _suite(result, pool, root, dsn, twilio, model, procs, seconds, rate, senders, duplicates,
                                 baseline_seconds, base_env, server_env)  # fmt: skip
    return result


async def _suite(
    result: Result, pool: concurrent.futures.ProcessPoolExecutor, root: Path, dsn: str, twilio: TwilioPeer,
    model: OpenAIPeer, procs: list, seconds: float, rate: int, senders: int, duplicates: int,
    baseline_seconds: float, base_env: dict[str, str] | None, server_env: dict[str, str] | None,
) -> None:  # fmt: skip
    env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("PEPPER_") and k != "DATABASE_URL"}
    port = free_port()
    env.update({
        "DATABASE_URL": dsn, "PEPPER_DATA_DIR": str(root / "data"), "PEPPER_PORT": str(port),
        "PEPPER_MEDIA_PORT": "0", "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_SECRET_KEY": generate_key(),
        "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN, "PEPPER_TWILIO_API_URL": twilio.api_url,
        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "10",
        "PEPPER_ROOMS_ENABLED": "false", "PEPPER_MEMORY_JOBS_INTERVAL": "3600", "PYTHONWARNINGS": "ignore",
    })  # fmt: skip
    env.update(server_env or {})
    log_path = root / "server.log"
    t0 = time.monotonic()
    spawn_serve(procs, env, log_path)
    web = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        await healthy(session, web, procs[0], within=120, log_path=log_path)
        result.timings["start"] = time.monotonic() - t0
        db = await Database.open(dsn, min_size=0, max_size=4)
        try:
            numbers = [f"+1415555{5000 + i:04d}" for i in range(senders)]
            for number in numbers:
                account = await identity.create_account(db, f"Person {number[-4:]}")
                await identity.add_handle(db, account.id, "phone", number, verified=True)
            owner = await identity.create_account(db, "Owner")
            await identity.add_handle(db, owner.id, "phone", OWNER, verified=True)
            await identity.assign_line(db, LINE, "personal", owner.id)
            # Steady state first: the turn workers up and answering.
            t_warm = time.monotonic()
            warm = twilio.inbound_message(sender=numbers[0], to=LINE, body="warm-up")
            status, _ = await twilio.post_form(web, PUBLIC, "/twilio/sms", warm, session=session)
            result.check(status == 200, f"the warm-up text was answered {status}")
            await twilio.wait_for_sent(1, within=180)
            result.timings["warm-up"] = time.monotonic() - t_warm

            # Everything the load process sends, built and signed before the clock starts.
            count = int(rate * seconds)
            distinct = max(1, count // duplicates)
            forms = [twilio.inbound_message(sender=numbers[m % senders], to=LINE, body=f"text {m}")
                     for m in range(distinct)]  # fmt: skip
            signed = [(urlencode(f).encode(), twilio.sign(PUBLIC + "/twilio/sms", f)) for f in forms]
            order = schedule(numbers, distinct, duplicates)
            requests = [signed[m] for m, _ in order]
            result.deliveries, result.distinct = len(requests), distinct

            base = int(rate * baseline_seconds)
            if base:
                latencies, statuses, *_ = await loop.run_in_executor(pool, load, port, "health", rate, None, base)
                result.baseline = latencies
                result.check(all(s == 200 for s in statuses), "the health endpoint refused some baseline requests")
            t_send = time.monotonic()
            latencies, statuses, cpu, wall, began = await loop.run_in_executor(
                pool, load, port, "sms", rate, requests, len(requests)
            )
            result.timings["send"] = time.monotonic() - t_send
            result.acks, result.load_cpu, result.load_seconds = latencies, cpu, wall
            result.refused = sum(1 for s in statuses if not 200 <= s < 300)
            result.check(not result.refused, f"{result.refused} deliveries refused: {sorted(set(statuses))}")
            # When each message was first acknowledged (ms into the run, from the schedule's slots).
            first: dict[int, float] = {}
            for i, ((m, _), status) in enumerate(zip(order, statuses, strict=True)):
                if 200 <= status < 300 and m not in first:
                    first[m] = i / rate
            acked = [warm["MessageSid"], *(forms[m]["MessageSid"] for m in first)]
            await texts_settled(db, distinct, within=300, body_like="text %")
            result.timings["settled"] = time.monotonic() - t_send
            await asyncio.sleep(0.5)  # a late second reply would show here
            before = len(result.failures)
            await verify(result, db, twilio, acked, distinct + 1, numbers)
            await _bursts(result, db, twilio, forms, first, numbers, began)
            if len(result.failures) > before and os.environ.get("SUITE_SERVER_LOG"):
                shutil.copy(log_path, os.environ["SUITE_SERVER_LOG"])
        finally:
            await db.close()
        result.check(procs[0].poll() is None, f"the server stopped: {log_path.read_text()[-2000:]}")


async def _bursts(
    result: Result, db: Database, twilio: TwilioPeer, forms: list[dict[str, str]], first: dict[int, float],
    numbers: list[str], began: float,
) -> None:  # fmt: skip
    """One turn per burst, one reply per turn (see the module's docstring)."""
    sid_of = {f["MessageSid"]: m for m, f in enumerate(forms)}
    rows = await db.fetch(
        "SELECT i.provider_message_id AS sid, i.turn_id, t.started_at, t.finished_at, t.status,"
        " (SELECT count(*) FROM messages o WHERE o.turn_id = i.turn_id AND o.direction = 'outbound') AS replies"
        " FROM messages i JOIN turns t ON t.id = i.turn_id"
        " WHERE i.direction = 'inbound' AND i.channel = 'sms' AND i.body LIKE 'text %'"
    )
    turns: dict[object, list[int]] = {}
    for r in rows:
        turns.setdefault(r["turn_id"], []).append(sid_of[r["sid"]])
    info = {r["turn_id"]: r for r in rows}
    result.turns = len(turns)
    result.replies = sum(info[t]["replies"] for t in turns)
    one_reply = [t for t in turns if info[t]["replies"] != 1]
    result.check(not one_reply, f"{len(one_reply)} turns without exactly one reply")
    result.check(len(turns) <= result.distinct, f"{len(turns)} turns for {result.distinct} messages")
    # Each turn's texts: one sender's, consecutive in that sender's order of arrival.
    arrival: dict[str, list[int]] = {}
    for m in sorted(first, key=lambda m: (first[m], m)):
        arrival.setdefault(numbers[m % len(numbers)], []).append(m)
    position = {m: i for ms in arrival.values() for i, m in enumerate(ms)}
    split = []
    for turn, ms in turns.items():
        owners = {numbers[m % len(numbers)] for m in ms}
        places = sorted(position[m] for m in ms)
        if len(owners) != 1 or places != list(range(places[0], places[0] + len(places))):
            split.append(turn)
    result.check(not split, f"{len(split)} turns whose texts are not one burst")
    # One sender's turns one at a time.
    overlapping = 0
    by_sender: dict[str, list[tuple[datetime, datetime]]] = {}
    for turn, ms in turns.items():
        by_sender.setdefault(numbers[ms[0] % len(numbers)], []).append(
            (info[turn]["started_at"], info[turn]["finished_at"])
        )
    for spans in by_sender.values():
        spans.sort()
        overlapping += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    result.check(not overlapping, f"{overlapping} turns overlapping another of the same sender")
    # Bursts seen from outside: a sender's texts with no reply to them in between (a text that
    # came while its sender's turn ran is answered by the next turn: bursts <= turns).
    replies_at: dict[str, list[float]] = {}
    for message in twilio.sent:  # seconds into the run, as ``first``
        replies_at.setdefault(message.to, []).append(message.received_at - began)
    bursts = 0
    for number, ms in arrival.items():
        times = sorted(replies_at.get(number, []))
        last = None
        for m in ms:
            answered_before = sum(1 for t in times if t < first[m])
            if last is None or answered_before != last:
                bursts += 1
            last = answered_before
    result.bursts = bursts
    result.check(bursts <= len(turns), f"{bursts} bursts seen from outside but {len(turns)} turns")
