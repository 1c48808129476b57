"""Turn workers: queued messages are claimed once, answered apart from the web server, and a
worker that dies mid-turn leaves no message silently unanswered.

The last test runs ``pepper serve`` as a user would (its own process, worker processes of its own)
against a loopback Twilio and OpenAI, and kills its workers with SIGKILL in the middle of a turn.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import identity
from core.conversation import (
    carry_claims,
    claim_turn,
    conversation_for,
    extend_hold,
    finish_handling,
    gone_claimers,
    hold_for_scheduled_turn,
    open_turn,
    record_inbound,
    release_hold,
    release_orphans,
)
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.processes import alive, free_port, spawned_children, until, until_healthy
from core.testing.twilio_peer import TwilioPeer
from gateway.channels import APOLOGY_TEXT
from gateway.composition import build_turn_services
from gateway.worker import TurnWorker

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"


async def test_two_claimers_racing_take_each_queued_message_exactly_once(db: Database):
    people = [await identity.create_account(db, f"P{i}") for i in range(30)]
    ids = {(await record_inbound(db, p.id, "web", f"m{i}", handling="queued"))[0].id for i, p in enumerate(people)}
    # Two workers (pids 1 and 2), each trying far more claims than there are messages, concurrently.
    claims = await asyncio.gather(*(claim_turn(db, 1 + i % 2) for i in range(80)))
    claimed = [row["id"] for rows in claims for row in rows]
    assert sorted(claimed) == sorted(ids)  # every message once, none twice
    assert await claim_turn(db, 1) == []
    rows = await db.fetch("SELECT handling, claimed_by FROM messages")
    assert {r["handling"] for r in rows} == {"running"} and {r["claimed_by"] for r in rows} <= {1, 2}


async def test_racing_claimers_never_answer_one_person_twice_at_once(db: Database):
    """Web posts are answered one by one; however the claims race, one turn per person at a time."""
    ada, bob = await identity.create_account(db, "Ada"), await identity.create_account(db, "Bob")
    for i in range(10):
        await record_inbound(db, ada.id, "web", f"ada {i}", handling="queued")
        await record_inbound(db, bob.id, "web", f"bob {i}", handling="queued")
    claims = [rows for rows in await asyncio.gather(*(claim_turn(db, 1 + i % 2) for i in range(40))) if rows]
    assert sorted(rows[0]["body"] for rows in claims) == ["ada 0", "bob 0"]
    assert all(len(rows) == 1 for rows in claims)
    await finish_handling(db, [claims[0][0]["id"]])
    [following] = [rows for rows in await asyncio.gather(*(claim_turn(db, 2) for _ in range(10))) if rows]
    assert following[0]["body"] == ("ada 1" if claims[0][0]["body"] == "ada 0" else "bob 1")


async def test_a_scheduled_turns_hold_and_message_turns_exclude_each_other(db: Database):
    ada, bob = await identity.create_account(db, "Ada"), await identity.create_account(db, "Bob")
    conversation, lease = await conversation_for(db, ada.id), timedelta(seconds=60)
    first = (await record_inbound(db, ada.id, "web", "first", handling="queued"))[0].id
    [claimed] = await claim_turn(db, 1)
    # A message turn is answering Ada: a scheduled turn may not hold her conversation.
    assert not await hold_for_scheduled_turn(db, conversation, lease=lease)
    await finish_handling(db, [claimed["id"]])
    assert claimed["id"] == first
    assert await hold_for_scheduled_turn(db, conversation, lease=lease)
    assert not await hold_for_scheduled_turn(db, conversation, lease=lease)  # one scheduled turn at a time
    # Held: Ada's new message waits; Bob's is answered.
    waiting = (await record_inbound(db, ada.id, "web", "while held", handling="queued"))[0].id
    bobs = (await record_inbound(db, bob.id, "web", "Bob's", handling="queued"))[0].id
    assert [r["id"] for r in await claim_turn(db, 1)] == [bobs]
    await extend_hold(db, conversation, lease=lease)
    assert await claim_turn(db, 1) == []
    # Released: the turn workers are told, and Ada's message is claimed.
    listener = await asyncpg.connect(db.dsn)
    told: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("pepper_turns", lambda *args: told.put_nowait(args[-1]))
    try:
        await release_hold(db, conversation)
        await asyncio.wait_for(told.get(), 5)
    finally:
        await listener.close()
    assert [r["id"] for r in await claim_turn(db, 1)] == [waiting]
    await finish_handling(db, [waiting])
    # A hold whose process died expires with its lease.
    assert await hold_for_scheduled_turn(db, conversation, lease=timedelta(milliseconds=1))
    later = (await record_inbound(db, ada.id, "web", "after a crash", handling="queued"))[0].id
    await asyncio.sleep(0.01)
    assert [r["id"] for r in await claim_turn(db, 1)] == [later]


async def test_a_burst_of_texts_from_one_sender_is_claimed_as_one_turn(db: Database):
    ada, bob = await identity.create_account(db, "Ada"), await identity.create_account(db, "Bob")
    phone = await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)

    async def text(body: str, to: str = LINE) -> int:
        meta = {"from": OWNER, "to": to}
        message, _ = await record_inbound(db, ada.id, "sms", body, handle_id=phone.id, handling="queued", meta=meta)
        return message.id

    first = [await text("one"), await text("two")]
    web = (await record_inbound(db, ada.id, "web", "from the browser", handling="queued"))[0].id
    first.append(await text("three"))
    other_line = await text("to my other number", to="+14155550199")
    bobs = (await record_inbound(db, bob.id, "web", "Bob's", handling="queued"))[0].id
    burst = await claim_turn(db, 1)
    assert [r["id"] for r in burst] == first and [r["body"] for r in burst] == ["one", "two", "three"]
    assert {r["account_id"] for r in burst} == {ada.id}
    # Ada's other messages wait for her turn; Bob's does not.
    assert [r["id"] for r in await claim_turn(db, 2)] == [bobs]
    assert await claim_turn(db, 2) == []
    await finish_handling(db, first)
    assert [r["id"] for r in await claim_turn(db, 2)] == [web]  # a web post is answered on its own
    await finish_handling(db, [web])
    assert [r["id"] for r in await claim_turn(db, 2)] == [other_line]
    # A burst has a bound: it keeps a single turn's prompt small.
    await finish_handling(db, [other_line])
    many = [await text(f"text {i}") for i in range(5)]
    assert [r["id"] for r in await claim_turn(db, 1, burst=3)] == many[:3]


async def test_texts_left_by_a_turn_cut_short_come_back_together_and_alone(db: Database):
    """Messages whose turn a dead worker left are claimed as that turn's group (they get its
    apology), not merged with texts sent since (those get a turn of their own)."""
    ada = await identity.create_account(db, "Ada")
    phone = await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    meta = {"from": OWNER, "to": LINE}
    ids = [
        (await record_inbound(db, ada.id, "sms", f"t{i}", handle_id=phone.id, handling="queued", meta=meta))[0].id
        for i in range(2)
    ]
    interrupted = await claim_turn(db, 99999)  # a backend pid no live session has
    await open_turn(db, ada.id, channel="sms", inbound_message_ids=ids)  # then the worker died
    later = (await record_inbound(db, ada.id, "sms", "t2", handle_id=phone.id, handling="queued", meta=meta))[0].id
    assert [r["id"] for r in interrupted] == ids
    await release_orphans(db, stale=timedelta(minutes=10), expire_after=timedelta(hours=1))
    again = await claim_turn(db, 1)
    assert [r["id"] for r in again] == ids and again[0]["turn_id"] is not None
    await finish_handling(db, ids)
    assert [r["id"] for r in await claim_turn(db, 1)] == [later]


async def test_a_gone_sessions_claims_go_back_only_when_named_and_a_worker_carries_its_own_over(db: Database):
    """A sweep hands back the claims of the gone sessions it names (those gone for the grace),
    not the others; a worker that listens again takes its running turns' messages over to its
    new session, those still under its old one or queued again, never another worker's."""
    people = [await identity.create_account(db, name) for name in ("Ada", "Bob", "Cy", "Di")]
    ids = []
    for person, pid in zip(people, (99999, 99998, 99997, None), strict=True):
        message, _ = await record_inbound(db, person.id, "web", "hello", handling="queued")
        if pid is not None:
            await claim_turn(db, pid)  # backend pids no live session has
        ids.append(message.id)
    live = await db.fetchval("SELECT pg_backend_pid()")
    await db.execute("UPDATE messages SET claimed_by = $2 WHERE id = $1", ids[2], live)  # as if claimed by it
    assert await gone_claimers(db) == {99999, 99998}
    await release_orphans(db, stale=timedelta(minutes=10), expire_after=timedelta(hours=1), claimers=[])
    assert await gone_claimers(db) == {99999, 99998}  # none named: none handed back
    await release_orphans(db, stale=timedelta(minutes=10), expire_after=timedelta(hours=1), claimers=[99998, live])
    handling = "SELECT handling, claimed_by FROM messages WHERE id = $1"
    assert tuple(await db.fetchrow(handling, ids[1])) == ("queued", None)
    assert tuple(await db.fetchrow(handling, ids[2])) == ("running", live)  # its session lives
    # The worker of 99999 (and of 99998, queued again meanwhile) listens again as 4242.
    assert await carry_claims(db, ids, [99999, 99998], 4242) == {ids[0], ids[1], ids[3]}
    carried = [("running", 4242), ("running", 4242), ("running", live), ("running", 4242)]
    assert [tuple(await db.fetchrow(handling, i)) for i in ids] == carried
    assert await carry_claims(db, ids, [99999], 4343) == set()  # a duplicate carry takes nothing


async def test_a_claim_in_progress_never_holds_up_recording_a_message(db: Database):
    """The claim locks the person's conversation row, and every new message's foreign key points
    at it: the acknowledgement of a webhook must not wait for a turn worker's claim to commit."""
    ada = await identity.create_account(db, "Ada")
    await record_inbound(db, ada.id, "web", "first", handling="queued")
    async with db.transaction() as conn:
        assert [r["body"] for r in await claim_turn(conn, 1)] == ["first"]
        # The claim's transaction is still open, its locks held.
        message, created = await asyncio.wait_for(record_inbound(db, ada.id, "web", "second", handling="queued"), 5)
        assert created and message.body == "second"
        assert await claim_turn(db, 2) == []  # and no other worker can take Ada's next message meanwhile


async def test_a_claim_commits_without_waiting_for_the_disk(db: Database):
    """Lost in a crash, a claim leaves its message queued to be claimed again; nothing was sent yet."""
    ada = await identity.create_account(db, "Ada")
    await record_inbound(db, ada.id, "web", "hello", handling="queued")
    async with db.transaction() as conn:
        assert (await claim_turn(conn, 1))[0]["body"] == "hello"
        assert await conn.fetchval("SHOW synchronous_commit") == "off"


async def test_marking_messages_answered_waits_for_the_disk_only_after_an_answer_with_no_turn(db: Database):
    ada = await identity.create_account(db, "Ada")
    message, _ = await record_inbound(db, ada.id, "web", "hello", handling="queued")
    for durable, expected in ((False, "off"), (True, "on")):
        async with db.transaction() as conn:
            await finish_handling(conn, [message.id], durable=durable)
            assert await conn.fetchval("SHOW synchronous_commit") == expected
    assert await db.fetchval("SELECT handling FROM messages WHERE id = $1", message.id) == "done"


async def test_a_claim_that_fails_costs_no_turn_slot(db: Database, db_url: str):
    """A worker with one slot whose claims fail for a while (here the claim function is missing)
    still answers once they work again."""
    ada = await identity.create_account(db, "Ada")
    async with OpenAIPeer() as model:
        model.script(reply_text("answered"))
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url)
        async with build_turn_services(settings, db) as services:
            await db.execute("ALTER FUNCTION pepper_claim_turn(integer, integer) RENAME TO pepper_claim_turn_gone")
            worker = TurnWorker(services, concurrency=1, poll_seconds=0.05)
            await worker.start()
            try:
                await asyncio.sleep(0.3)  # several claims fail meanwhile
                await db.execute("ALTER FUNCTION pepper_claim_turn_gone(integer, integer) RENAME TO pepper_claim_turn")
                message, _ = await record_inbound(db, ada.id, "web", "still there?", handling="queued")

                async def answered() -> bool:
                    return await db.fetchval("SELECT handling FROM messages WHERE id = $1", message.id) == "done"

                await until(answered, 10, "the message answered")
            finally:
                await asyncio.wait_for(worker.stop(5), 10)  # a slot lost for good would hang the stop too


async def test_two_workers_answer_every_queued_message_once(db: Database, db_url: str):
    ada = await identity.create_account(db, "Ada")
    async with OpenAIPeer() as model:
        model.script(*(reply_text("answered") for _ in range(40)))
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url)
        async with build_turn_services(settings, db) as one, build_turn_services(settings, db) as two:
            workers = [TurnWorker(one, concurrency=3), TurnWorker(two, concurrency=3)]
            for worker in workers:
                await worker.start()
            try:
                # Recorded after the workers listen: the announcement wakes them, no polling.
                for i in range(12):
                    await record_inbound(db, ada.id, "web", f"question {i}", handling="queued")
                for _ in range(1000):
                    if not await db.fetchval("SELECT count(*) FROM messages WHERE handling <> 'done'"):
                        break
                    await asyncio.sleep(0.01)
            finally:
                for worker in workers:
                    await worker.stop(5)
    inbound = await db.fetch("SELECT * FROM messages WHERE direction = 'inbound'")
    assert {m["handling"] for m in inbound} == {"done"}
    assert len({m["turn_id"] for m in inbound}) == 12  # one turn each
    assert await db.fetchval("SELECT count(*) FROM turns") == 12
    replies = await db.fetch("SELECT turn_id FROM messages WHERE direction = 'outbound'")
    assert sorted(r["turn_id"] for r in replies) == sorted(m["turn_id"] for m in inbound)
    assert {m["claimed_by"] for m in inbound} <= {workers[0].pid, workers[1].pid}


async def test_a_turn_whose_worker_died_before_sending_its_reply_has_the_reply_sent_once(db: Database, db_url: str):
    """Finished (``replied``) with no reply message recorded: the worker died between the two.
    The next worker sends that reply as the turn's, once, without running the turn again; a turn
    whose reply was recorded gets nothing more."""
    ada = await identity.create_account(db, "Ada")
    turns = []
    for text in ("unsent", "sent"):
        [message] = [(await record_inbound(db, ada.id, "web", text, handling="queued"))[0]]
        await claim_turn(db, 99999)  # a backend pid no live session has
        turn = (await open_turn(db, ada.id, channel="web", inbound_message_ids=[message.id])).turn_id
        await db.execute("UPDATE turns SET status = 'replied', reply = $2 WHERE id = $1", turn, f"the {text} reply")
        turns.append(turn)
    sent = "INSERT INTO messages (conversation_id, channel, direction, body, turn_id) SELECT conversation_id, 'web',"
    await db.execute(sent + " 'outbound', 'the sent reply', $1 FROM turns WHERE id = $1", turns[1])
    async with OpenAIPeer() as model:
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url)
        async with build_turn_services(settings, db) as services:
            worker = TurnWorker(services, concurrency=2, poll_seconds=0.05, orphan_grace=0.0)  # pid 99999 is dead
            await worker.start()
            try:

                async def answered() -> bool:
                    return not await db.fetchval("SELECT count(*) FROM messages WHERE handling <> 'done'"
                                                 " AND direction = 'inbound'")  # fmt: skip

                await until(answered, 10, "both messages answered")
            finally:
                await worker.stop(5)
        assert model.requests == []  # neither turn ran again
    replies = await db.fetch("SELECT turn_id, body FROM messages WHERE direction = 'outbound' ORDER BY id")
    assert sorted((r["turn_id"], r["body"]) for r in replies) == sorted(
        [(turns[1], "the sent reply"), (turns[0], "the unsent reply")]
    )


@pytest.mark.parametrize("held_at", ["model", "twilio"])
async def test_a_turn_still_running_when_its_workers_session_ends_is_answered_once(
    db: Database, db_url: str, held_at: str
):
    """The worker's listening session ends in the middle of a turn (Postgres restarted, the
    connection was cut) while the turn waits for the model, or for Twilio to take its reply (the
    ``sending`` row recorded, the MessageSid not yet known): the worker listens again and keeps
    the turn's claim, so no sweep takes the turn for a dead worker's. Before, it was answered a
    second time while the first was still on its way: an apology beside the reply, or the reply
    sent again, the lookup at Twilio not finding the send still in flight (found by
    ``scripts/suite-postgres-restart --external``: Twilio was sent one more than the store has)."""
    ada = await identity.create_account(db, "Ada")
    phone = await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    bob = await identity.create_account(db, "Bob")
    hold = asyncio.Event()
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        # Every request answers the same (the reply's repair pass asks too), the first one held.
        model.script(reply_text("Got it.", hold=hold if held_at == "model" else None), *[reply_text("Got it.")] * 4)
        if held_at == "twilio":
            twilio.hold_sends(after=0)
        settings = Settings(
            database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
            twilio_api_url=twilio.api_url, openai_api_key="sk-test", openai_base_url=model.base_url,
        )  # fmt: skip
        async with build_turn_services(settings, db) as services:
            worker = TurnWorker(services, concurrency=4, poll_seconds=0.05, orphan_grace=0.0)
            await worker.start()
            try:
                text, _ = await record_inbound(db, ada.id, "sms", "hello", handle_id=phone.id, handling="queued",
                                               meta={"from": OWNER, "to": LINE})  # fmt: skip
                if held_at == "model":
                    await until(lambda: len(model.requests) == 1, 10, "the turn waiting for the model")
                else:
                    await until(lambda: twilio.held == 1, 10, "the reply waiting for Twilio")
                old = worker.pid
                await db.execute("SELECT pg_terminate_backend($1)", old)

                async def claimed_again() -> bool:
                    now = await db.fetchval("SELECT claimed_by FROM messages WHERE id = $1", text.id)
                    return worker.pid != old and now == worker.pid

                await until(claimed_again, 10, "the worker listening again")
                # A text from Bob (on the web: his reply is held nowhere), claimed after Ada's
                # message was: by then a second answer to her would be running.
                probe, _ = await record_inbound(db, bob.id, "web", "hi", handling="queued")

                async def probe_answered() -> bool:
                    return await db.fetchval("SELECT handling FROM messages WHERE id = $1", probe.id) == "done"

                await until(probe_answered, 10, "Bob's text answered")
                # Only Ada's first turn left running, or a second answer to her waiting at Twilio.
                await until(lambda: services.tasks.pending == 1 or twilio.held == 2, 10, "the turns to settle")
                hold.set()
                twilio.release_sends()

                async def settled() -> bool:
                    waiting = await db.fetchval("SELECT count(*) FROM messages WHERE handling <> 'done'"
                                                " AND direction = 'inbound'")  # fmt: skip
                    return not waiting and services.tasks.pending == 0

                await until(settled, 10, "every text answered")
            finally:
                await worker.stop(5)
    assert [m.body for m in twilio.sent if m.to == OWNER] == ["Got it."]
    rows = await db.fetch("SELECT body, provider_message_id FROM messages WHERE direction = 'outbound'"
                          " AND channel = 'sms'")  # fmt: skip
    assert [(r["body"], r["provider_message_id"]) for r in rows] == [("Got it.", twilio.sent[0].sid)]


# --- pepper serve, its worker processes, and a worker killed mid-turn ----------------------------


async def test_serve_runs_turns_in_worker_processes_survives_a_killed_worker_and_stops_them(
    db: Database, db_url: str, subprocess_env: dict[str, str], tmp_path: Path
):
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    port = free_port()
    local = f"http://127.0.0.1:{port}"
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        env = {
            **subprocess_env, "DATABASE_URL": db_url, "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_PORT": str(port),
            "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
            "PEPPER_TWILIO_API_URL": twilio.api_url, "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "5", "PEPPER_TURN_WORKERS": "2",
            "PEPPER_SCHEDULER_ENABLED": "true", "PEPPER_MEMORY_JOBS_INTERVAL": "3600",
            "PEPPER_TURN_WORKER_NICE": "7", "PEPPER_MEDIA_PROCESSES": "1",
        }  # fmt: skip
        log_path = tmp_path / "serve.log"
        with log_path.open("w") as log_file:  # the server writes to its own copy of the descriptor
            server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=log_file
            )
        try:
            async with aiohttp.ClientSession() as session:
                await until_healthy(local, 60)
                first = await until(lambda: len(spawned_children(server.pid)) == 2 and spawned_children(server.pid),
                                    60, "two turn workers")  # fmt: skip
                # The turns run at a lower CPU priority than the acknowledgements.
                nicer = min(19, os.getpriority(os.PRIO_PROCESS, server.pid) + 7)
                await until(lambda: {os.getpriority(os.PRIO_PROCESS, pid) for pid in first} == {nicer},
                            30, "the workers to lower their priority")  # fmt: skip
                # ... and in the idle scheduling class, as the web server is not.
                await until(lambda: {os.sched_getscheduler(pid) for pid in first} == {os.SCHED_IDLE},
                            30, "the workers to enter the idle class")  # fmt: skip
                assert os.sched_getscheduler(server.pid) == os.SCHED_OTHER

                # A turn the model takes its time over: the workers are killed in the middle of it.
                model.script(reply_text("too late", delay=5))
                form = twilio.inbound_message(sender=OWNER, to=LINE, body="are you there?")
                status, _ = await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
                assert status == 200
                await until(lambda: model.requests, 30, "the turn to reach the model")
                for pid in first:
                    os.kill(pid, signal.SIGKILL)

                # The server starts new workers; one finds the message its dead worker held.
                [apology] = await twilio.wait_for_sent(1, within=60)
                assert (apology.to, apology.body) == (OWNER, APOLOGY_TEXT)
                second = await until(lambda: len(spawned_children(server.pid)) == 2 and spawned_children(server.pid),
                                     30, "two new turn workers")  # fmt: skip
                assert not second & first

                async def answered():  # type: ignore[no-untyped-def]
                    row = await db.fetchrow("SELECT handling, turn_id FROM messages WHERE direction = 'inbound'")
                    return row if row["handling"] == "done" else None

                message = await until(answered, 30, "the message to be marked answered")
                turn = await db.fetchrow("SELECT status, delivery FROM turns WHERE id = $1", message["turn_id"])
                assert turn["status"] == "failed" and "worker-died" in str(turn["delivery"])

                # The new workers answer the next message normally.
                model.script(*(reply_text("Here now.") for _ in range(3)))
                form = twilio.inbound_message(sender=OWNER, to=LINE, body="and now?")
                await twilio.post_form(local, PUBLIC, "/twilio/sms", form, session=session)
                [_, reply] = await twilio.wait_for_sent(2, within=60)
                assert reply.body == "Here now." and reply.status_callback == PUBLIC + "/twilio/status"

                # The web server's /metrics adds up every process's: the turn was a worker's, the
                # webhooks the web server's.
                async def sample(name: str, **labels: str) -> float:
                    async with session.get(local + "/metrics") as response:
                        text = await response.text()
                    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                               if s.name == name and s.labels == labels)  # fmt: skip

                turns = {"channel": "sms", "kind": "live", "status": "replied"}

                async def turn_counted() -> float:
                    return await sample("pepper_turns_total", **turns)

                await until(turn_counted, 10, "the worker's turn in /metrics")
                assert await sample("pepper_turns_total", **turns) == 1
                assert await sample("pepper_webhooks_total", provider="sms", outcome="accepted") == 2
        finally:
            # A server that already exited (it crashed) has nothing to signal: say so with its log,
            # rather than hiding the failure behind the ProcessLookupError of signalling it.
            if server.returncode is None:
                server.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(server.wait(), 60)
        assert code == 0, log_path.read_text()[-4000:]
        assert not any(alive(pid) for pid in second)  # the workers stopped with the server
    # The scheduler and the memory jobs ran in the first worker (the one that replaced it, if it was
    # killed before it was up), never beside the acknowledgements in the web server.
    log = log_path.read_text().splitlines()
    for started in ("scheduler started", "memory jobs started"):
        lines = [line for line in log if started in line]
        assert lines and all(" turns-0 " in line for line in lines), lines
