"""Calls Pepper places, end to end: a scheduled brief delivered by phone through the twilio SDK's
REST ``Calls`` (with ``MachineDetection``) to the loopback Twilio, answered by a person (restricted
until the PIN, then the brief), a machine (a voicemail with no private detail) or nobody (one retry,
then a receipt); the status callbacks signed, deduplicated and checked; and a number nobody
approved never dialled."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

from phone_support import LINE, OWNER, PIN, PUBLIC, STRANGER, until, verify_by_keypad

from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.testing.scripted import ScriptedModels, reply
from gateway import cli_calls, cli_tasks
from gateway.composition import outbound_from_settings
from gateway.scheduled import GatewayDeliverer
from text_loop import HarnessDeps
from text_loop.scheduler import Scheduler, SchedulerConfig
from voice.outbound import VOICEMAIL
from voice.testing.realtime_peer import speak
from voice.testing.twilio_caller import Answer, parse_twiml

# The brief's private facts: none of these words may reach a voicemail.
BRIEF = "Your 3pm with Dr Okafor about the biopsy results moved to Thursday, and the Acme invoice of $4,210 is overdue."
PRIVATE = ("Okafor", "biopsy", "Thursday", "Acme", "invoice", "4,210", "overdue", "3pm")
TITLE = "Morning brief about Okafor"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


class Placing:
    """A scheduler on a scripted model whose deliverer places calls through the loopback Twilio."""

    def __init__(self, phone):
        self.phone = phone
        self.clock = Clock()
        self.models = ScriptedModels()
        settings = phone.services.settings
        self.outbound = outbound_from_settings(settings, phone.db)
        self.outbound.clock = self.clock
        deps = HarnessDeps(db=phone.db, models=self.models, clock=self.clock)
        deliverer = GatewayDeliverer(settings, phone.db, outbound=self.outbound)
        self.scheduler = Scheduler(deps, deliverer, SchedulerConfig(lease=timedelta(seconds=60)), clock=self.clock)
        self.local = phone.caller.local

    async def task(self, **extra):
        async with self.phone.db.transaction() as conn:
            task = await create_task(
                conn, self.phone.account_id, title=TITLE, prompt="Brief me on today.",
                schedule=parse_schedule("in 1 minute", now=self.clock(), timezone="UTC"), now=self.clock(),
                deliver_to=("call",),
            )  # fmt: skip
        if extra:
            await self.phone.db.execute(
                "UPDATE scheduled_tasks SET call_number = $2, call_approved = $3 WHERE id = $1",
                task.id, extra["number"], extra["approved"],
            )  # fmt: skip
        return task

    async def run(self) -> None:
        self.models.script(reply(BRIEF))
        self.clock.now += timedelta(minutes=2)
        assert await self.scheduler.run_due() == 1

    async def status(self, placed, status, **extra):
        return await self.phone.twilio.call_status(self.local, PUBLIC, placed, status, **extra)

    async def answer(self, placed, answered_by):
        return await self.phone.twilio.answer_call(self.local, PUBLIC, placed, answered_by)

    async def aclose(self) -> None:
        await self.outbound.aclose()


async def _attempts(db, task_id):
    return await db.fetch("SELECT * FROM outbound_calls WHERE task_id = $1 ORDER BY attempt", task_id)


async def _cli(db, settings, *argv: str, module=cli_calls) -> str:
    parser = argparse.ArgumentParser()
    module.add_commands(parser.add_subparsers(dest="command"))
    lines: list[str] = []
    assert await module.run(parser.parse_args(list(argv)), settings, db, lines.append)
    return "\n".join(lines)


async def test_a_person_who_answers_hears_the_brief_only_after_the_pin(phone_out):
    phone, placing = phone_out, Placing(phone_out)
    try:
        task = await placing.task()
        await placing.run()
        [placed] = await phone.twilio.wait_for_calls(1)
        assert placed.to == OWNER and placed.from_ == LINE
        assert placed.machine_detection == "DetectMessageEnd"
        assert placed.url == f"{PUBLIC}/twilio/voice/outbound"
        assert placed.status_callback == f"{PUBLIC}/twilio/voice/outbound/status"
        assert {"answered", "completed"} <= set(placed.status_events)
        status, text = await placing.answer(placed, "human")
        assert status == 200
        parsed = parse_twiml(text)
        answer = Answer(200, text, placed.sid, parsed["stream_url"], parsed["parameters"])
        async with phone.caller.media(answer) as call:
            await phone.until_listening(call)
            session = phone.model.sessions[0]
            before = session.config.get("instructions", "")
            assert "prove who they are" in before
            assert [word for word in PRIVATE if word.lower() in before.lower()] == []
            # A switchboard's keys may be pressed until the callee proves who they are, not after.
            assert "verify_pin" in session.tool_names() and "send_digits" in session.tool_names()
            phone.model.script(speak("You're verified. " + BRIEF))
            await verify_by_keypad(phone, call, PIN)
            await phone.model.wait_for(lambda: BRIEF in session.config.get("instructions", ""))
            assert "send_digits" not in session.tool_names()
            await phone.model.wait_for(lambda: any("message" in (c.get("instructions") or "")
                                                   for c in session.response_creates[1:]))  # fmt: skip
            await call.hang_up()
        await placing.status(placed, "completed")
        row = await phone.call_row(placed.sid)
        assert row["route"] == "outbound" and row["verified_by"] == "pin-keypad"
        [attempt] = await until(lambda: _attempts(phone.db, task.id), what="the attempt")
        # The call's own end says the brief was given (whether Twilio's "completed" came first or not).
        attempt = await until(
            lambda: phone.db.fetchrow("SELECT * FROM outbound_calls WHERE id = $1 AND receipt LIKE '%brief given'",
                                      attempt["id"]),
            what="the receipt",
        )  # fmt: skip
        assert attempt["outcome"] == "human" and "brief given" in attempt["receipt"]
        delivery = await until(lambda: phone.db.fetchrow(
            "SELECT status, detail FROM task_deliveries WHERE channel = 'call' AND status = 'delivered'"))  # fmt: skip
        assert "brief given" in delivery["detail"]
        listing = await _cli(phone.db, phone.services.settings, "calls", "list")
        assert placed.sid in listing and "outbound" in listing
        shown = await _cli(phone.db, phone.services.settings, "calls", "show", placed.sid)
        assert "brief given" in shown and f"task #{task.id}" in shown
    finally:
        await placing.aclose()


async def test_a_machine_gets_a_voicemail_without_one_private_word(phone_out):
    phone, placing = phone_out, Placing(phone_out)
    try:
        task = await placing.task()
        await placing.run()
        [placed] = await phone.twilio.wait_for_calls(1)
        status, text = await placing.answer(placed, "machine_end_beep")
        assert status == 200
        parsed = parse_twiml(text)
        assert parsed["hangup"] and "stream_url" not in parsed
        spoken = " ".join(parsed["says"])
        assert spoken == VOICEMAIL
        words = set(re.findall(r"[\w$,']+", spoken.lower()))
        for fact in PRIVATE:
            assert fact.lower() not in words and fact.lower() not in spoken.lower(), fact
        for word in re.findall(r"\w+", TITLE.lower()):
            if len(word) > 5:
                assert word not in spoken.lower(), word
        await placing.status(placed, "completed")
        [attempt] = await _attempts(phone.db, task.id)
        assert attempt["outcome"] == "machine" and attempt["status"] == "done"
        assert "voicemail" in attempt["receipt"]
        assert await phone.db.fetchval("SELECT count(*) FROM calls WHERE call_sid = $1", placed.sid) == 0
        assert len(phone.twilio.calls) == 1  # a voicemail is a delivery: no retry
        # The brief itself waits in the owner's chat, for when they call back.
        chat = await phone.db.fetchval("SELECT body FROM messages WHERE direction = 'outbound' AND channel = 'web'")
        assert BRIEF in chat and "voicemail" in chat
    finally:
        await placing.aclose()


async def test_no_answer_is_tried_once_more_then_the_receipt_says_so(phone_out):
    phone, placing = phone_out, Placing(phone_out)
    try:
        task = await placing.task()
        await placing.run()
        [first] = await phone.twilio.wait_for_calls(1)
        assert (await placing.status(first, "ringing"))[0] == 204
        assert (await placing.status(first, "no-answer"))[0] == 204
        assert await placing.outbound.dial_due() == 1  # the retry (due at once in this test)
        second = (await phone.twilio.wait_for_calls(2))[1]
        assert second.to == OWNER
        assert (await placing.status(second, "no-answer"))[0] == 204
        assert await placing.outbound.dial_due() == 0  # never a third
        attempts = await _attempts(phone.db, task.id)
        assert [a["attempt"] for a in attempts] == [1, 2]
        assert "trying once more" in attempts[0]["receipt"]
        assert "not calling again" in attempts[1]["receipt"]
        chat = await phone.db.fetchval("SELECT body FROM messages WHERE direction = 'outbound' AND channel = 'web'")
        assert BRIEF in chat and "nobody answered" in chat
        delivery = await phone.db.fetchrow("SELECT status, detail FROM task_deliveries WHERE channel = 'call'")
        assert delivery["status"] == "failed" and "not calling again" in delivery["detail"]
        shown = await _cli(phone.db, phone.services.settings, "calls", "show", second.sid)
        assert "no-answer" in shown and "attempt 2" in shown
        runs = await _cli(phone.db, phone.services.settings, "tasks", "list", "--all", module=cli_tasks)
        assert "call attempt 1" in runs and "call attempt 2" in runs and "not calling again" in runs
    finally:
        await placing.aclose()


async def test_status_callbacks_forged_repeated_or_garbage(phone_out):
    phone, placing = phone_out, Placing(phone_out)
    try:
        task = await placing.task()
        await placing.run()
        [placed] = await phone.twilio.wait_for_calls(1)
        path = "/twilio/voice/outbound/status"
        form = phone.twilio.call_form(placed, "no-answer", SequenceNumber="1")
        forged = await phone.twilio.post_form(placing.local, PUBLIC, path, form, signature="bm90IGEgc2lnbmF0dXJl")
        assert forged[0] == 403
        assert await phone.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'twilio-signature-invalid'")
        assert len(await _attempts(phone.db, task.id)) == 1  # the forgery did nothing
        for _ in range(2):  # Twilio retries a callback: one retry attempt, not two
            assert (await phone.twilio.post_form(placing.local, PUBLIC, path, form))[0] == 204
        assert len(await _attempts(phone.db, task.id)) == 2
        for garbage in ({"CallSid": "nonsense", "CallStatus": "no-answer"}, {"CallSid": placed.sid},
                        {"CallSid": placed.sid, "CallStatus": "exploded"}, {}):  # fmt: skip
            status, _ = await phone.twilio.post_form(placing.local, PUBLIC, path, garbage)
            assert status == 400, garbage
        stranger = phone.twilio.call_form(placed, "no-answer") | {"CallSid": "CA" + "0" * 32}
        assert (await phone.twilio.post_form(placing.local, PUBLIC, path, stranger))[0] == 404
        answer_path = "/twilio/voice/outbound"
        bad = await phone.twilio.post_form(placing.local, PUBLIC, answer_path, {"CallSid": "x", "CallStatus": "y"})
        assert bad[0] == 400
        assert len(await _attempts(phone.db, task.id)) == 2
    finally:
        await placing.aclose()


async def test_a_number_nobody_approved_is_never_dialled(phone_out):
    phone, placing = phone_out, Placing(phone_out)
    try:
        # As a scheduled run would set it: a number, not approved by the owner.
        task = await placing.task(number=STRANGER, approved=False)
        await placing.run()
        assert phone.twilio.calls == []
        [attempt] = await _attempts(phone.db, task.id)
        assert attempt["status"] == "refused" and "refused" in attempt["receipt"]
        assert await phone.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'outbound-call-refused'")
        # The brief still reached the owner, in chat.
        assert await phone.db.fetchval(
            "SELECT count(*) FROM messages WHERE direction = 'outbound' AND channel = 'web' AND body = $1", BRIEF
        )
        # Approved by the owner (with a menu's keys to press), the same number is called.
        await _cli(phone.db, phone.services.settings, "tasks", "call-number", str(task.id), STRANGER,
                   "--digits", "ww2#", module=cli_tasks)  # fmt: skip
        placing.models.script(reply(BRIEF))
        await phone.db.execute(
            "INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at, status) VALUES ($1, $2, $2, $2, 'due')",
            task.id, placing.clock(),
        )  # fmt: skip
        assert await placing.scheduler.run_due() == 1
        [placed] = await phone.twilio.wait_for_calls(1)
        assert placed.to == STRANGER and placed.send_digits == "ww2#"
        # Whoever answers there hears the message the owner sent them, and nothing more: no memory,
        # no tools but end_call and send_digits (a menu's keys), and the owner's PIN keyed there
        # makes nobody the owner.
        status, text = await placing.answer(placed, "human")
        assert status == 200
        assert placed.digits_heard == ["2", "#"]  # Twilio pressed them once the call connected
        parsed = parse_twiml(text)
        answer = Answer(200, text, placed.sid, parsed["stream_url"], parsed["parameters"])
        async with phone.caller.media(answer) as call:
            await phone.until_listening(call)
            session = phone.model.sessions[0]
            assert BRIEF in session.config.get("instructions", "")
            assert session.tool_names() == ["end_call", "send_digits"]
            updates = len([e for e in session.events if e["type"] == "session.update"])
            await call.keypad(PIN + "#")
            await call.hang_up()
        row = await phone.call_row(placed.sid)
        assert row["verified_by"] is None
        assert len([e for e in session.events if e["type"] == "session.update"]) == updates
    finally:
        await placing.aclose()
