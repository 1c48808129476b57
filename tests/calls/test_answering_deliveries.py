"""The answering service's deliveries (``answering_service.deliveries``) on the real database:
what a call recorded is sent once, a failed text is tried again, and a send cut short by a dying
worker is taken up again."""

from __future__ import annotations

from contextlib import asynccontextmanager

from answering_service.deliveries import MAX_ATTEMPTS, deliver_due
from answering_service.notify import OwnerNotifier
from core import identity
from core.adapters.twilio.rest import TwilioMessenger
from core.settings import Settings
from core.testing.twilio_peer import TwilioPeer
from gateway.composition import plain_sms

CALLER = "+14155559999"
LINE = "+14155550100"


@asynccontextmanager
async def twilio_texts():
    """``send_sms`` through Pepper's Twilio client to the loopback Twilio, and that Twilio."""
    async with TwilioPeer(auth_token="token") as twilio:
        settings = Settings(twilio_account_sid=twilio.account_sid, twilio_auth_token="token",
                            twilio_api_url=twilio.api_url)  # fmt: skip
        messenger = TwilioMessenger(settings)
        try:
            yield plain_sms(messenger), twilio
        finally:
            await messenger.close()


def _sent(twilio):
    return [(m.to, m.from_, m.body) for m in twilio.sent]


async def _recorded(db, account_id, call_sid="CA1"):
    return await db.fetchval(
        "INSERT INTO answering_deliveries (account_id, call_sid, kind, to_number, from_number, body)"
        " VALUES ($1, $2, 'caller_text', $3, $4, 'Your meeting is booked.') RETURNING id",
        account_id, call_sid, CALLER, LINE,
    )  # fmt: skip


async def test_a_recorded_text_is_sent_once_and_a_failed_one_is_tried_again(db):
    ada = await identity.create_account(db, "Ada")
    row = await _recorded(db, ada.id)
    async with twilio_texts() as (texts, twilio):
        twilio.fail_next(503, 20500)
        notifier = OwnerNotifier(db, send_sms=texts)
        assert await deliver_due(db, notifier, texts) == 1
        failed = await db.fetchrow("SELECT * FROM answering_deliveries WHERE id = $1", row)
        assert failed["status"] == "pending" and failed["attempts"] == 1 and failed["error"]
        assert await deliver_due(db, notifier, texts) == 0  # not due again yet
        await db.execute("UPDATE answering_deliveries SET due_at = now() WHERE id = $1", row)
        assert await deliver_due(db, notifier, texts) == 1
        assert _sent(twilio) == [(CALLER, LINE, "Your meeting is booked.")]
        assert await db.fetchval("SELECT status FROM answering_deliveries WHERE id = $1", row) == "sent"
        assert await deliver_due(db, notifier, texts) == 0
        assert len(twilio.sent) == 1


async def test_a_text_that_keeps_failing_stops_after_its_attempts(db):
    ada = await identity.create_account(db, "Ada")
    row = await _recorded(db, ada.id)
    async with twilio_texts() as (texts, twilio):
        for _ in range(MAX_ATTEMPTS):
            twilio.fail_next(503, 20500)
            await db.execute("UPDATE answering_deliveries SET due_at = now() WHERE id = $1", row)
            await deliver_due(db, OwnerNotifier(db), texts)
        final = await db.fetchrow("SELECT * FROM answering_deliveries WHERE id = $1", row)
        assert final["status"] == "failed" and final["attempts"] == MAX_ATTEMPTS and twilio.sent == []


async def test_a_send_cut_short_by_a_dying_worker_is_taken_up_again(db):
    ada = await identity.create_account(db, "Ada")
    row = await _recorded(db, ada.id)
    # A worker claimed it and died before it could record the outcome.
    await db.execute(
        "UPDATE answering_deliveries SET status = 'sending', attempts = 1, claimed_at = now() WHERE id = $1", row
    )
    async with twilio_texts() as (texts, twilio):
        assert await deliver_due(db, OwnerNotifier(db), texts) == 0  # another worker may still be sending it
        await db.execute("UPDATE answering_deliveries SET claimed_at = now() - interval '5 minutes' WHERE id = $1", row)
        assert await deliver_due(db, OwnerNotifier(db), texts) == 1
        assert _sent(twilio) == [(CALLER, LINE, "Your meeting is booked.")]
    assert await db.fetchval("SELECT status FROM answering_deliveries WHERE id = $1", row) == "sent"


async def test_without_sms_set_up_a_caller_text_fails_plainly(db):
    ada = await identity.create_account(db, "Ada")
    row = await _recorded(db, ada.id)
    assert await deliver_due(db, OwnerNotifier(db), None) == 1
    final = await db.fetchrow("SELECT * FROM answering_deliveries WHERE id = $1", row)
    assert final["status"] == "failed" and final["error"] == "sending SMS is not configured"
