"""Postgres restart under load (issue 31, suite 2): one ``pepper serve`` takes a steady stream of
texts from the loopback Twilio, with calls in progress, while its Postgres is stopped and started.

Two ways, ``mode``:
- ``embedded``: the server's own embedded Postgres, in its data dir (no ``DATABASE_URL``), is
  stopped and started under it from outside, with ``pg_ctl`` on that cluster
  (``EmbeddedPostgres(<data dir>).stop()`` then ``.start()``: the same socket folder, settings and
  authentication the server gave it; the server's pool reconnects on its own);
- ``external``: a separate Postgres (``core.testing.postgres``'s embedded server, given to the
  server by ``DATABASE_URL``) is stopped and started.

Used by ``scripts/suite-postgres-restart`` (200 texts a second, 20 calls) and, smaller, by
``tests/test_gateway_postgres_restart.py``. What is checked, from the outside:
- every acknowledgement (2xx) is of a text recorded once and answered once: it sits in one
  finished turn and each person got exactly one reply per answer (none lost, none twice), as many
  as the Twilio peer was sent;
- what was refused meanwhile was refused retryably: 503 with ``Retry-After`` (or no connection),
  never a 200 for a text then lost; the senders retry a refused text as Twilio does;
- the calls side (``voice.testing.outage_calls``): audio both ways during the outage, the records
  written once after it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

from core import identity
from core.store import EMBEDDED_DATABASE, Database
from core.store.embedded import EmbeddedPostgres
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DISPOSABLE_SERVER, DatabaseFactory
from core.testing.processes import free_port
from core.testing.suite import SuiteResult, harness, healthy, processes, spawn_serve, texts_settled
from core.testing.twilio_peer import TwilioPeer
from core.vault import generate_key

TOKEN = "twilio-restart-auth-token"
PUBLIC = "https://pepper.example.org"
LINE = "+14155550100"
OWNER = "+14155550111"  # the one who calls; the senders only text
RETRY_EVERY = 0.2  # seconds before a sender tries again after no connection (503: its Retry-After)
ATTEMPTS = 100


@dataclass
class Served:
    """What the calls side needs to reach the server."""

    web: str
    media: str
    owner: str
    line: str
    public: str
    token: str
    account_sid: str


class CallsSide(Protocol):
    env: dict[str, str]
    kept: int
    count: int

    async def place(self, served: Served) -> list[tuple[bool, str]]: ...

    async def during_outage(self) -> list[tuple[bool, str]]: ...

    async def end(self, db: Database) -> list[tuple[bool, str]]: ...


@dataclass
class Result(SuiteResult):
    mode: str = ""
    acknowledged: int = 0
    lost: int = 0
    duplicates: int = 0
    refused: int = 0  # answers other than 200, all told
    refused_down: int = 0  # of those, while Postgres was down (stop begun to start done)
    calls: int = 0
    calls_kept: int = 0

    def check(self, ok: bool, what: str) -> None:
        super().check(ok, f"{self.mode}: {what}")

    def summary(self) -> str:
        return (
            f"postgres restart ({self.mode}): cases run {self.cases}, failures {len(self.failures)},"
            f" messages lost: {self.lost}, duplicates: {self.duplicates}, calls kept: {self.calls_kept}/{self.calls},"
            f" acknowledged {self.acknowledged}, refused while down {self.refused_down}"
            f" (refused in all {self.refused}, each 503 + Retry-After or no connection); {self.times()}"
        )


async def run(
    *, mode: str, rate: int, senders: int, before: float = 2.0, down: float = 3.0, after: float = 2.0,
    base_env: dict[str, str] | None = None, side: CallsSide | None = None, server_env: dict[str, str] | None = None,
) -> Result:  # fmt: skip
    """Run the suite once (``mode``: ``embedded`` or ``external``); never raises for a failed
    check (see ``failures``). ``server_env``: more settings for the server."""
    assert mode in ("embedded", "external")
    result = Result(mode=mode)
    root = Path(tempfile.mkdtemp(prefix="pepper-pg-restart-"))
    external = EmbeddedPostgres(root / "pg", settings=DISPOSABLE_SERVER) if mode == "external" else None

    def stop() -> None:
        if external is not None:
            external.stop(discard=True)
        else:  # the server stops its own; one it left running (it died) is stopped here
            EmbeddedPostgres(root / "data").stop(discard=True)

    async with harness(result, root, stop):
        dsn = None
        if external is not None:
            (root / "pg").mkdir()
            dsn = await DatabaseFactory(await asyncio.to_thread(external.start)).create_empty()
        async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
            model.script(*[reply_text("Got it.")] * int(rate * (before + down + after) * 2 + 100))
            async with processes() as procs:
                await _suite(result, root, dsn, external, twilio, model, procs, rate, senders, before, down, after,
                             base_env, side, server_env)  # fmt: skip
    return result


async def _suite(
    result: Result, root: Path, dsn: str | None, external: EmbeddedPostgres | None, twilio: TwilioPeer,
    model: OpenAIPeer, procs: list, rate: int, senders: int, before: float, down: float, after: float,
    base_env: dict[str, str] | None, side: CallsSide | None, server_env: dict[str, str] | None,
) -> None:  # fmt: skip
    env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("PEPPER_") and k != "DATABASE_URL"}
    port, media_port = free_port(), free_port()
    env.update({
        "PEPPER_DATA_DIR": str(root / "data"), "PEPPER_PORT": str(port), "PEPPER_MEDIA_PORT": str(media_port),
        "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_SECRET_KEY": generate_key(),
        "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN, "PEPPER_TWILIO_API_URL": twilio.api_url,
        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "10",
        "PEPPER_MEDIA_PROCESSES": "1", "PEPPER_ROOMS_ENABLED": "false", "PEPPER_MEMORY_JOBS_INTERVAL": "3600",
        "PYTHONWARNINGS": "ignore",
    })  # fmt: skip
    if dsn is not None:
        env["DATABASE_URL"] = dsn
    env.update(server_env or {})
    env.update(side.env if side else {})
    log_path = root / "server.log"
    t0 = time.monotonic()
    spawn_serve(procs, env, log_path)
    web = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        await healthy(session, web, procs[0], within=120, log_path=log_path)
        result.timings["start"] = time.monotonic() - t0
        pg = external or EmbeddedPostgres(root / "data")  # the one restarted
        db_dsn = dsn or pg.dsn(EMBEDDED_DATABASE)
        db = await Database.open(db_dsn, min_size=0, max_size=4)  # no floor to restore while it is down
        try:
            await _load(result, session, web, media_port, db, db_dsn, pg, twilio, procs, rate, senders, before,
                        down, after, side)  # fmt: skip
        finally:
            await db.close()
            if os.environ.get("SUITE_SERVER_LOG"):  # the server's log, kept for a look
                shutil.copy(log_path, os.environ["SUITE_SERVER_LOG"])
        result.check(procs[0].poll() is None, f"the server stopped: {log_path.read_text()[-2000:]}")


async def _load(
    result: Result, session: aiohttp.ClientSession, web: str, media_port: int, db: Database, db_dsn: str,
    pg: EmbeddedPostgres, twilio: TwilioPeer, procs: list, rate: int, senders: int, before: float, down: float,
    after: float, side: CallsSide | None,
) -> None:  # fmt: skip
    numbers = [f"+1415555{4000 + i:04d}" for i in range(senders)]
    owner = await identity.create_account(db, "Owner")
    await identity.add_handle(db, owner.id, "phone", OWNER, verified=True)
    await identity.assign_line(db, LINE, "personal", owner.id)
    for number in numbers:
        account = await identity.create_account(db, f"Person {number[-4:]}")
        await identity.add_handle(db, account.id, "phone", number, verified=True)
    if side is not None:
        served = Served(web, f"ws://127.0.0.1:{media_port}", OWNER, LINE, PUBLIC, TOKEN, twilio.account_sid)
        t_calls = time.monotonic()
        for ok, what in await side.place(served):
            result.check(ok, what)
            result.calls += 1
        result.timings["calls placed"] = time.monotonic() - t_calls

    acked: list[str] = []
    answers: list[tuple[float, int, str]] = []  # (when, status, Retry-After)
    window = [float("inf"), float("inf")]  # Postgres down: from the stop begun to the start done
    sent = 0

    async def deliver(form: dict[str, str]) -> None:
        """Post until acknowledged, as Twilio retries a webhook that failed (after Retry-After)."""
        headers = {"X-Twilio-Signature": twilio.sign(PUBLIC + "/twilio/sms", form)}
        for _ in range(ATTEMPTS):
            wait = RETRY_EVERY
            try:
                async with session.post(web + "/twilio/sms", data=form, headers=headers) as response:
                    await response.read()
                    answers.append((time.monotonic(), response.status, response.headers.get("Retry-After", "")))
                    if response.status == 200:
                        acked.append(form["MessageSid"])
                        return
                    if response.headers.get("Retry-After", "").isdigit():
                        wait = float(response.headers["Retry-After"])
            except (aiohttp.ClientError, TimeoutError):
                answers.append((time.monotonic(), 0, ""))
            await asyncio.sleep(wait)
        result.failures.append(f"{result.mode}: {form['MessageSid']} never acknowledged")

    async def texts(seconds: float) -> None:
        """``rate`` new texts a second, open loop, from the senders in turn."""
        nonlocal sent
        tasks, begin = [], time.monotonic()
        for i in range(int(rate * seconds)):
            delay = begin + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            form = twilio.inbound_message(sender=numbers[sent % senders], to=LINE, body=f"text {sent}")
            sent += 1
            tasks.append(asyncio.create_task(deliver(form)))
        await asyncio.gather(*tasks)

    async def restart() -> None:
        await asyncio.sleep(before)
        window[0] = time.monotonic()
        await asyncio.to_thread(pg.stop)
        result.timings["stop took"] = time.monotonic() - window[0]
        t_down = time.monotonic()
        for ok, what in await side.during_outage() if side else ():
            result.check(ok, what)
        result.check(not pg.is_running(), "Postgres came back before the calls were checked")
        await asyncio.sleep(max(0.0, down - (time.monotonic() - t_down)))
        result.timings["down"] = time.monotonic() - t_down
        await asyncio.to_thread(pg.start)
        window[1] = time.monotonic()

    # Steady state first, as a server that has been up a while: the turn workers are up and answering.
    t_warm = time.monotonic()
    await deliver(twilio.inbound_message(sender=numbers[0], to=LINE, body="warm-up"))
    sent += 1
    await twilio.wait_for_sent(1, within=180)
    answers.clear()
    result.timings["warm-up"] = time.monotonic() - t_warm
    t_send = time.monotonic()
    await asyncio.wait_for(asyncio.gather(texts(before + down + after), restart()), 600)
    result.timings["send"] = time.monotonic() - t_send
    result.acknowledged = len(acked)
    refused = [(t, s, r) for t, s, r in answers if s != 200]
    result.refused = len(refused)
    result.refused_down = sum(1 for t, _, _ in refused if window[0] <= t <= window[1])
    result.check(bool(refused), "the restart never reached an acknowledgement")
    result.check({s for _, s, _ in refused} <= {503, 0}, f"refused with {sorted({s for _, s, _ in refused})}")
    result.check(
        all(r == "1" for _, s, r in refused if s == 503), "a 503 without Retry-After: 1"
    )  # as gateway.app answers
    await texts_settled(db, len(set(acked)), within=300, turn_channel="sms")
    result.timings["settled"] = time.monotonic() - t_send
    if side is not None:
        for ok, what in await side.end(db):
            result.check(ok, what)
        result.calls_kept = side.kept
    await asyncio.sleep(0.5)  # a late second reply would show here
    await verify(result, db, twilio, acked, sent, numbers)


class Tally(Protocol):
    """What ``verify`` reports into (a suite's ``Result``)."""

    lost: int
    duplicates: int

    def check(self, ok: bool, what: str) -> None: ...


async def verify(
    result: Tally, db: Database, twilio: TwilioPeer, acked: list[str], sent: int, numbers: list[str]
) -> None:
    """Every acknowledged text recorded once, in one finished turn; each person one reply per
    answer; the Twilio peer was sent what the store says was sent."""
    check = result.check
    check(len(set(acked)) == sent, f"{len(set(acked))} acknowledged of {sent} sent")
    rows = await db.fetch(
        "SELECT provider_message_id, turn_id, handling FROM messages WHERE direction = 'inbound' AND channel = 'sms'"
    )
    recorded = [r["provider_message_id"] for r in rows]
    result.duplicates += len(recorded) - len(set(recorded))
    lost = len(set(acked) - set(recorded))
    check(lost == 0 and sorted(set(recorded)) == sorted(set(acked)), "recorded texts differ from the acknowledged")
    unanswered = [r for r in rows if r["turn_id"] is None or r["handling"] != "done"]
    lost += len(unanswered)
    check(not unanswered, f"{len(unanswered)} texts in no finished turn")
    per_person = await db.fetch(
        "SELECT c.id, count(DISTINCT i.turn_id) AS answers,"
        " (SELECT count(*) FROM messages o WHERE o.conversation_id = c.id AND o.direction = 'outbound'"
        "  AND o.channel = 'sms') AS replies"
        " FROM conversations c JOIN messages i ON i.conversation_id = c.id AND i.direction = 'inbound'"
        " AND i.channel = 'sms' GROUP BY c.id"
    )
    check(len(per_person) == len(numbers), f"{len(per_person)} people wrote of {len(numbers)}")
    extra = sum(max(0, r["replies"] - r["answers"]) for r in per_person)
    missing = sum(max(0, r["answers"] - r["replies"]) for r in per_person)
    result.duplicates += extra
    result.lost += lost + missing
    check(not extra and not missing, f"replies vs answers: {extra} extra, {missing} missing")
    to_senders = [m for m in twilio.sent if m.to in set(numbers)]
    outbound = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound' AND channel = 'sms'")
    detail = ""
    if len(to_senders) != outbound:  # which person's count differs, for the report
        stored = await db.fetch(
            "SELECT h.value AS number, count(*) AS n FROM messages o JOIN conversations c ON c.id = o.conversation_id"
            " JOIN handles h ON h.account_id = c.account_id AND h.kind = 'phone'"
            " WHERE o.direction = 'outbound' AND o.channel = 'sms' GROUP BY h.value"
        )
        by_number = {r["number"]: r["n"] for r in stored}
        sent_to = {n: sum(1 for m in to_senders if m.to == n) for n in numbers}
        detail = "; " + repr(
            {n: (sent_to[n], by_number.get(n, 0)) for n in numbers if sent_to[n] != by_number.get(n, 0)}
        )
        detail += " " + repr(
            [m.body[:60] for m in to_senders if m.to in {n for n in numbers if sent_to[n] != by_number.get(n, 0)}]
        )
    check(len(to_senders) == outbound, f"Twilio was sent {len(to_senders)}, the store has {outbound}{detail}")


async def calls_settled(db: Database, call_sids: list[str]) -> int:
    """How many of these calls are completed, with their turn finished."""
    return await db.fetchval(
        "SELECT count(*) FROM calls c JOIN turns t ON t.id = c.turn_id WHERE c.call_sid = ANY($1)"
        " AND c.status = 'completed' AND t.status IN ('delivered', 'failed')",
        call_sids,
    )


async def call_outcome(db: Database, call_sid: str, heard: str, answer: str) -> dict[str, object] | None:
    """A call's record: its status and end reason, its turn's status, and how many times the
    caller's line ``heard`` and the model's ``answer`` were recorded."""
    row = await db.fetchrow(
        "SELECT c.status, c.end_reason, t.status AS turn_status,"
        " (SELECT count(*) FROM messages m WHERE m.provider_message_id LIKE c.call_sid || ':%'"
        "  AND m.body = $2) AS heard,"
        " (SELECT count(*) FROM messages m WHERE m.turn_id = c.turn_id AND m.direction = 'outbound'"
        "  AND m.body = $3) AS answered"
        " FROM calls c LEFT JOIN turns t ON t.id = c.turn_id WHERE c.call_sid = $1",
        call_sid,
        heard,
        answer,
    )
    return dict(row) if row is not None else None
