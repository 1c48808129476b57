"""Crash (issue 31, suite 1): ``kill -9`` of each kind of process of a real ``pepper serve`` at the
worst moment, each case asserted from the outside: what the loopback Twilio was sent and asked,
and what the store holds.

Used by ``scripts/suite-crash`` and ``tests/test_crash_suite.py``. One server (one turn worker, two
media processes, the scheduler in the turn worker) on one Postgres, against a loopback Twilio and
OpenAI; a case that kills the whole server starts it again on the same ports. Everything listens
on loopback; every process started here is stopped here, and every wait has a deadline.

The cases (``CASES``; the calls case comes from ``voice.testing.crash_calls``):

- ``worker``: a turn worker killed mid-turn (the model holds the turn's second round, after it
  staged a todo marked done and a text to a contact): the text is answered once (the apology), the
  staged writes dropped, not committed (the todo open, the contact never texted).
- ``scheduler``: the turn worker killed in the middle of a scheduled run (the model holds it): the
  run runs again once its lease expires and posts once; the held attempt never posts.
- ``webhook``: the web server process killed while an SMS webhook is in flight (held on a row
  lock in the store; its children see it gone and exit): never acknowledged, so Twilio retries
  with the same ``MessageSid`` and the restarted server answers it once.
- ``send``: the server killed after Twilio took a reply and before Pepper heard its MessageSid:
  on restart the reply's ``sending`` row is found in Twilio's message list and taken as sent; it
  is not sent again, and no row is left ``sending``.
- ``send-worker``: the same window with only the turn worker killed (it sends the replies): the
  worker that replaces it finds the reply the same way; no restart, so it fits the CI budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from core import identity
from core.scheduling.schedule import Schedule
from core.scheduling.tasks import create_task
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.postgres import DISPOSABLE_SERVER, DatabaseFactory
from core.testing.processes import alive, descendants, free_port, kill_tree, spawned_children, until, until_or_false
from core.testing.suite import SuiteResult, harness
from core.testing.twilio_peer import TwilioPeer
from core.vault import generate_key

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "twilio-crash-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"
SAM = "+14155550123"  # a contact of the owner's, texted only by a write that commits
MEDIA_PROCESSES = 2
LEASE_SECONDS = 3  # the scheduler's lease: a killed run is taken again this long after its last heartbeat
WITHIN = 90.0  # seconds for anything to happen (a restart on a busy machine included)
RETRY_EVERY = 0.2  # seconds between Twilio's attempts at a webhook that was not acknowledged


@dataclass
class Result(SuiteResult):
    lost: int = 0
    double_sends: int = 0
    double_posts: int = 0

    def summary(self) -> str:
        return (
            f"crash: cases run {self.cases}, failures {len(self.failures)}, messages lost: {self.lost},"
            f" double sends: {self.double_sends}, double posts: {self.double_posts}; {self.times()}"
        )


class Server:
    """One ``pepper serve`` in its own process group, started again on the same ports after a kill."""

    def __init__(self, root: Path, env: dict[str, str], media_processes: int) -> None:
        self.media_processes = media_processes  # 1: the calls are held in the web server, no media process
        self.port, self.media_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.media_url = f"ws://127.0.0.1:{self.media_port}"
        self.env = {**env, "PEPPER_PORT": str(self.port), "PEPPER_MEDIA_PORT": str(self.media_port),
                    "PEPPER_DATA_DIR": str(root / "data"), "PEPPER_MEDIA_PROCESSES": str(media_processes)}  # fmt: skip
        self.log = root / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    async def start(self, db: Database) -> None:
        self._spawn()
        await self.ready(db)

    def _spawn(self) -> None:
        # Popen returns once the child is forked: nothing here waits on it.
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve"], env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                stderr=log, start_new_session=True,
            )  # fmt: skip
        self.starts += 1

    async def ready(self, db: Database) -> None:
        """Healthy, with its turn worker and media processes up."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def healthy() -> bool:
                self.alive_or_raise()
                try:
                    async with session.get(self.url + "/healthz") as response:
                        return response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    return False

            await until(healthy, WITHIN, "the server to be healthy")

        async def one_worker() -> bool:
            return len(await self.turn_workers_now(db)) == 1

        await until(one_worker, WITHIN, "the turn worker")

    async def turn_workers_now(self, db: Database) -> set[int]:
        assert self.proc is not None
        if self.media_processes <= 1:
            return spawned_children(self.proc.pid)
        media = set((await media_holders(db)).values())
        return spawned_children(self.proc.pid) - media if len(media) == self.media_processes else set()

    def alive_or_raise(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"pepper serve exited ({self.proc and self.proc.returncode}): {self.tail()}")

    def kill(self) -> set[int]:
        """SIGKILL the server and every process under it."""
        assert self.proc is not None
        return kill_tree(self.proc)

    def kill_web(self) -> set[int]:
        """SIGKILL the web server process alone; return its children (they notice and exit)."""
        assert self.proc is not None
        children = descendants(self.proc.pid)
        self.proc.kill()
        self.proc.wait(timeout=30)
        return children

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class Crash:
    """What the cases share: the server, the store, the peers, the owner."""

    server: Server
    db: Database
    twilio: TwilioPeer
    model: OpenAIPeer
    result: Result
    account_id: Any = None
    session: aiohttp.ClientSession | None = None

    async def text(self, body: str, sid: str | None = None) -> tuple[dict[str, str], int]:
        """Post an SMS from the owner as Twilio does; its form and the status (0: no answer)."""
        form = self.twilio.inbound_message(sender=OWNER, to=LINE, body=body, **({"MessageSid": sid} if sid else {}))
        return form, await self.post(form)

    async def post(self, form: dict[str, str]) -> int:
        assert self.session is not None
        try:
            status, _ = await self.twilio.post_form(self.server.url, PUBLIC, "/twilio/sms", form, session=self.session)
        except (aiohttp.ClientError, TimeoutError):
            return 0
        return status

    def sent_to_owner(self, body: str | None = None) -> list[Any]:
        return [m for m in self.twilio.sent if m.to == OWNER and (body is None or m.body == body)]

    async def answered(self, sid: str) -> Any:
        """The inbound message with this MessageSid once it is answered (handling done), else None."""
        row = await self.db.fetchrow(
            "SELECT id, handling, turn_id FROM messages WHERE provider_message_id = $1 AND direction = 'inbound'", sid
        )
        return row if row is not None and row["handling"] == "done" else None

    async def replies(self, turn_id: Any) -> list[Any]:
        return list(await self.db.fetch(
            "SELECT body, provider_message_id, delivery_status FROM messages WHERE turn_id = $1"
            " AND direction = 'outbound' ORDER BY id", turn_id,
        ))  # fmt: skip

    async def turn(self, turn_id: Any) -> Any:
        return await self.db.fetchrow("SELECT status, error, delivery::text AS delivery FROM turns WHERE id = $1",
                                      turn_id)  # fmt: skip

    async def kill_turn_worker(self) -> set[int]:
        """SIGKILL the turn worker; return its pid once the server started another."""
        [old] = await until(lambda: self.server.turn_workers_now(self.db), WITHIN, "the turn worker")
        os.kill(old, signal.SIGKILL)

        async def replaced() -> set[int]:
            now = await self.server.turn_workers_now(self.db)
            return now if now and old not in now else set()

        await until(replaced, WITHIN, "a new turn worker")
        return {old}

    async def restart(self) -> None:
        """SIGKILL the whole server (it and its children), then start it again on the same ports."""
        children = await asyncio.to_thread(self.server.kill)
        gone = await until_or_false(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10)
        self.result.check(bool(children) and gone, f"the killed server's children {children} outlived it")
        await self.server.start(self.db)


class CallCase(Protocol):
    """The media process case (``voice.testing.crash_calls``): its settings, and its checks (each
    ``(passed, what)``)."""

    env: dict[str, str]

    async def run(self, crash: Crash) -> list[tuple[bool, str]]: ...


# --- store queries the call case needs (SQL lives in core) ------------------------------------


async def media_holders(db: Database) -> dict[int, int]:
    """Listening backend pid -> OS pid of each running media process."""
    rows = await db.fetch(
        "SELECT pid, application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pepper-media-%'"
    )
    return {r["pid"]: int(r["application_name"].split(" ")[1]) for r in rows if " " in r["application_name"]}


async def call_row(db: Database, call_sid: str) -> Any:
    return await db.fetchrow(
        "SELECT c.held_by, c.status, c.end_reason, c.ended_at, c.summary, t.status AS turn_status FROM calls c"
        " LEFT JOIN turns t ON t.id = c.turn_id WHERE c.call_sid = $1",
        call_sid,
    )


# --- the cases -------------------------------------------------------------------------------


async def case_worker(crash: Crash) -> None:
    """A turn worker killed mid-turn, after the turn staged a write (a todo marked done)."""
    result, db, model = crash.result, crash.db, crash.model
    todo = await db.fetchval(
        "INSERT INTO todos (account_id, title) VALUES ($1, 'buy floss') RETURNING id", crash.account_id
    )
    await db.execute("INSERT INTO contacts (account_id, name, phones) VALUES ($1, 'Sam', $2)", crash.account_id, [SAM])
    held = asyncio.Event()
    before = len(model.requests)
    model.script(
        reply_tools(("complete_todo", {"id": todo}), ("text_contact", {"to": "Sam", "text": "The floss is bought."})),
        reply_text("Done, and I'll tell Sam.", hold=held),
    )
    sends = len(crash.sent_to_owner())
    form, status = await crash.text("I bought the floss")
    result.check(status == 200, f"worker: the text was not acknowledged ({status})")
    await until(lambda: len(model.requests) >= before + 2, WITHIN, "the turn's second round")
    staged = await db.fetchval("SELECT count(*) FROM staged_writes WHERE status = 'staged'")
    result.check(staged == 2, f"worker: {staged} writes staged when the kill came, not 2")
    await crash.kill_turn_worker()
    held.set()  # the model answers a turn nobody is waiting for
    message = await until(lambda: crash.answered(form["MessageSid"]), WITHIN, "the text answered after the kill")
    await until_or_false(lambda: len(crash.sent_to_owner()) > sends, 10)
    await asyncio.sleep(0.5)  # a late second answer would show here
    answers = crash.sent_to_owner()[sends:]
    crash.result.lost += not answers
    crash.result.double_sends += max(0, len(answers) - 1)
    result.check(len(answers) == 1, f"worker: the text was answered {len(answers)} times, not once")
    result.check(not crash.sent_to_owner("Done, and I'll tell Sam."), "worker: the held turn's reply went out")
    turn = await crash.turn(message["turn_id"])
    result.check(turn is not None and turn["status"] == "failed" and "worker-died" in (turn["delivery"] or ""),
                 f"worker: the cut-short turn is {turn and dict(turn)}")  # fmt: skip
    writes = await db.fetch("SELECT status FROM staged_writes WHERE turn_id = $1", message["turn_id"])
    result.check([w["status"] for w in writes] == ["dropped"] * 2, f"worker: staged writes {[dict(w) for w in writes]}")
    done = await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo)
    result.check(done is None, "worker: a dropped write was committed (the todo is done)")
    to_sam = [m for m in crash.twilio.sent if m.to == SAM]
    crash.result.double_sends += len(to_sam)
    result.check(not to_sam, "worker: a dropped write was committed (Sam was texted)")


async def case_scheduler(crash: Crash) -> None:
    """The turn worker (where the scheduler runs) killed in the middle of a scheduled run."""
    result, db, model = crash.result, crash.db, crash.model
    held = asyncio.Event()
    before = len(model.requests)
    model.script(reply_text("Your brief, first try.", hold=held), reply_text("Your brief."))
    now = datetime.now(UTC)
    due = Schedule("once", moment=(now + timedelta(seconds=1)).replace(microsecond=0))
    async with db.transaction() as conn:
        task = await create_task(conn, crash.account_id, title="Brief", prompt="Brief me.", now=now, schedule=due)

    async def leased() -> bool:
        owner = await db.fetchval("SELECT lease_owner FROM task_runs WHERE task_id = $1", task.id)
        return owner is not None and len(model.requests) > before

    await until(leased, WITHIN, "the scheduled run to reach the model")
    await crash.kill_turn_worker()
    held.set()

    async def settled() -> Any:
        row = await db.fetchrow("SELECT status, attempts, turn_id FROM task_runs WHERE task_id = $1", task.id)
        return row if row is not None and row["status"] in ("ran", "silent", "failed", "missed") else None

    run = await until(settled, WITHIN, "the run to run again after its lease")
    await until_or_false(lambda: crash.sent_to_owner("Your brief."), 10)
    await asyncio.sleep(0.5)
    result.check((run["status"], run["attempts"]) == ("ran", 2), f"scheduler: the run {dict(run)}")
    posts = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound' AND body LIKE 'Your brief%'")
    sends = len(crash.sent_to_owner("Your brief.")) + len(crash.sent_to_owner("Your brief, first try."))
    crash.result.double_posts += max(0, posts - 1)
    crash.result.double_sends += max(0, sends - 1)
    crash.result.lost += posts == 0
    result.check(posts == 1, f"scheduler: posted {posts} times, not once")
    result.check(sends == 1, f"scheduler: Twilio was sent the brief {sends} times, not once")
    result.check(not crash.sent_to_owner("Your brief, first try."), "scheduler: the killed attempt's result went out")


async def _in_flight(db: Database) -> bool:
    """Whether a session of the server waits on a lock (the webhook's insert, held by the case)."""
    waiting = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND pid <> pg_backend_pid()"
    )
    return bool(waiting)


async def case_webhook(crash: Crash) -> None:
    """The server killed while an inbound SMS webhook is in flight."""
    result, db, model = crash.result, crash.db, crash.model
    model.script(reply_text("Answered after the retry."))
    form = crash.twilio.inbound_message(sender=OWNER, to=LINE, body="are you still there?")
    sends = len(crash.sent_to_owner())
    kinds = {pid: "turn worker" for pid in await crash.server.turn_workers_now(db)}
    kinds.update({pid: "media process" for pid in (await media_holders(db)).values()})
    async with db.transaction() as conn:
        # The person's conversation row, locked: recording the message waits on it.
        await conn.execute("SELECT 1 FROM conversations WHERE account_id = $1 FOR UPDATE", crash.account_id)
        first = asyncio.create_task(crash.post(form), name="crash-webhook-in-flight")
        in_flight = await until_or_false(lambda: _in_flight(db), WITHIN)
        result.check(in_flight, "webhook: the webhook never reached the store")
        children = await asyncio.to_thread(crash.server.kill_web)
        status = await asyncio.wait_for(first, WITHIN)
    result.check(status != 200, f"webhook: acknowledged ({status}) by a server killed before it recorded the text")
    await crash.server.start(db)
    # Twilio retries a webhook that got no 200, with the same MessageSid.
    for _ in range(int(WITHIN / RETRY_EVERY)):
        if (status := await crash.post(form)) == 200:
            break
        await asyncio.sleep(RETRY_EVERY)
    result.check(status == 200, f"webhook: the retry was not acknowledged ({status})")
    message = await until(lambda: crash.answered(form["MessageSid"]), WITHIN, "the retried text answered")
    await until_or_false(lambda: len(crash.sent_to_owner()) > sends, 10)
    await asyncio.sleep(0.5)
    recorded = await db.fetchval("SELECT count(*) FROM messages WHERE provider_message_id = $1", form["MessageSid"])
    answers = crash.sent_to_owner()[sends:]
    crash.result.lost += not answers
    crash.result.double_sends += max(0, len(answers) - 1)
    result.check(recorded == 1, f"webhook: the text recorded {recorded} times")
    result.check([m.body for m in answers] == ["Answered after the retry."], f"webhook: answered {answers}")
    replies = await crash.replies(message["turn_id"])
    crash.result.double_posts += max(0, len(replies) - 1)
    result.check(len(replies) == 1, f"webhook: {len(replies)} replies recorded")
    # Only the web server was killed: its turn worker and media processes see it gone and exit (a
    # turn worker runs in the idle scheduling class, so on a busy machine that can take a while;
    # meanwhile it may still answer, its claims as exclusive as any worker's).
    gone = await until_or_false(lambda: not any(alive(pid) for pid in children), WITHIN)
    left = {pid: kinds.get(pid) or _cmdline(pid) for pid in children if alive(pid)}
    result.check(bool(children) and gone, f"webhook: the web server's children outlived it: {left}")
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


async def case_send(crash: Crash) -> None:
    """The server killed after Twilio took a reply and before Pepper learnt its MessageSid."""
    await _killed_mid_send(crash, whole=True)


async def case_send_worker(crash: Crash) -> None:
    """The same window with only the turn worker (which sends the reply) killed: cheaper, no restart."""
    await _killed_mid_send(crash, whole=False)


async def _killed_mid_send(crash: Crash, *, whole: bool) -> None:
    result, db, model, twilio = crash.result, crash.db, crash.model, crash.twilio
    what = "send" if whole else "send-worker"
    lists = twilio.lists
    body = f"Noted: the dentist on {'Friday' if whole else 'Monday'}."
    model.script(reply_text(body))
    twilio.hold_answers()
    try:
        form, status = await crash.text("remember the dentist on friday")
        result.check(status == 200, f"{what}: the text was not acknowledged ({status})")
        await until(lambda: crash.sent_to_owner(body), WITHIN, "Twilio to take the reply")
        if whole:
            children = await asyncio.to_thread(crash.server.kill)
        else:
            await crash.kill_turn_worker()
    finally:
        twilio.release_answers()  # Twilio answers a connection nobody holds any more
    if whole:
        gone = await until_or_false(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10)
        result.check(gone, f"{what}: the killed server's children {children} outlived it")
        await crash.server.start(db)
    message = await until(lambda: crash.answered(form["MessageSid"]), WITHIN, "the text to be settled after restart")

    async def settled() -> Any:
        turn = await crash.turn(message["turn_id"])
        return turn if turn["status"] in ("delivered", "failed") else None

    turn = await until_or_false(settled, 20)
    await asyncio.sleep(0.5)
    sent = crash.sent_to_owner(body)
    crash.result.double_sends += max(0, len(sent) - 1)
    result.check(len(sent) == 1, f"{what}: Twilio was sent the reply {len(sent)} times, not once")
    replies = await crash.replies(message["turn_id"])
    crash.result.double_posts += max(0, len(replies) - 1)
    result.check(
        [(r["provider_message_id"], r["delivery_status"]) for r in replies] == [(sent[0].sid, "delivered")],
        f"{what}: the reply's record {[dict(r) for r in replies]} (Twilio sent {[m.sid for m in sent]})",
    )
    result.check(bool(turn) and turn["status"] == "delivered", f"{what}: the turn {turn and dict(turn)}")
    result.check(twilio.lists > lists, f"{what}: Twilio's message list was never read")


CASES: dict[str, Callable[[Crash], Awaitable[None]]] = {
    "worker": case_worker,
    "scheduler": case_scheduler,
    "webhook": case_webhook,
    "send": case_send,
    "send-worker": case_send_worker,
}


async def _final(crash: Crash) -> None:
    """Across every case: no reply left ``sending``, every text answered, each turn posted once."""
    db, result = crash.db, crash.result
    stuck = await db.fetchval("SELECT count(*) FROM messages WHERE delivery_status = 'sending'")
    result.check(stuck == 0, f"{stuck} replies left 'sending'")
    open_ = await db.fetchval(
        "SELECT count(*) FROM messages WHERE direction = 'inbound' AND handling IN ('queued', 'running')"
    )
    result.lost += open_
    result.check(open_ == 0, f"{open_} texts never answered")
    twice = await db.fetchval(
        "SELECT count(*) FROM (SELECT turn_id FROM messages WHERE direction = 'outbound' AND turn_id IS NOT NULL"
        " AND channel = 'sms' GROUP BY turn_id HAVING count(*) > 1) t"
    )
    result.double_posts += twice
    result.check(twice == 0, f"{twice} turns posted more than once")


async def run(
    *, cases: list[str] | None = None, calls: CallCase | None = None, dsn: str | None = None,
    base_env: dict[str, str] | None = None,
) -> Result:  # fmt: skip
    """Run the suite (``cases``: names from ``CASES``, all by default; ``calls``: the media process
    case) and return its figures; never raises for a failed check (see ``failures``). ``dsn``: a
    migrated or empty database to use; without it, an embedded Postgres of its own."""
    result = Result()
    root = Path(tempfile.mkdtemp(prefix="pepper-crash-"))
    pg = None

    def stop() -> None:
        if pg is not None:
            pg.stop(discard=True)

    async with harness(result, root, stop):
        if dsn is None:
            (root / "pg").mkdir()
            pg = EmbeddedPostgres(root / "pg", settings=DISPOSABLE_SERVER)
            admin = await asyncio.to_thread(pg.start)
            dsn = await DatabaseFactory(admin).create_empty()
        async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
            env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("PEPPER_")}
            env.update({
                "DATABASE_URL": dsn, "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_SECRET_KEY": generate_key(),
                "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
                "PEPPER_TWILIO_API_URL": twilio.api_url, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url,
                "PEPPER_GRACEFUL_TIMEOUT": "5", "PEPPER_TURN_WORKERS": "1",
                "PEPPER_ROOMS_ENABLED": "false", "PEPPER_MEMORY_JOBS_INTERVAL": "3600",
                "PEPPER_SCHEDULER_ENABLED": "true", "PEPPER_SCHEDULER_POLL_SECONDS": "0.5",
                "PEPPER_SCHEDULER_LEASE_SECONDS": str(LEASE_SECONDS), "PYTHONWARNINGS": "ignore",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
            })  # fmt: skip
            env.update(calls.env if calls else {})
            server = Server(root, env, MEDIA_PROCESSES if calls else 1)
            db = await Database.open(dsn, max_size=4)
            crash = Crash(server, db, twilio, model, result)
            try:
                t0 = time.monotonic()
                await server.start(db)
                result.timings["start"] = time.monotonic() - t0
                twilio.send_receipts(server.url, PUBLIC)
                account = await identity.create_account(db, "Ada")
                await identity.add_handle(db, account.id, "phone", OWNER, verified=True)
                await identity.assign_line(db, LINE, "personal", account.id)
                crash.account_id = account.id
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WITHIN)) as session:
                    crash.session = session
                    for name in cases if cases is not None else list(CASES):
                        await _case(crash, name, CASES[name])
                    if calls is not None:

                        async def call_case(crash: Crash) -> None:
                            for ok, what in await calls.run(crash):
                                result.check(ok, f"call: {what}")

                        await _case(crash, "call", call_case)
                    await _final(crash)
                result.check(server.proc is not None and server.proc.poll() is None, "the server stopped by itself")
            finally:
                await asyncio.to_thread(server.stop)
                await db.close()
            if result.failures:
                result.failures.append(f"the server's log ends: {server.tail()}")
    return result


async def _case(crash: Crash, name: str, case: Callable[[Crash], Awaitable[None]]) -> None:
    t0 = time.monotonic()
    try:
        await case(crash)
    except Exception as exc:  # one case failing leaves the others to run
        crash.result.check(False, f"{name}: {type(exc).__name__}: {exc}")
        if crash.server.proc is None or crash.server.proc.poll() is not None:
            await crash.server.start(crash.db)
    crash.result.timings[name] = time.monotonic() - t0
