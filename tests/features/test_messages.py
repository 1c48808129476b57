"""Texts to contacts from the person's line, through the real Twilio SDK and a loopback Twilio."""

from __future__ import annotations

import pytest

from core.adapters.twilio.rest import TwilioMessenger
from core.identity import add_handle, assign_line, set_consent
from core.records import texts
from core.settings import Settings
from core.testing.twilio_peer import TwilioPeer
from core.tools import commit_turn_writes, drop_turn_writes
from core.tools.starter import starter_registry

from .support import Caller

LINE, SAM, OWN = "+14155550100", "+14155550123", "+14155552671"


@pytest.fixture
async def twilio():
    async with TwilioPeer(auth_token="token") as peer:
        yield peer


@pytest.fixture
async def texting(call: Caller, twilio: TwilioPeer):
    settings = Settings(
        twilio_account_sid=twilio.account_sid, twilio_auth_token="token", twilio_api_url=twilio.api_url,
        public_url="https://pepper.example.org",
    )  # fmt: skip
    messenger = TwilioMessenger(settings)
    await add_handle(call.db, call.account.id, "phone", OWN, verified=True)
    await assign_line(call.db, LINE, "personal", call.account.id)
    await call.db.execute(
        "INSERT INTO contacts (account_id, name, phones) VALUES ($1, 'Sam Lee', $2), ($1, 'Samira', $3)",
        call.account.id, [SAM], ["+14155550124"],
    )  # fmt: skip
    yield call.using(texter=messenger, text_status_url="https://pepper.example.org/twilio/status")
    await messenger.close()


async def test_a_text_goes_once_after_the_reply_is_delivered(texting: Caller, twilio: TwilioPeer) -> None:
    session = await texting.session()
    out = await texting("text_contact", {"to": "Sam Lee", "text": "Running 10 minutes late"}, session=session)
    assert out.status == "ok", out.content
    assert twilio.sent == []  # staged: nothing leaves before the person saw the reply
    registry = starter_registry(texting.connectors)
    await commit_turn_writes(texting.db, registry, session.turn_id)
    await commit_turn_writes(texting.db, registry, session.turn_id)  # a duplicate report: one text
    sent = await twilio.wait_for_sent(1)
    assert [(m.to, m.from_, m.body) for m in sent] == [(SAM, LINE, "Running 10 minutes late")]
    rows = await texts.texts_of(texting.db, texting.account.id)
    assert [r["status"] for r in rows] == ["sent"]
    dropped = await texting.session()
    await texting("text_contact", {"to": "Sam Lee", "text": "never"}, session=dropped)
    await drop_turn_writes(texting.db, registry, dropped.turn_id)
    assert len(twilio.sent) == 1  # a reply that was not delivered sends nothing


async def test_only_known_numbers_and_never_after_stop(texting: Caller, twilio: TwilioPeer) -> None:
    stranger = await texting("text_contact", {"to": "+14155559999", "text": "hi"}, delivered=True)
    assert stranger.status == "failed" and "not on the person's contacts" in stranger.content
    ambiguous = await texting("text_contact", {"to": "Sam", "text": "hi"}, delivered=True)
    assert ambiguous.status == "failed" and "several contacts" in ambiguous.content
    garbage = await texting("text_contact", {"to": "12", "text": "hi"})
    assert garbage.status == "failed"
    assert (await texting("text_contact", {"to": "Sam Lee", "text": ""})).status == "failed"
    session = await texting.session()  # a contact added in this turn is not verified in it
    await texting("add_contact", {"name": "Mallory", "phones": ["+14155550999"]}, session=session)
    await commit_turn_writes(texting.db, starter_registry(texting.connectors), session.turn_id)
    forged = await texting("text_contact", {"to": "+14155550999", "text": "send me the codes"}, session=session)
    assert forged.status == "failed" and "in this message" in forged.content
    await texts.set_opt_out(texting.db, SAM, stopped=True)
    stopped = await texting("text_contact", {"to": "Sam Lee", "text": "hi"}, delivered=True)
    assert stopped.status == "failed" and "STOP" in stopped.content
    handle = await texting.db.fetchval("SELECT id FROM handles WHERE value = $1", OWN)
    await set_consent(texting.db, handle, ("sms",), opted_out=True, source="test")
    own = await texting("text_contact", {"to": OWN, "text": "note to self"}, delivered=True)
    assert own.status == "failed" and "opted out" in own.content
    assert twilio.sent == []


async def test_a_scheduled_run_leaves_a_draft_the_person_sends(texting: Caller, twilio: TwilioPeer) -> None:
    out = await texting("text_contact", {"to": "Sam Lee", "text": "Happy birthday!"}, kind="scheduled", delivered=True)
    assert out.status == "ok" and "NOT sent" in out.content
    assert twilio.sent == []
    draft = (await texts.texts_of(texting.db, texting.account.id))[0]
    assert draft["status"] == "draft"
    refused = await texting("send_text_draft", {"id": draft["id"]}, kind="scheduled", delivered=True)
    assert refused.status == "failed" and twilio.sent == []
    sent = await texting("send_text_draft", {"id": draft["id"]}, delivered=True)
    assert sent.status == "ok", sent.content
    assert [m.body for m in await twilio.wait_for_sent(1)] == ["Happy birthday!"]
    again = await texting("send_text_draft", {"id": draft["id"]}, delivered=True)
    assert again.status == "failed" and len(twilio.sent) == 1


async def test_texting_is_hidden_without_a_line(call: Caller) -> None:
    assert "texting" not in (await call.session()).connections
    out = await call("text_contact", {"to": "Sam", "text": "hi"})
    assert out.status == "denied"


async def test_the_servers_turn_parts_text_through_the_reply_messenger(db, twilio: TwilioPeer) -> None:
    from gateway.composition import turn_parts

    settings = Settings(
        twilio_account_sid=twilio.account_sid, twilio_auth_token="token", twilio_api_url=twilio.api_url,
        public_url="https://pepper.example.org",
    )  # fmt: skip
    router, harness, messenger, _ = turn_parts(settings, db)
    try:
        assert harness.connectors is not None and harness.connectors.texter is messenger
        assert harness.connectors.text_status_url == "https://pepper.example.org/twilio/status"
        assert harness.connectors.models is router
    finally:
        assert messenger is not None
        await messenger.close()
        await router.aclose()
