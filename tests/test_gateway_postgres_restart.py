"""Postgres restarts under a stream of texts: while it is down, acknowledgements fail with a
retryable status (503 and Retry-After, never 200-then-lost); the senders retry, as Twilio's
retry policy does; once it is back, every acknowledged message is answered exactly once.

The first test's server (in this process) has its own embedded Postgres (not the suite's shared
one), restarted with pg_ctl while the texts keep coming. The last runs a real ``pepper serve``
(``core.testing.postgres_restart``) with calls in progress on an external Postgres given by
DATABASE_URL; ``scripts/suite-postgres-restart`` also restarts the server's own embedded one under
it, at 200 texts a second with 20 calls."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp

from core import identity
from core.settings import Settings
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DISPOSABLE_SERVER, DatabaseFactory
from core.testing.postgres_restart import run
from core.testing.twilio_peer import TwilioPeer
from gateway.server import running_app
from voice.testing.outage_calls import OutageCalls

TOKEN = "twilio-restart-auth-token"
PUBLIC = "https://pepper.example.org"
LINE = "+14155550100"
SENDERS = 30
WAVES = 4  # at least: one before, two or more while Postgres restarts, two after
RETRY_EVERY = 0.2


async def _settled(db: Database, expected: int, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        inbound = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'inbound'")
        open_ = await db.fetchval(
            "SELECT count(*) FROM messages WHERE direction = 'inbound' AND handling IN ('queued', 'running')"
        )
        running = await db.fetchval("SELECT count(*) FROM turns WHERE status = 'running'")
        if inbound >= expected and not open_ and not running:
            return
        await asyncio.sleep(0.05)
    stacks = []
    for task in asyncio.all_tasks():  # what is still waiting, for the failure's report
        frames = task.get_stack(limit=6)
        stacks.append(f"{task.get_name()}: " + " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in frames))
    raise AssertionError(
        f"not settled: {inbound} of {expected} inbound, {open_} open, {running} turns running\n" + "\n".join(stacks)
    )


async def test_texts_across_a_postgres_restart_are_each_answered_exactly_once():
    root = Path(tempfile.mkdtemp(prefix="pepper-restart-pg-"))
    pg = EmbeddedPostgres(root, settings=DISPOSABLE_SERVER)
    try:
        admin = await asyncio.to_thread(pg.start)
        factory = DatabaseFactory(admin)
        await factory.prepare_template()
        dsn = await factory.create()
        db = await Database.open(dsn)
        senders = [f"+1415555{2000 + i:04d}" for i in range(SENDERS)]
        for number in senders:
            account = await identity.create_account(db, f"Person {number[-4:]}")
            await identity.add_handle(db, account.id, "phone", number, verified=True)
            await identity.assign_line(db, LINE, "personal", account.id) if number == senders[0] else None
        async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
            model.script(*[reply_text("Got it.")] * (SENDERS * WAVES * 4))
            config = Settings(
                database_url=dsn, public_url=PUBLIC, twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
                twilio_api_url=twilio.api_url, openai_api_key="sk-test", openai_base_url=model.base_url, port=0,
            )  # fmt: skip
            async with running_app(config, db) as (_, port), aiohttp.ClientSession() as session:
                local = f"http://127.0.0.1:{port}"
                statuses: list[int] = []
                retry_after: set[str] = set()
                acked: list[str] = []

                async def deliver(form: dict[str, str]) -> None:
                    """Post until acknowledged, as Twilio retries a webhook that failed."""
                    headers = {"X-Twilio-Signature": twilio.sign(PUBLIC + "/twilio/sms", form)}
                    for _ in range(200):
                        try:
                            async with session.post(local + "/twilio/sms", data=form, headers=headers) as response:
                                statuses.append(response.status)
                                if response.status == 200:
                                    acked.append(form["MessageSid"])
                                    return
                                retry_after.add(response.headers.get("Retry-After", ""))
                        except aiohttp.ClientError:
                            statuses.append(0)
                        await asyncio.sleep(RETRY_EVERY)
                    raise AssertionError(f"{form['MessageSid']} was never acknowledged")

                async def wave(tag: str) -> None:
                    forms = [twilio.inbound_message(sender=s, to=LINE, body=f"{tag} from {s}") for s in senders]
                    await asyncio.gather(*(deliver(f) for f in forms))

                restarted = asyncio.Event()

                async def restart() -> None:
                    await asyncio.sleep(0.05)
                    await asyncio.to_thread(pg.stop)
                    await asyncio.sleep(1.0)  # down for a second, texts still coming
                    await asyncio.to_thread(pg.start)
                    restarted.set()

                async def waves_until_restarted() -> None:
                    n = 0
                    while not restarted.is_set():  # back to back, so the restart lands on some
                        await wave(f"during the restart {n}")
                        n += 1

                await wave("before")
                await asyncio.gather(waves_until_restarted(), restart())
                for n in range(WAVES - 2):
                    await wave(f"after {n}")
                await _settled(db, len(acked))
                await asyncio.sleep(0.2)  # a late duplicate reply would show here

                # Acknowledged is answered: every message recorded once, each in one finished turn.
                assert len(acked) == len(set(acked)) >= SENDERS * WAVES
                rows = await db.fetch(
                    "SELECT provider_message_id, turn_id, handling FROM messages WHERE direction = 'inbound'"
                )
                assert sorted(r["provider_message_id"] for r in rows) == sorted(acked)
                assert all(r["turn_id"] is not None for r in rows), [r for r in rows if r["turn_id"] is None][:3]
                # Each person got exactly one reply per answer: a turn's reply, or the apology when the
                # restart cut the turn short (it carries no turn); none missing, none twice.
                per_person = await db.fetch(
                    "SELECT c.id, count(DISTINCT i.turn_id) AS answers,"
                    " (SELECT count(*) FROM messages o WHERE o.conversation_id = c.id AND o.direction = 'outbound')"
                    " AS replies FROM conversations c JOIN messages i ON i.conversation_id = c.id"
                    " AND i.direction = 'inbound' GROUP BY c.id"
                )
                assert len(per_person) == SENDERS
                wrong = [dict(r) for r in per_person if r["replies"] != r["answers"]]
                assert not wrong, wrong[:5]
                outbound = await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'outbound'")
                assert outbound == len(twilio.sent)
                # The restart was felt, and said so retryably: 503 with Retry-After, or no connection.
                refused = [s for s in statuses if s != 200]
                assert refused, "the restart never reached an acknowledgement"
                assert set(refused) <= {503, 0}, set(refused)
                if 503 in refused:
                    assert retry_after == {"1"}, retry_after
        await db.close()
        await factory.drop(dsn)
    finally:
        await asyncio.to_thread(pg.stop, discard=True)
        shutil.rmtree(root, ignore_errors=True)


# A real ``pepper serve`` (core.testing.postgres_restart, at a smaller load than
# scripts/suite-postgres-restart): texts at a steady rate and calls in progress while its Postgres
# restarts; the calls keep their audio both ways and their records are written once it is back.


# One turn worker, at the web server's priority: on a busy CI machine an idle-class worker can
# wait tens of seconds for its first CPU (the scripts keep the defaults).
SMALL = {"PEPPER_TURN_WORKERS": "1", "PEPPER_TURN_WORKER_IDLE": "false", "PEPPER_TURN_WORKER_NICE": "0"}


async def test_an_external_postgres_restarting_under_texts_and_calls(subprocess_env):
    async with OutageCalls(2) as calls:
        result = await run(mode="external", rate=20, senders=5, before=1, down=1.5, after=1, base_env=subprocess_env,
                           side=calls, server_env=SMALL)  # fmt: skip
    assert not result.failures, result.summary() + "\n" + "\n".join(result.failures)
    assert (result.lost, result.duplicates) == (0, 0), result.summary()
    assert result.calls_kept == result.calls == 2, result.summary()
    assert result.refused_down > 0, result.summary()  # the outage was felt, and refused retryably
    assert result.cases >= 15, result.summary()  # every check ran
