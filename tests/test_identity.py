"""Accounts, handles, consent, PIN and lines against the real schema."""

from __future__ import annotations

import pytest

from core import identity
from core.conversation import (
    conversation_for,
    recent_messages,
    record_inbound,
    record_outbound,
    start_turn,
    update_turn,
)
from core.errors import InvalidInput, NotFound
from core.store import Database


@pytest.mark.parametrize(
    ("raw", "region", "expected"),
    [
        ("(415) 555-2671", "US", "+14155552671"),
        ("+1 415 555 2671", "US", "+14155552671"),
        ("whatsapp:+14155552671", "US", "+14155552671"),
        ("020 7946 0018", "GB", "+442079460018"),
        ("06 12 34 56 78", "FR", "+33612345678"),
    ],
)
def test_phone_numbers_are_stored_in_e164(raw, region, expected):
    assert identity.normalize_phone(raw, region) == expected


@pytest.mark.parametrize("raw", ["", "hello", "+1 555", "12"])
def test_garbage_phone_numbers_are_refused(raw):
    with pytest.raises(InvalidInput):
        identity.normalize_phone(raw)


async def test_every_handle_points_to_one_account_and_resolves_however_written(db: Database):
    ada = await identity.create_account(db, "Ada", timezone="Europe/London")
    phone = await identity.add_handle(db, ada.id, "phone", "+44 20 7946 0018", default_region="GB")
    email = await identity.add_handle(db, ada.id, "email", " Ada@Example.ORG ", verified=True)
    assert (phone.verified, email.verified) == (False, True)
    assert email.value == "ada@example.org"

    found = await identity.find_handle(db, "phone", "020 7946 0018", default_region="GB")
    assert found is not None and found.account_id == ada.id
    assert await identity.find_handle(db, "email", "ADA@example.org") == email
    assert await identity.find_handle(db, "phone", "+1 415 555 2671") is None
    assert await identity.find_handle(db, "phone", "not a number") is None

    bob = await identity.create_account(db, "Bob")
    with pytest.raises(InvalidInput, match="already belongs"):
        await identity.add_handle(db, bob.id, "phone", "+442079460018")


async def test_verification_can_be_granted_and_withdrawn(db: Database):
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", "+14155552671")
    assert (await identity.set_handle_verified(db, "phone", "(415) 555-2671")).verified
    assert not (await identity.set_handle_verified(db, "phone", "+14155552671", False)).verified
    with pytest.raises(NotFound):
        await identity.set_handle_verified(db, "phone", "+14155550000")


async def test_stop_blocks_a_channel_until_start(db: Database):
    ada = await identity.create_account(db, "Ada")
    phone = await identity.add_handle(db, ada.id, "phone", "+14155552671")
    assert not await identity.is_blocked(db, phone.id, "sms")
    await identity.set_consent(db, phone.id, identity.PHONE_CHANNELS, opted_out=True, source="STOP")
    assert all([await identity.is_blocked(db, phone.id, c) for c in ("sms", "whatsapp", "voice")])
    assert not await identity.is_blocked(db, phone.id, "email")
    await identity.set_consent(db, phone.id, ["sms"], opted_out=False, source="START")
    assert not await identity.is_blocked(db, phone.id, "sms")
    assert await identity.is_blocked(db, phone.id, "voice")
    assert await identity.is_blocked(db, phone.id, "carrier-pigeon")  # unknown channels fail closed


async def test_the_pin_is_stored_hashed_and_checked(db: Database):
    ada = await identity.create_account(db, "Ada")
    assert not await identity.verify_pin(db, ada.id, "1234")  # no PIN set yet
    await identity.set_pin(db, ada.id, "482916")
    stored = await db.fetchval("SELECT pin_hash FROM accounts WHERE id = $1", ada.id)
    assert "482916" not in stored and stored.startswith("$argon2id$")
    assert await identity.verify_pin(db, ada.id, "482916")
    assert not await identity.verify_pin(db, ada.id, "482917")
    assert not await identity.verify_pin(db, ada.id, "")
    for bad in ("12", "abcd", "1234567890123"):
        with pytest.raises(InvalidInput):
            await identity.set_pin(db, ada.id, bad)


async def test_lines_tie_twilio_numbers_to_accounts(db: Database):
    ada = await identity.create_account(db, "Ada")
    bob = await identity.create_account(db, "Bob")
    await identity.assign_line(db, "+1 415 555 0100", "personal", ada.id)
    await identity.assign_line(db, "+14155550101", "answering", ada.id, label="office")
    line = await identity.find_line(db, "(415) 555-0101")
    assert line is not None and (line.kind, line.account_id, line.label) == ("answering", ada.id, "office")
    # Reassigning a number moves it; it never belongs to two accounts.
    await identity.assign_line(db, "+14155550100", "personal", bob.id)
    assert (await identity.find_line(db, "+14155550100")).account_id == bob.id
    assert len(await identity.list_lines(db)) == 2
    with pytest.raises(InvalidInput):
        await identity.assign_line(db, "+14155550102", "fax", ada.id)


async def test_accounts_are_found_by_id_or_unique_name(db: Database):
    ada = await identity.create_account(db, "Ada")
    assert (await identity.get_account(db, "Ada")).id == ada.id
    assert (await identity.get_account(db, str(ada.id))).name == "Ada"
    await identity.create_account(db, "Ada")
    with pytest.raises(InvalidInput, match="2 accounts"):
        await identity.get_account(db, "Ada")
    with pytest.raises(NotFound):
        await identity.get_account(db, "Nobody")
    with pytest.raises(InvalidInput, match="time zone"):
        await identity.create_account(db, "Cy", timezone="Mars/Olympus")


async def test_one_conversation_across_channels_and_duplicates_record_once(db: Database):
    ada = await identity.create_account(db, "Ada")
    first, created = await record_inbound(db, ada.id, "sms", "hello", provider_message_id="SM1")
    again, created_again = await record_inbound(db, ada.id, "sms", "hello", provider_message_id="SM1")
    assert created and not created_again and again.id == first.id
    # The same id on another channel is another message.
    _, created_email = await record_inbound(db, ada.id, "email", "hi", provider_message_id="SM1")
    assert created_email
    conversation = await conversation_for(db, ada.id)
    turn = await start_turn(db, conversation, channel="sms")
    await record_outbound(db, conversation, "sms", "hi Ada", turn_id=turn)
    await update_turn(db, turn, status="replied", model="m-1", usage={"input_tokens": 12})
    history = await recent_messages(db, conversation)
    assert [(m.channel, m.direction) for m in history] == [
        ("sms", "inbound"),
        ("email", "inbound"),
        ("sms", "outbound"),
    ]
    row = await db.fetchrow("SELECT status, model, usage FROM turns WHERE id = $1", turn)
    assert (row["status"], row["model"]) == ("replied", "m-1")
    with pytest.raises(InvalidInput):
        await update_turn(db, turn, not_a_column=1)
    with pytest.raises(InvalidInput):
        await record_inbound(db, ada.id, "fax", "x")


async def test_concurrent_duplicate_deliveries_record_one_message(db: Database):
    import asyncio

    ada = await identity.create_account(db, "Ada")
    results = await asyncio.gather(
        *(record_inbound(db, ada.id, "sms", "hello", provider_message_id="SMdup") for _ in range(8))
    )
    assert sum(created for _, created in results) == 1
    assert len({m.id for m, _ in results}) == 1


async def test_a_reply_is_announced_once_and_apart_from_its_durable_insert(db: Database):
    """Open chats hear of each reply once. The announcement is not made by the insert's own
    transaction (NOTIFY would hold its global lock through that commit's flush): on a pool it is a
    statement of its own; in a caller's transaction it goes out at that transaction's commit."""
    import asyncio
    import json

    import asyncpg

    ada = await identity.create_account(db, "Ada")
    conversation = await conversation_for(db, ada.id)
    heard: list[int] = []
    listener = await asyncpg.connect(db.dsn)
    try:
        await listener.add_listener("pepper_messages", lambda *args: heard.append(json.loads(args[-1])["id"]))
        alone = await record_outbound(db, conversation, "sms", "first reply")
        async with db.transaction() as conn:
            inside = await record_outbound(conn, conversation, "sms", "second reply")
            await asyncio.sleep(0.2)
            assert heard == [alone.id]  # nothing of the second before its commit
        # The insert alone announces nothing: no transaction that waits for the disk notifies.
        await db.fetchrow("SELECT * FROM pepper_record_outbound($1, 'sms', NULL, 'quiet', NULL, NULL)", conversation)
        await asyncio.sleep(0.3)  # room for any announcement that must not come
    finally:
        await listener.close()
    assert heard == [alone.id, inside.id]
    # The function's setting held for its call only: this session still announces by trigger.
    assert await db.fetchval("SELECT current_setting('pepper.announce', true)") in (None, "")
