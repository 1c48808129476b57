"""Scheduled runs end to end: real Postgres, the real harness on a scripted model, the gateway's
chat deliverer. Receipts, silence on evidence, keyed deliveries, catch-up, clock jumps."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from core.conversation import claim_turn, finish_handling, record_inbound
from core.scheduling.runs import claim as claim_runs
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.testing.scripted import calls, reply
from text_loop.scheduler import SILENT_MARK, Scheduler, judge


async def _task(db, account, clock, schedule="weekdays at 07:30", prompt="Brief me on my todos.", **kw):
    async with db.transaction() as conn:
        return await create_task(
            conn, account.id, title=kw.pop("title", "Brief"), prompt=prompt,
            schedule=parse_schedule(schedule, now=clock(), timezone="Europe/Paris"), now=clock(), **kw,
        )  # fmt: skip


async def _receipts(db, task_id):
    return [
        dict(r)
        for r in await db.fetch(
            "SELECT occurrence_at, status, reason, evidence, attempts, turn_id FROM task_runs"
            " WHERE task_id = $1 ORDER BY occurrence_at",
            task_id,
        )
    ]


async def _outbound(db):
    return [r["body"] for r in await db.fetch("SELECT body FROM messages WHERE direction = 'outbound' ORDER BY id")]


async def test_a_due_task_runs_as_a_scheduled_turn_and_posts_to_chat_once(db, scheduler, models, account, clock):
    task = await _task(db, account, clock)
    assert await scheduler.run_due() == 0  # 07:00: not yet
    models.script(calls(("list_todos", {})), reply("No open todos today. Enjoy!"))
    clock.advance(minutes=36)  # 07:36 Paris: past 07:30 plus any offset
    assert await scheduler.run_due() == 1

    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran" and receipt["attempts"] == 1
    assert receipt["occurrence_at"] == datetime(2025, 6, 2, 5, 30, tzinfo=UTC)
    turn = await db.fetchrow("SELECT kind, status, channel FROM turns WHERE id = $1", receipt["turn_id"])
    assert (turn["kind"], turn["status"], turn["channel"]) == ("scheduled", "delivered", "web")
    assert await _outbound(db) == ["No open todos today. Enjoy!"]
    # The run's prompt is the task's words plus a labelled runtime note; scheduled runs use the background tier.
    newest = models.prompts[0].messages[-1].content
    assert newest.startswith("Brief me on my todos.") and "scheduled run" in newest
    assert models.received[0].background
    # Nothing more until the next weekday; the task moved on.
    assert await scheduler.run_due() == 0
    nxt = await db.fetchval("SELECT next_run_at FROM scheduled_tasks WHERE id = $1", task.id)
    assert nxt == datetime(2025, 6, 3, 5, 30, tzinfo=UTC)


async def test_silent_only_when_every_lookup_succeeded_and_found_nothing(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, prompt="Tell me if I have open todos.")
    models.script(calls(("list_todos", {}), ("search_notes", {"query": "urgent"})), reply(SILENT_MARK))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "silent"
    evidence = json.loads(receipt["evidence"])
    assert evidence["decision"] == "silent"
    assert evidence["lookups"] == [
        {"tool": "list_todos", "status": "empty"},
        {"tool": "search_notes", "status": "empty"},
    ]
    assert await _outbound(db) == []


async def test_a_completed_action_does_not_stop_silence(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, prompt="Note the check, tell me only about open todos.")
    models.script(calls(("list_todos", {}), ("add_note", {"text": "checked todos"})), reply(SILENT_MARK))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "silent"
    assert json.loads(receipt["evidence"])["actions"] == [{"tool": "add_note", "status": "ok"}]
    assert await db.fetchval("SELECT count(*) FROM notes") == 1


async def test_a_failed_lookup_reports_even_when_the_model_asks_for_silence(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, prompt="Tell me if anything is new.")
    models.script(calls(("list_todos", {}), ("current_time", {"timezone": "Mars/Olympus"})), reply(SILENT_MARK))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran"
    assert json.loads(receipt["evidence"])["why"] == ["current_time failed"]
    [body] = await _outbound(db)
    assert "found nothing to report, but I'm telling you anyway because current_time failed" in body


async def test_a_run_that_looked_at_nothing_reports(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, prompt="Tell me if anything is new.")
    models.script(reply(SILENT_MARK))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran"
    assert "it looked at nothing" in json.loads(receipt["evidence"])["why"]
    assert len(await _outbound(db)) == 1


async def test_a_lookup_that_found_data_reports(db, scheduler, models, account, clock):
    await db.execute("INSERT INTO todos (account_id, title) VALUES ($1, 'call the bank')", account.id)
    task = await _task(db, account, clock, prompt="Tell me if anything is new.")
    models.script(calls(("list_todos", {})), reply(SILENT_MARK))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran"
    assert json.loads(receipt["evidence"])["why"] == ["list_todos found something"]


def test_the_rule_fails_toward_delivery_on_every_doubtful_record():
    empty = {"id": "a", "name": "list_todos", "status": "empty", "writes": False}
    assert judge(SILENT_MARK, "replied", [empty]).silent
    assert not judge("All quiet.", "replied", [empty]).silent  # the model did not ask
    assert not judge(SILENT_MARK, "capped", [empty]).silent
    assert not judge(SILENT_MARK, "recovered", [empty]).silent
    assert not judge(SILENT_MARK, "replied", [empty], staged_writes=1).silent
    denied = {"id": "b", "name": "add_note", "status": "denied", "writes": True}
    assert judge(SILENT_MARK, "replied", [empty, denied]).why == ["add_note was refused"]
    repeat_of_failed = {"id": "c", "name": "x", "status": "failed", "writes": False}
    repeat = {"id": "d", "name": "x", "status": "repeat", "writes": False, "repeat_of": "zzz"}
    assert not judge(SILENT_MARK, "replied", [empty, repeat]).silent  # unknown original: failed
    assert not judge(SILENT_MARK, "replied", [repeat_of_failed]).silent
    repeat_of_empty = {"id": "e", "name": "list_todos", "status": "repeat", "writes": False, "repeat_of": "a"}
    assert judge(SILENT_MARK, "replied", [empty, repeat_of_empty]).silent


async def test_a_model_failure_leaves_a_failed_receipt_and_tells_the_person(db, scheduler, models, account, clock):
    from core.models.errors import ModelTransientError

    task = await _task(db, account, clock, title="Morning brief")
    models.script(ModelTransientError("down", provider="scripted"))
    clock.advance(hours=1)
    await scheduler.run_due()
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "failed" and "model did not answer" in receipt["reason"]
    [body] = await _outbound(db)
    assert "Morning brief" in body and "could not run" in body


async def test_a_reminder_arrives_even_when_the_model_is_down(db, scheduler, models, account, clock):
    from core.models.errors import ModelNotConfigured

    task = await _task(db, account, clock, schedule="in 10 minutes", prompt="call mum", kind="reminder")
    models.script(ModelNotConfigured("none"))
    clock.advance(minutes=11)
    await scheduler.run_due()
    assert await _outbound(db) == ["Reminder: call mum"]
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran"
    assert await db.fetchval("SELECT status FROM scheduled_tasks WHERE id = $1", task.id) == "done"


async def test_a_rerun_after_delivery_does_not_post_twice(db, scheduler, models, account, clock, deps, config):
    task = await _task(db, account, clock)
    models.script(calls(("list_todos", {})), reply("Nothing open."))
    clock.advance(hours=1)
    await scheduler.run_due()
    # Make the run look like its process died after delivering and before its receipt.
    await db.execute(
        "UPDATE task_runs SET status = 'running', lease_owner = 'dead', lease_expires_at = $1, ready_at = $1"
        " WHERE task_id = $2",
        clock() - timedelta(seconds=1),
        task.id,
    )
    other = Scheduler(deps, scheduler.deliverer, config, owner="test-2", clock=clock)
    assert await other.run_due() == 1
    [receipt] = await _receipts(db, task.id)
    assert receipt["status"] == "ran" and receipt["reason"] == "delivered by an earlier attempt"
    assert receipt["attempts"] == 2
    assert await _outbound(db) == ["Nothing open."]
    assert len(models.received) == 2  # no second turn


async def test_missed_occurrences_run_once_within_the_window_and_older_ones_are_recorded(
    db, scheduler, models, account, clock
):
    task = await _task(db, account, clock, schedule="every day at 08:00")
    clock.now = datetime(2025, 6, 5, 9, 0, tzinfo=UTC)  # down for three days; 11:00 in Paris
    models.script(reply("Your brief, a little late."))
    assert await scheduler.run_due() == 1
    receipts = await _receipts(db, task.id)
    assert [r["status"] for r in receipts] == ["missed", "missed", "missed", "ran"]
    assert [r["occurrence_at"].day for r in receipts] == [2, 3, 4, 5]
    assert all("catch-up window" in r["reason"] for r in receipts[:3])
    assert await _outbound(db) == ["Your brief, a little late."]


async def test_a_frequent_task_collapses_missed_runs_into_one(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, schedule="cron 0 * * * *")
    clock.advance(hours=3, minutes=30)
    models.script(reply("Hourly check."))
    assert await scheduler.run_due() == 1
    receipts = await _receipts(db, task.id)
    assert [r["status"] for r in receipts] == ["missed", "missed", "ran"]  # 08:00, 09:00; 10:00 runs
    assert receipts[0]["reason"].startswith("superseded")


async def test_clock_jumps_neither_skip_nor_double_an_occurrence(db, scheduler, models, account, clock):
    task = await _task(db, account, clock, schedule="every day at 08:00")
    models.script(reply("brief 1"), reply("brief 2"))
    clock.advance(hours=2)  # 09:00 Paris on day 1
    await scheduler.run_due()
    clock.advance(hours=-5)  # the clock steps back past the run
    assert await scheduler.run_due() == 0
    clock.advance(hours=3)
    assert await scheduler.run_due() == 0
    clock.now = datetime(2025, 6, 3, 7, 0, tzinfo=UTC)  # the next day, after a forward jump
    assert await scheduler.run_due() == 1
    assert [r["status"] for r in await _receipts(db, task.id)] == ["ran", "ran"]
    assert await _outbound(db) == ["brief 1", "brief 2"]


async def test_across_a_dst_change_each_day_runs_exactly_once(db, scheduler, models, account, clock):
    clock.now = datetime(2025, 3, 28, 12, 0, tzinfo=UTC)
    task = await _task(db, account, clock, schedule="every day at 02:30")
    models.default = reply("brief")
    end = datetime(2025, 4, 1, 12, 0, tzinfo=UTC)
    while clock.now < end:  # tick every 20 minutes through the spring-forward night
        await scheduler.run_due()
        clock.advance(minutes=20)
    receipts = await _receipts(db, task.id)
    assert [r["status"] for r in receipts] == ["ran"] * 4
    assert [r["occurrence_at"].isoformat() for r in receipts] == [
        "2025-03-29T01:30:00+00:00", "2025-03-30T01:30:00+00:00",  # 02:30 CET; then 03:30 CEST (gap)
        "2025-03-31T00:30:00+00:00", "2025-04-01T00:30:00+00:00",
    ]  # fmt: skip


async def test_two_schedulers_on_one_database_never_claim_one_occurrence_twice(
    db, models, account, clock, deps, config, scheduler
):
    for n in range(30):
        await _task(db, account, clock, schedule="cron 0 * * * *", title=f"t{n}")
    clock.advance(hours=1)
    await scheduler.tick()  # materialize only; the claims below race
    import asyncio

    results = await asyncio.gather(
        *(claim_runs(db, f"w{i}", clock(), lease=timedelta(minutes=1), limit=7) for i in range(6))
    )
    ids = [c.run_id for batch in results for c in batch]
    assert len(ids) == len(set(ids))


async def test_the_server_starts_the_scheduler_and_stops_it_on_shutdown(db, account):
    from core.settings import Settings
    from gateway.server import running_app

    settings = Settings(port=0, scheduler_poll_seconds=0.05)
    async with running_app(settings, db) as (app, _port):
        scheduler = app.extensions["pepper-scheduler"]
        task = scheduler._loop_task
        assert task is not None and task.get_name() == "pepper-scheduler" and not task.done()
    assert task.done() and scheduler._loop_task is None


async def test_a_result_can_go_by_email_once_and_falls_back_to_chat_without_a_mail_account(
    db, models, account, clock, deps, config
):
    from core.identity import add_handle
    from core.settings import Settings
    from core.testing.smtp_capture import SmtpCapture
    from gateway.mailer import SmtpMailer
    from gateway.scheduled import GatewayDeliverer

    await add_handle(db, account.id, "email", "ada@example.org", verified=True)
    task = await _task(db, account, clock, deliver_to=["email"])
    async with SmtpCapture() as smtp:
        settings = Settings(
            smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", smtp_from="Pepper <pepper@example.org>"
        )
        mailer = SmtpMailer(settings)
        scheduler = Scheduler(deps, GatewayDeliverer(settings, db, None, mailer), config, owner="mail", clock=clock)
        models.script(calls(("list_todos", {})), reply("Two todos are open.\nBoth are small."))
        clock.advance(hours=1)
        assert await scheduler.run_due() == 1
        [mail] = await smtp.wait_for(1)
        assert mail.rcpt_to == ["ada@example.org"]
        assert mail.message["Subject"] == "Pepper: Two todos are open."
        assert "Both are small." in mail.message.get_content()
        [receipt] = await _receipts(db, task.id)
        assert receipt["status"] == "ran"
        # A re-run of the same occurrence (its process died before the receipt) sends nothing more.
        await db.execute(
            "UPDATE task_runs SET status = 'running', lease_owner = 'dead', lease_expires_at = $1, ready_at = $1"
            " WHERE task_id = $2",
            clock() - timedelta(seconds=1),
            task.id,
        )
        again = Scheduler(deps, GatewayDeliverer(settings, db, None, mailer), config, owner="mail-2", clock=clock)
        await again.run_due()
        assert len(smtp.received) == 1

    # Without Pepper's mail account the next occurrence still reaches the person, in chat.
    nomail = Scheduler(deps, GatewayDeliverer(Settings(), db), config, owner="chat", clock=clock)
    models.script(calls(("list_todos", {})), reply("Still two todos."))
    clock.advance(days=1)
    assert await nomail.run_due() == 1
    assert "Still two todos." in await _outbound(db)


async def test_a_run_waits_for_the_persons_message_turn_and_their_texts_wait_for_it(
    db, scheduler, models, account, clock, config, deps
):
    task = await _task(db, account, clock)
    await record_inbound(db, account.id, "web", "are you there?", handling="queued")
    [answering] = await claim_turn(db, 1)  # a message turn is answering Ada
    clock.advance(hours=1)
    impatient = Scheduler(deps, scheduler.deliverer, replace(config, busy_wait=timedelta(seconds=0.3)),
                          owner="test-1", clock=clock)  # fmt: skip
    assert await impatient.run_due() == 1
    # Given back when the wait ran out, not counted as an attempt; no turn ran beside the message turn.
    [receipt] = await _receipts(db, task.id)
    assert (receipt["status"], receipt["attempts"]) == ("due", 0)
    assert receipt["reason"] == "waiting for the turn answering the person"
    assert models.received == [] and await db.fetchval("SELECT count(*) FROM turns") == 0
    assert await impatient.run_due() == 0  # not before it is due again

    # Due again, the run waits in its slot and goes on once the message turn is done.
    clock.advance(seconds=5)
    models.script(calls(("list_todos", {})), reply("Nothing open today."))
    entered, go = asyncio.Event(), asyncio.Event()
    generate = models.generate

    async def held(prompt, **kw):  # the scheduled turn's model call waits for the test
        entered.set()
        await go.wait()
        return await generate(prompt, **kw)

    models.generate = held
    run = asyncio.create_task(scheduler.run_due())
    await asyncio.sleep(0.5)
    assert not entered.is_set()
    await finish_handling(db, [answering["id"]])
    await asyncio.wait_for(entered.wait(), 10)
    # Its turn now holds the conversation: a text sent meanwhile waits until it ends.
    meanwhile = (await record_inbound(db, account.id, "web", "and now?", handling="queued"))[0]
    assert await claim_turn(db, 2) == []
    go.set()
    assert await run == 1
    [receipt] = await _receipts(db, task.id)
    assert (receipt["status"], receipt["attempts"]) == ("ran", 1)
    assert [r["id"] for r in await claim_turn(db, 2)] == [meanwhile.id]


async def test_a_long_scheduled_text_is_recorded_whole_before_its_first_part_goes_out(db, account, clock):
    """So Twilio's receipt for part 1, arriving while part 2 is being sent, cannot settle the run."""
    import asyncio

    from core.adapters.twilio.rest import TwilioMessenger
    from core.identity import add_handle, assign_line
    from core.settings import Settings
    from core.testing.twilio_peer import TwilioPeer
    from gateway.scheduled import GatewayDeliverer
    from text_loop.scheduler import DeliveryRequest

    await add_handle(db, account.id, "phone", "+14155552671", verified=True)
    await assign_line(db, "+14155550100", "personal", account.id)
    async with TwilioPeer(auth_token="token") as twilio:
        settings = Settings(
            twilio_account_sid=twilio.account_sid, twilio_auth_token="token", twilio_api_url=twilio.api_url,
            public_url="https://pepper.example.org",
        )  # fmt: skip
        messenger = TwilioMessenger(settings)
        try:
            twilio.hold_sends(after=1)
            body = "This briefing goes on and on about the day ahead. " * 70
            request = DeliveryRequest("brief-1", account.id, "sms", body, 1, clock())
            delivery = asyncio.create_task(GatewayDeliverer(settings, db, messenger).deliver(request))
            await twilio.wait_for_sent(1)
            rows = await db.fetch("SELECT delivery_status FROM messages WHERE direction = 'outbound' ORDER BY id")
            assert len(rows) >= 3 and rows[0]["delivery_status"] in ("sending", "queued")
            assert {r["delivery_status"] for r in rows[1:]} == {"sending"}
            twilio.fail_next(400, 30003)
            twilio.release_sends()
            result = await asyncio.wait_for(delivery, 30)
        finally:
            await messenger.close()
    assert result.status == "failed"
    statuses = [r["delivery_status"] for r in await db.fetch("SELECT delivery_status FROM messages ORDER BY id")]
    assert statuses[0] == "queued" and set(statuses[1:]) == {"failed"}
