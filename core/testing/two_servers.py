"""Past one machine (issue 31, suite 5): two ``pepper serve`` processes, each with its own data
dir, sharing one external Postgres behind Caddy's round-robin load balancer; one is killed with
SIGKILL (it and its children) half-way through a stream of texts.

Used by ``scripts/suite-two-servers`` (1,000 texts from 50 senders) and, with a smaller load, by
``tests/test_gateway_two_servers.py``. Everything listens on loopback; every process started here
is stopped here, and every wait has a deadline.

What is checked, from the outside:
- both servers started at the same moment on an empty database apply each migration once (the
  ``applying migration`` lines of both logs together name every migration exactly once);
- every acknowledged text is recorded once and sits in one finished turn, and each person got
  exactly one reply per answer (none lost, none twice), as many as the Twilio peer was sent;
- the one-off tasks due during the run each ran once.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Protocol

import aiohttp

from core import identity
from core.scheduling.schedule import Schedule
from core.scheduling.tasks import create_task
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.store.migrations import load_migrations
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DISPOSABLE_SERVER, DatabaseFactory
from core.testing.processes import free_port, kill_tree, until_or_false
from core.testing.suite import SuiteResult, harness, healthy, processes, spawn, spawn_serve
from core.testing.twilio_peer import TwilioPeer
from core.vault import generate_key

TOKEN = "twilio-two-servers-auth-token"
PUBLIC = "https://pepper.example.org"
LINE = "+14155550100"
RETRY_EVERY = 0.2  # seconds between a sender's attempts, as Twilio retries a failed webhook
ATTEMPTS = 150
TASKS = 3


@dataclass
class Servers:
    """What a side load needs to reach both servers directly (``webs``, ``medias``: by index)."""

    webs: list[str]
    medias: list[str]
    front: str  # Caddy: http:// for the webhooks, and the same host and port for the media sockets
    owner: str
    line: str
    public: str
    token: str
    account_sid: str


class SideLoad(Protocol):
    """More work beside the texts (``voice.testing.two_server_calls``): its settings for both
    servers, work started before the kill, and checks after it (each ``(passed, what)``)."""

    env: dict[str, str]

    async def before_kill(self, servers: Servers) -> list[tuple[bool, str]]: ...

    async def after_kill(self, survivor: int) -> list[tuple[bool, str]]: ...


@dataclass
class Result(SuiteResult):
    acknowledged: int = 0
    lost: int = 0
    duplicates: int = 0
    retries: int = 0
    killed_with: int = 0  # acknowledged when the kill came
    calls: int = 0  # connected, webhook on one server and media on the other
    calls_on: int = 0  # of those held by the survivor, went on after the kill

    def summary(self) -> str:
        return (
            f"two servers: cases run {self.cases}, failures {len(self.failures)}, messages lost: {self.lost},"
            f" duplicates: {self.duplicates}, acknowledged {self.acknowledged}"
            f" ({self.killed_with} before the kill), retries {self.retries}, calls {self.calls} connected,"
            f" {self.calls_on} went on after the kill; {self.times()}"
        )


def _caddyfile(proxy: int, webs: list[int], medias: list[int]) -> str:
    """docs/deploy/Caddyfile for two servers (docs/operations.md, "Past one machine"): round robin
    over both web ports, in while /healthz answers; the media sockets round robin over both media
    ports. A dial that fails is tried on the other upstream (lb_try_duration), so a dead server
    costs retries, not errors."""
    web = " ".join(f"127.0.0.1:{p}" for p in webs)
    media = " ".join(f"127.0.0.1:{p}" for p in medias)
    return f"""{{
\tadmin off
\tauto_https off
}}

http://127.0.0.1:{proxy} {{
\thandle /twilio/media* {{
\t\treverse_proxy {media} {{
\t\t\tlb_policy round_robin
\t\t\tlb_try_duration 3s
\t\t\tfail_duration 10s
\t\t}}
\t}}
\thandle {{
\t\treverse_proxy {web} {{
\t\t\tlb_policy round_robin
\t\t\tlb_try_duration 3s
\t\t\tlb_try_interval 100ms
\t\t\tfail_duration 10s
\t\t\thealth_uri /healthz
\t\t\thealth_interval 500ms
\t\t\thealth_timeout 1s
\t\t\tflush_interval -1
\t\t}}
\t}}
}}
"""


async def run(
    *, messages: int, senders: int, base_env: dict[str, str] | None = None, side: SideLoad | None = None
) -> Result:
    """Run the suite; return its figures (never raises for a failed check: see ``failures``)."""
    result = Result()
    caddy = shutil.which("caddy")
    if caddy is None:
        result.check(False, "caddy is not installed (scripts/test installs it)")
        return result
    root = Path(tempfile.mkdtemp(prefix="pepper-two-servers-"))
    (root / "pg").mkdir()
    pg = EmbeddedPostgres(root / "pg", settings=DISPOSABLE_SERVER)
    async with harness(result, root, partial(pg.stop, discard=True)):
        admin = await asyncio.to_thread(pg.start)
        dsn = await DatabaseFactory(admin).create_empty()
        async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
            model.script(*[reply_text("Got it.")] * (messages * 3 + 50))
            async with processes() as procs:
                await _suite(result, caddy, root, dsn, twilio, model, procs, messages, senders, base_env, side)
    return result


async def _suite(
    result: Result, caddy: str, root: Path, dsn: str, twilio: TwilioPeer, model: OpenAIPeer,
    procs: list[subprocess.Popen], messages: int, senders: int, base_env: dict[str, str] | None,
    side: SideLoad | None,
) -> None:  # fmt: skip
    env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("PEPPER_")}
    env.update({
        "DATABASE_URL": dsn, "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_SECRET_KEY": generate_key(),
        "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN, "PEPPER_TWILIO_API_URL": twilio.api_url,
        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "5",
        "PEPPER_TURN_WORKERS": "1", "PEPPER_MEDIA_PROCESSES": "1", "PEPPER_ROOMS_ENABLED": "false",
        "PEPPER_MEMORY_JOBS_INTERVAL": "3600", "PEPPER_SCHEDULER_POLL_SECONDS": "0.5",
        "PEPPER_SCHEDULER_LEASE_SECONDS": "3", "PYTHONWARNINGS": "ignore",
    })  # fmt: skip
    env.update(side.env if side else {})
    ports, medias = [free_port(), free_port()], [free_port(), free_port()]
    logs = [root / "a.log", root / "b.log"]
    # Both at the same moment, on an empty database.
    t0 = time.monotonic()
    for n, port in enumerate(ports):
        server_env = {**env, "PEPPER_DATA_DIR": str(root / f"data-{n}"), "PEPPER_PORT": str(port),
                      "PEPPER_MEDIA_PORT": str(medias[n])}  # fmt: skip
        spawn_serve(procs, server_env, logs[n])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for port, proc, log in zip(ports, procs, logs, strict=True):
            await healthy(session, f"http://127.0.0.1:{port}", proc, within=90, log_path=log)
        result.timings["start"] = time.monotonic() - t0
        applied = [int(v) for log in logs for v in re.findall(r"applying migration (\d{4})_", log.read_text())]
        expected = sorted(m.version for m in load_migrations())
        result.check(sorted(applied) == expected, f"migrations applied {len(applied)} times for {len(expected)}")

        proxy = free_port()
        (root / "Caddyfile").write_text(_caddyfile(proxy, ports, medias))
        caddy_env = {"PATH": env.get("PATH", ""), "HOME": str(root), "XDG_DATA_HOME": str(root / "caddy"),
                     "XDG_CONFIG_HOME": str(root / "caddy")}  # fmt: skip
        spawn(procs, [caddy, "run", "--adapter", "caddyfile", "--config", str(root / "Caddyfile")], caddy_env)
        front = f"http://127.0.0.1:{proxy}"
        await healthy(session, front, procs[-1], within=30)

        db = await Database.open(dsn, max_size=4)
        try:
            numbers = [f"+1415555{3000 + i:04d}" for i in range(senders)]
            owner = None
            for number in numbers:
                account = await identity.create_account(db, f"Person {number[-4:]}")
                await identity.add_handle(db, account.id, "phone", number, verified=True)
                owner = owner or account
            assert owner is not None
            await identity.assign_line(db, LINE, "personal", owner.id)
            # A few one-off tasks, due while the texts come (and the kill lands).
            now = datetime.now(UTC)
            tasks = []
            for n in range(TASKS):
                async with db.transaction() as conn:
                    moment = (now + timedelta(seconds=1 + 1.5 * n)).replace(microsecond=0)
                    task = await create_task(conn, owner.id, title=f"Check {n}", prompt="Say hello.",
                                             schedule=Schedule("once", moment=moment), now=now)  # fmt: skip
                tasks.append(task.id)

            acked: list[str] = []
            statuses: list[int] = []
            half = asyncio.Event()
            per_sender = max(1, messages // senders)

            async def deliver(form: dict[str, str]) -> None:
                headers = {"X-Twilio-Signature": twilio.sign(PUBLIC + "/twilio/sms", form)}
                for _ in range(ATTEMPTS):
                    try:
                        async with session.post(front + "/twilio/sms", data=form, headers=headers) as response:
                            statuses.append(response.status)
                            if response.status == 200:
                                acked.append(form["MessageSid"])
                                if len(acked) >= messages // 2:
                                    half.set()
                                return
                    except (aiohttp.ClientError, TimeoutError):
                        statuses.append(0)
                    await asyncio.sleep(RETRY_EVERY)
                result.failures.append(f"{form['MessageSid']} never acknowledged")

            async def sender(number: str) -> None:
                for k in range(per_sender):
                    await deliver(twilio.inbound_message(sender=number, to=LINE, body=f"text {k} from {number}"))

            async def kill_half_way() -> None:
                await asyncio.wait_for(half.wait(), 300)
                result.timings["kill at"] = time.monotonic() - t_send
                result.killed_with = len(acked)
                children = await asyncio.to_thread(kill_tree, procs[0])
                result.timings["killed in"] = time.monotonic() - t_send - result.timings["kill at"]
                gone = await until_or_false(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10)
                result.check(bool(children) and gone, f"the killed server's children {children} outlived it")
                for ok, what in await side.after_kill(survivor=1) if side else ():
                    result.check(ok, what)
                    result.calls_on += ok

            if side is not None:
                webs, media_urls = [f"http://127.0.0.1:{p}" for p in ports], [f"ws://127.0.0.1:{p}" for p in medias]
                servers = Servers(webs, media_urls, front, numbers[0], LINE, PUBLIC, TOKEN, twilio.account_sid)
                t_calls = time.monotonic()
                for ok, what in await side.before_kill(servers):
                    result.check(ok, what)
                    result.calls += ok
                result.timings["calls"] = time.monotonic() - t_calls
            t_send = time.monotonic()
            await asyncio.wait_for(asyncio.gather(kill_half_way(), *(sender(n) for n in numbers)), 600)
            result.timings["send"] = time.monotonic() - t_send
            result.acknowledged = len(acked)
            result.retries = sum(1 for s in statuses if s != 200)
            await _settled(db, len(acked), tasks, within=180)
            result.timings["settled"] = time.monotonic() - t_send
            await asyncio.sleep(0.5)  # a late second reply would show here
            await _verify(result, db, twilio, acked, senders * per_sender, numbers, tasks)
        finally:
            await db.close()
        result.check(procs[1].poll() is None, "the surviving server stopped")


async def _settled(db: Database, expected: int, tasks: list, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        inbound = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'inbound'")
        open_ = await db.fetchval(
            "SELECT count(*) FROM messages WHERE direction = 'inbound' AND handling IN ('queued', 'running')"
        )
        running = await db.fetchval("SELECT count(*) FROM turns WHERE status = 'running'")
        waiting = await db.fetchval(
            "SELECT count(*) FROM scheduled_tasks t WHERE t.id = ANY($1) AND NOT EXISTS"
            " (SELECT 1 FROM task_runs r WHERE r.task_id = t.id AND r.status IN ('ran', 'silent', 'failed', 'missed'))",
            tasks,
        )
        if inbound >= expected and not open_ and not running and not waiting:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not settled: {inbound} of {expected} inbound, {open_} open, {running} running, "
                         f"{waiting} tasks not run")  # fmt: skip


async def _verify(
    result: Result, db: Database, twilio: TwilioPeer, acked: list[str], sent: int, numbers: list[str], tasks: list
) -> None:
    result.check(len(acked) == len(set(acked)) == sent, f"{len(acked)} acknowledged of {sent} sent")
    rows = await db.fetch("SELECT provider_message_id, turn_id, handling FROM messages WHERE direction = 'inbound'")
    recorded = [r["provider_message_id"] for r in rows]
    result.duplicates += len(recorded) - len(set(recorded))
    result.lost = len(set(acked) - set(recorded))
    result.check(result.lost == 0 and sorted(set(recorded)) == sorted(acked), "recorded texts differ from acked")
    unanswered = [r for r in rows if r["turn_id"] is None or r["handling"] != "done"]
    result.lost += len(unanswered)
    result.check(not unanswered, f"{len(unanswered)} texts in no finished turn")
    per_person = await db.fetch(
        "SELECT c.id, count(DISTINCT i.turn_id) AS answers,"
        " (SELECT count(*) FROM messages o WHERE o.conversation_id = c.id AND o.direction = 'outbound'"
        "  AND o.channel = 'sms' AND NOT EXISTS"
        "  (SELECT 1 FROM turns t WHERE t.id = o.turn_id AND t.kind = 'scheduled')) AS replies"
        " FROM conversations c JOIN messages i ON i.conversation_id = c.id AND i.direction = 'inbound'"
        " GROUP BY c.id"
    )
    result.check(len(per_person) == len(numbers), f"{len(per_person)} people wrote of {len(numbers)}")
    extra = sum(max(0, r["replies"] - r["answers"]) for r in per_person)
    missing = sum(max(0, r["answers"] - r["replies"]) for r in per_person)
    result.duplicates += extra
    result.lost += missing
    detail = ""
    if extra or missing:  # the turns with no reply of their own, for the report
        silent = await db.fetch(
            "SELECT t.status, t.kind, t.error, t.channel, t.delivery::text AS delivery, t.started_at, t.finished_at"
            " FROM turns t"
            " WHERE t.kind <> 'scheduled' AND NOT EXISTS (SELECT 1 FROM messages o WHERE o.turn_id = t.id"
            " AND o.direction = 'outbound')"
        )
        detail = "; turns without a reply: " + repr([dict(r) for r in silent][:5])
    result.check(not extra and not missing, f"replies vs answers: {extra} extra, {missing} missing{detail}")
    to_senders = [m for m in twilio.sent if m.to in set(numbers)]
    outbound = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound' AND channel = 'sms'")
    result.check(len(to_senders) == outbound, f"Twilio was sent {len(to_senders)}, the store has {outbound}")
    # Each task due during the run ran once: one settled receipt per occurrence, one delivered turn.
    for task_id in tasks:
        receipts = await db.fetch("SELECT status, turn_id FROM task_runs WHERE task_id = $1", task_id)
        settled = [r for r in receipts if r["status"] in ("ran", "silent")]
        result.check(
            len(receipts) == 1 and len(settled) == 1, f"task {task_id}: receipts {[dict(r) for r in receipts]}"
        )
        turns = await db.fetchval(
            "SELECT count(*) FROM turns WHERE kind = 'scheduled' AND status IN ('replied', 'delivered')"
            " AND id IN (SELECT turn_id FROM task_runs WHERE task_id = $1)",
            task_id,
        )
        result.check(turns == 1, f"task {task_id}: {turns} finished turns")
        posts = await db.fetchval(
            "SELECT count(*) FROM messages WHERE direction = 'outbound'"
            " AND turn_id IN (SELECT turn_id FROM task_runs WHERE task_id = $1)",
            task_id,
        )
        result.check(posts == 1, f"task {task_id}: posted {posts} times")
