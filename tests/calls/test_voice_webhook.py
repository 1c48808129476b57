"""The voice webhook: signature, classification in code, and the TwiML that answers each kind of call."""

from __future__ import annotations

from datetime import UTC, datetime

from phone_support import ANSWERING_LINE, LINE, OWNER, PUBLIC, STRANGER
from plugin_support import loopback, plugin  # noqa: F401  (fixtures)

from core import identity
from voice import routing


async def test_a_verified_owner_is_connected_to_a_stream_with_a_one_time_token(phone):
    answer = await phone.dial_owner()
    assert answer.stream_url == "wss://pepper.example.org/twilio/media"
    assert "?" not in answer.stream_url
    token = answer.parameters["call_token"]
    assert len(token) >= 32
    assert answer.action == PUBLIC + "/twilio/voice/after-stream"
    stored = await phone.db.fetchrow("SELECT call_sid, used_at FROM call_stream_tokens")
    assert stored["call_sid"] == answer.call_sid and stored["used_at"] is None
    assert token.encode() not in bytes(await phone.db.fetchval("SELECT token_hash FROM call_stream_tokens"))
    row = await phone.db.fetchrow("SELECT route, account_id FROM calls WHERE call_sid = $1", answer.call_sid)
    assert row["route"] == "owner" and row["account_id"] == phone.account_id


async def test_a_forged_webhook_is_refused_and_recorded(phone):
    answer = await phone.caller.dial(from_=OWNER, to=LINE, signature="bm90IGEgc2lnbmF0dXJl")
    assert answer.status == 403
    assert await phone.db.fetchval("SELECT count(*) FROM calls") == 0
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 0
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "twilio-signature-invalid"


async def test_a_stranger_on_the_personal_line_is_refused_politely(phone):
    answer = await phone.caller.dial(from_=STRANGER, to=LINE)
    assert answer.status == 200 and not answer.connected
    assert answer.says == [routing.REFUSED_TEXT]
    assert "<Hangup" in answer.twiml
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 0


async def test_strangers_can_be_handed_to_the_answering_service_but_never_the_owner(phone):
    phone.calls.unknown_caller = "answering"
    answer = await phone.caller.dial(from_=STRANGER, to=LINE)
    assert answer.connected  # the answering service streams it (tests/calls/test_answering.py)
    assert await phone.db.fetchval("SELECT route FROM calls") == "answering"


async def test_an_unverified_number_of_the_owner_never_reaches_the_owner_session(phone):
    other = "+14155552672"
    await identity.add_handle(phone.db, phone.account_id, "phone", other, verified=False)
    answer = await phone.caller.dial(from_=other, to=LINE)
    assert not answer.connected and answer.says == [routing.REFUSED_TEXT]


async def test_forwarded_calls_and_answering_lines_go_to_the_answering_service(phone):
    forwarded = await phone.caller.dial(from_=OWNER, to=LINE, ForwardedFrom="+14155557777")
    assert forwarded.connected and not forwarded.says
    answering = await phone.caller.dial(from_=OWNER, to=ANSWERING_LINE)
    assert answering.connected and not answering.says
    routes = {r["route"] for r in await phone.db.fetch("SELECT route FROM calls")}
    assert routes == {"answering"}


async def test_a_stop_blocked_caller_is_refused(phone):
    await identity.set_consent(phone.db, phone.handle_id, identity.PHONE_CHANNELS, opted_out=True, source="sms STOP")
    answer = await phone.caller.dial(from_=OWNER, to=LINE)
    assert not answer.connected and answer.says == [routing.BLOCKED_TEXT]
    assert await phone.db.fetchval("SELECT route FROM calls") == "blocked"


async def test_a_number_pepper_does_not_answer_is_refused(phone):
    answer = await phone.caller.dial(from_=OWNER, to="+14155550199")
    assert not answer.connected and answer.says == [routing.REFUSED_TEXT]


async def test_an_owner_at_the_days_usage_cap_gets_a_short_recorded_message(phone):
    from core.usage.config import DEAD_CALL_MESSAGE
    from core.usage.ledger import add_usage, set_limits

    await set_limits(phone.db, phone.account_id, tokens=100, cost=None, minutes=None)
    await add_usage(phone.db, phone.account_id, datetime.now(UTC), tokens=100)
    answer = await phone.caller.dial(from_=OWNER, to=LINE)
    assert not answer.connected
    assert DEAD_CALL_MESSAGE in answer.twiml and "<Hangup" in answer.twiml
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 0


async def test_a_call_asks_the_model_select_slot_and_an_empty_plan_gets_the_no_model_message(phone, request):
    installed = request.getfixturevalue("plugin")  # from plugin_support
    from core.slots.settings import set_slot
    from core.usage.config import NO_MODEL_CALL_MESSAGE

    await set_slot(phone.db, "model_select", "loopback_select")
    installed.LoopbackSelect.TIERS = ()
    try:
        answer = await phone.caller.dial(from_=OWNER, to=LINE)
    finally:
        installed.LoopbackSelect.TIERS = ("large",)
    assert not answer.connected and answer.says == [NO_MODEL_CALL_MESSAGE]
    asked = installed.SEEN["loopback_select"]
    assert (asked.account_id, asked.kind, asked.usage) == (phone.account_id, "call", "normal")
    assert await phone.db.fetchval("SELECT count(*) FROM call_stream_tokens") == 0
