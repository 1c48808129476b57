"""SMS webhook acknowledgement latency at a steady request rate, and the duplicate storm's outcome.

    .venv/bin/python bench/sms_webhook.py [--rate 200] [--seconds 10] [--no-receipts] [--peers-nice 10]
                                          [--senders 1]

``pepper serve`` runs as a user runs it, in its own process with its turn-worker processes
(``PEPPER_TURN_WORKERS``, default 2, at ``PEPPER_TURN_WORKER_NICE``), over a Postgres of its
own; a loopback Twilio receives the replies and a loopback OpenAI answers the turns the webhooks
start (both in this process). Like Twilio, the loopback Twilio reports ``sent`` then
``delivered`` to the status callback of every reply (``--no-receipts``: it does not, as this
benchmark did before). The load comes from a third process, so neither the peers nor the server
slow the clock that measures: requests are sent open-loop at ``--rate`` per second, each a new
message from the verified owner (``--senders N``: from N people in turn, each an account of its
own, whose memory blocks stay small), signed as Twilio signs. One person's texts that arrive while
a turn answers them wait and are answered together by the next turn, as in real use: the run
prints how many turns answered its messages. The figure is the time from sending a
webhook to receiving Pepper's empty-TwiML acknowledgement (target p99 <= 20 ms), measured while
the turns of the earlier webhooks run and their receipts arrive. As a baseline, the same rate
against ``/healthz`` (the framework plus one database round trip) in the same run, and, between
the two, the same rate of ``delivered`` receipts for a reply whose turn is settled (what most
receipts are: they should cost what an acknowledgement costs).

The peers stand in for Twilio and a model provider, which run on their machines, not on ours:
this process lowers its own CPU priority by ``--peers-nice`` (default 10, the same as the turn
workers; 0 keeps it), and enters the idle scheduling class as they do, once the server, Postgres
and the load process have started, so that on a
2-core machine their work competes with Pepper's turns, not with its acknowledgements or the
clock. Their CPU still counts against the machine, and is shown.

Beside the latencies, the web server's CPU time per request (from ``/proc``; with receipts on it
includes serving them), which a busy machine inflates far less than latency, and where the CPU
went during the acknowledgements. ``BENCH_SERVER_LOG=path`` keeps the server's log;
``BENCH_PROFILE=path`` runs the server under cProfile (CPU time) and writes its profile there on shutdown
(it slows the server: latencies from such a run mean nothing). ``BENCH_TIMELINE=path`` writes when
each request was sent and its latency, to tell a stall (a burst of slow requests) from a spread tail.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import aiohttp

from core import identity
from core.store import Database
from core.store.database import to_idle_class
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.processes import free_port
from core.testing.twilio_peer import SentMessage, TwilioPeer

TOKEN = "bench-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"


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
        timeline.append((started - begin, latencies[-1]))

    tasks = []
    timeline: list[tuple[float, float]] = []
    begin = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i), name=f"bench-request-{i}"))
    await asyncio.gather(*tasks)
    if os.environ.get("BENCH_TIMELINE"):
        write_timeline(os.environ["BENCH_TIMELINE"], timeline)
    return latencies, failed


def write_timeline(path: str, timeline: list[tuple[float, float]]) -> None:
    """``BENCH_TIMELINE=path``: each phase's requests as "seconds into the phase, latency ms" lines
    after a "phase" line, to tell a burst of slow requests (a stall) from a spread tail."""
    with open(path, "a") as f:
        f.write("phase\n" + "".join(f"{t:.4f} {latency:.2f}\n" for t, latency in sorted(timeline)))


def sender(i: int) -> str:
    """The number of the ``i``-th sender (0 is Ada, the owner); each other one is an account of its own."""
    return OWNER if i == 0 else f"+1415555{3000 + i:04d}"


async def main(rate: int, seconds: float, receipts: bool, peers_nice: int, senders: int) -> None:
    with test_server() as admin_dsn:
        factory = DatabaseFactory(admin_dsn)
        await factory.prepare_template()
        db_url = await factory.create()
        db = await Database.open(db_url, max_size=20)
        await db.execute("ALTER SYSTEM SET track_wal_io_timing = on")  # for the WAL I/O line
        await db.execute("SELECT pg_reload_conf()")
        ada = await identity.create_account(db, "Ada")
        await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
        for n in range(1, senders):
            other = await identity.create_account(db, f"Person {n}")
            await identity.add_handle(db, other.id, "phone", sender(n), verified=True)
        # As on a server that has been up a while, whose log files are recycled at each checkpoint:
        # without this, the brand-new cluster creates (writes 16 MB of zeros into) a new log file
        # every 16 MB of log, and every commit waits meanwhile, which no long-running server does.
        await db.execute("CHECKPOINT")
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
            profile = os.environ.get("BENCH_PROFILE")
            command = ["-c", PROFILED.format(path=profile)] if profile else ["-m", "gateway.cli"]
            server = await asyncio.create_subprocess_exec(
                sys.executable, *command, "serve", env=env, stderr=server_log()
            )
            try:
                await wait_healthy(port)
                if receipts:
                    twilio.send_receipts(f"http://127.0.0.1:{port}", PUBLIC)
                await run_all(port, db, twilio, results, rate, seconds, server.pid, peers_nice, senders)
            finally:
                server.send_signal(signal.SIGTERM)
                await asyncio.wait_for(server.wait(), 120)
        await db.close()
    rows, storm_turns, storm_sent, where, wal, answered_by = results
    acks, acks_failed, _ = rows[ACK]
    print(f"SMS webhook acknowledgement, {rate} req/s for {seconds:.0f} s ({len(acks)} requests), ms")
    print(f"{'':32} {'median':>8} {'p99':>8} {'failed':>7} {'server CPU/req':>15}")
    for name, (values, failed, cpu) in rows.items():
        print(f"{name:32} {statistics.median(values):8.2f} {p99(values):8.2f} {failed:7} {cpu:15.2f}")
    print(f"target p99 <= 20 ms -> {'met' if p99(acks) <= 20 and not acks_failed else 'NOT met'}")
    print("CPU during the acknowledgements, s: " + ", ".join(f"{name} {value:.2f}" for name, value in where.items()))
    if receipts:
        answered = twilio.receipt_statuses
        print(f"receipts: {len(answered)} sent, {answered.count(204)} answered 204, peers at nice +{peers_nice}")
    print(f"the acknowledged messages were answered by {answered_by} turn(s) (a person's texts that waited: one turn)")
    print(f"duplicate storm (50 x one MessageSid): {storm_turns} turn(s), {storm_sent} reply(ies)")
    print(wal)


# The server under cProfile, timed in CPU time of the main thread: on a busy machine wall time
# would charge whatever ran when the kernel preempted the process.
PROFILED = """
import cProfile, runpy, sys, time
profiler = cProfile.Profile(time.thread_time)
sys.argv[0] = "pepper"
try:
    profiler.runcall(runpy.run_module, "gateway.cli", run_name="__main__")
except SystemExit:
    pass
finally:
    profiler.dump_stats({path!r})
"""


def server_log():  # type: ignore[no-untyped-def]
    path = os.environ.get("BENCH_SERVER_LOG")
    return open(path, "w") if path else subprocess.DEVNULL


# The phases, in order: each is ``rate`` requests a second for ``seconds`` from the load process.
BASELINE, RECEIPT, ACK = "baseline: GET /healthz", "POST /twilio/status (receipt)", "POST /twilio/sms (ack)"
PHASES = {BASELINE: "health", RECEIPT: "status", ACK: "sms"}


def load(port: int, kind: str, rate: int, seconds: float, reply: SentMessage, senders: int) -> tuple[list[float], int]:
    """In the load process: ``rate`` requests a second for ``seconds``; their latencies in ms."""
    return asyncio.run(_load(port, kind, rate, seconds, reply, senders))


async def _load(
    port: int, kind: str, rate: int, seconds: float, reply: SentMessage, senders: int
) -> tuple[list[float], int]:
    local = f"http://127.0.0.1:{port}"
    signer = TwilioPeer(auth_token=TOKEN)  # not started: it only builds and signs the forms
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def health(_: int) -> bool:
            async with session.get(local + "/healthz") as response:
                await response.read()
                return response.status == 200

        async def webhook(i: int) -> bool:
            form = signer.inbound_message(sender=sender(i % senders), to=LINE, body=f"message {i}")
            status, _ = await signer.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
            return status == 200

        async def receipt(_: int) -> bool:
            # ``delivered`` for a reply whose turn is settled: the most common receipt.
            status, _ = await signer.send_status(local, PUBLIC, reply, "delivered", session=session)
            return status == 204

        return await open_loop(rate, seconds, {"health": health, "status": receipt, "sms": webhook}[kind])


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


def stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the name (state first); empty for a process gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (0 for one that is gone)."""
    fields = stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def parent(pid: int) -> int:
    fields = stat(pid)
    return int(fields[1]) if fields else 0


def children(pid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and parent(int(entry)) == pid]


def cpu_by_part(parts: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    return {name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in parts.items()}


async def run_all(port, db, twilio, results, rate, seconds, server_pid, peers_nice, senders) -> None:  # type: ignore[no-untyped-def]
    local = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    postmaster = parent(await db.fetchval("SELECT pg_backend_pid()"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            load_pid = await loop.run_in_executor(pool, os.getpid)  # started before this process is niced
            if peers_nice:
                os.nice(peers_nice)  # this thread: the peers' event loop (and threads it starts later)
                to_idle_class(0)  # and the idle class, as the turn workers by default
            # Steady state, as a server that has been up a while: the turn workers are up and answering.
            form = twilio.inbound_message(sender=OWNER, to=LINE, body="warm-up")
            await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
            [reply] = await twilio.wait_for_sent(1, within=120)
            rows = {}
            for name, kind in PHASES.items():
                if os.environ.get("BENCH_SERVER_LOG"):  # to line the server's log up with the phases
                    print(f"{time.strftime('%H:%M:%S')} phase {kind} starts", file=sys.stderr)
                if kind == "sms":  # where the CPU goes while the acknowledgements are measured
                    wal_before = await wal_position(db)
                    io_before = await wal_io(db)
                    parts = {"web server": [server_pid], "turn workers": children(server_pid), "peers": [os.getpid()],
                             "Postgres": [postmaster, *children(postmaster)], "load": [load_pid]}  # fmt: skip
                    before = cpu_by_part(parts)
                started = cpu_seconds(server_pid)
                latencies, failed = await loop.run_in_executor(pool, load, port, kind, rate, seconds, reply, senders)
                rows[name] = (latencies, failed, (cpu_seconds(server_pid) - started) * 1000 / len(latencies))
                if kind == "sms":
                    io_after = await wal_io(db)
            parts["Postgres"] = sorted({*parts["Postgres"], *children(postmaster)})  # backends opened meanwhile
            after = cpu_by_part(parts)
        where = {name: sum(t - before[name].get(pid, 0.0) for pid, t in after[name].items()) for name in parts}
        acks = rows[ACK][0]
        # Every message answered: one person's texts that waited for a turn are answered together,
        # so there are fewer replies than messages. An acknowledgement that timed out may still
        # have been recorded.
        for _ in range(3000):
            if not await db.fetchval("SELECT count(*) FROM messages WHERE handling IN ('queued', 'running')"):
                break
            await asyncio.sleep(0.2)
        else:
            print("warning: messages still unanswered after 600 s; figures below are from the run so far")
        answered_by = await db.fetchval(
            "SELECT count(DISTINCT turn_id) FROM messages WHERE direction = 'inbound' AND body LIKE 'message %'"
        )
        await twilio.receipts_done()
        await asyncio.sleep(1.0)
        wal_after = await wal_position(db)
        wal = wal_report(wal_before, wal_after, len(acks)) + "\n" + wal_io_report(io_before, io_after)
        if os.environ.get("BENCH_WALDUMP"):
            wal += "\n" + await by_relation(db, wal_before[0], wal_after[0], len(acks))
        # The duplicate storm: 50 concurrent deliveries of one MessageSid, once every earlier
        # message is answered.
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
        await twilio.receipts_done()
    results.extend([rows, storm_turns, storm_sent, where, wal, answered_by])


async def wal_io(db: Database) -> dict[str, tuple[float, ...]]:
    """The server's WAL I/O so far by context (``init``: creating a segment): writes, ms writing,
    bytes, syncs, ms syncing."""
    await db.execute("SELECT pg_stat_force_next_flush()")
    rows = await db.fetch(
        "SELECT context, sum(writes) w, sum(write_time) wt, sum(write_bytes) wb, sum(fsyncs) f, sum(fsync_time) ft "
        "FROM pg_stat_io WHERE object = 'wal' GROUP BY context"
    )
    return {r["context"]: tuple(float(r[k] or 0) for k in ("w", "wt", "wb", "f", "ft")) for r in rows}


def wal_io_report(before: dict[str, tuple[float, ...]], after: dict[str, tuple[float, ...]]) -> str:
    line = "WAL I/O during the acknowledgements:"
    for context, now in sorted(after.items()):
        was = before.get(context, (0.0,) * 5)
        w, wt, wb, f, ft = (a - b for a, b in zip(now, was, strict=True))
        line += f" {context}: {w:.0f} writes {wt:.0f} ms {wb / 1e6:.1f} MB, {f:.0f} syncs {ft:.0f} ms;"
    return line


async def wal_position(db: Database) -> tuple[str, int, int, int]:
    """The write-ahead log's end and the server's WAL counters (records, full page images, bytes)
    and requested plus timed checkpoints so far."""
    await db.execute("SELECT pg_stat_force_next_flush()")
    row = await db.fetchrow(
        "SELECT pg_current_wal_insert_lsn()::text AS lsn, w.wal_records, w.wal_fpi, "
        "c.num_timed + c.num_requested AS checkpoints FROM pg_stat_wal w, pg_stat_checkpointer c"
    )
    return row["lsn"], row["wal_records"], row["wal_fpi"], row["checkpoints"]


def wal_report(before: tuple, after: tuple, messages: int) -> str:  # type: ignore[type-arg]
    """WAL written from the first acknowledgement until every reply was delivered, per message:
    the acknowledgement, the turn, the reply and its receipts together."""
    high, low = (int(part, 16) for part in after[0].split("/"))
    start_high, start_low = (int(part, 16) for part in before[0].split("/"))
    size = ((high << 32) + low) - ((start_high << 32) + start_low)
    line = (
        f"WAL per message (ack, turn, reply, receipts): {size / messages / 1024:.1f} kB, "
        f"{(after[1] - before[1]) / messages:.1f} records, {(after[2] - before[2]) / messages:.2f} full page images; "
        f"{after[3] - before[3]} checkpoint(s)"
    )
    return line


async def by_relation(db: Database, start: str, end: str, messages: int) -> str:
    """``BENCH_WALDUMP=1``: the WAL of the range by relation (its first block reference), per
    message, from ``pg_waldump`` (the embedded server only: it reads the server's ``pg_wal``)."""
    from core.store.embedded import wheel_bin_dir

    pgdata = await db.fetchval("SHOW data_directory")
    names = {
        r["node"]: r["name"]
        for r in await db.fetch(
            "SELECT pg_relation_filenode(c.oid)::text AS node, coalesce(t.relname || ' (toast)', c.relname) AS name "
            "FROM pg_class c LEFT JOIN pg_class t ON t.reltoastrelid = c.oid "
            "WHERE pg_relation_filenode(c.oid) IS NOT NULL"
        )
    }
    dump = await asyncio.to_thread(
        subprocess.run, [str(wheel_bin_dir() / "pg_waldump"), "-p", pgdata, "-s", start, "-e", end],
        capture_output=True, text=True,
    )  # fmt: skip
    sizes: dict[str, list[int]] = {}
    for record in dump.stdout.splitlines():
        total = re.search(r"len \(rec/tot\):\s*\d+/\s*(\d+)", record)
        if total is None:
            continue
        rel = re.search(r"rel \d+/\d+/(\d+)", record)
        kind = record.split("rmgr:")[1].split()[0] if "rmgr:" in record else "?"
        key = names.get(rel.group(1), f"relfilenode {rel.group(1)}") if rel else f"({kind}, no relation)"
        entry = sizes.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += int(total.group(1))
        entry[2] += "FPW" in record
    top = sorted(sizes.items(), key=lambda item: -item[1][1])[:25]
    return (
        "WAL per message by relation: "
        + "".join(
            f"\n  {name:48} {count / messages:7.2f} records {size / messages / 1024:8.2f} kB {fpw / messages:6.3f} FPW"
            for name, (count, size, fpw) in top
        )
        + (f"\n  pg_waldump: {dump.stderr.strip()[:300]}" if dump.stderr.strip() else "")
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--receipts", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--peers-nice", type=int, default=10)
    parser.add_argument("--senders", type=int, default=1, help="people texting, each an account of their own")
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds, args.receipts, args.peers_nice, args.senders))
