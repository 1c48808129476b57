"""The dossier: both halves in the prompt, notes accumulate, the weekly rewrite, its rejection rules
and revisions."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from memory_kit import NOW, summary

from core.errors import InvalidInput
from core.memory import MemoryConfig
from core.memory.dossier import check_rewrite, dossier_text, load_dossier, rewrite_model_half, set_owner_text
from core.testing.peers import reply_text

CONFIG = MemoryConfig(dossier_max_chars=400, dossier_min_ratio=0.5)


def test_rewrite_rejection_rules() -> None:
    before = "- likes tea\n- sister Bea\n- works at the lab"
    assert check_rewrite(before, "  \n ", CONFIG) == "empty"
    assert check_rewrite(before, "likes tea", CONFIG).startswith("much shorter than before")
    assert check_rewrite(before, "x" * 401, CONFIG).startswith("too long")
    assert check_rewrite(before, before + "\n- owns a cat", CONFIG) is None
    assert check_rewrite("", "- likes tea", CONFIG) is None  # the first rewrite


async def notes(db, account_id, *bodies: str) -> None:
    for body in bodies:
        await db.execute("INSERT INTO dossier_notes (account_id, body) VALUES ($1, $2)", account_id, body)


async def test_a_dossier_loads_the_newest_notes_oldest_first_and_is_empty_before_any(db, ada) -> None:
    empty = await load_dossier(db, ada.id)
    assert (empty.owner_text, empty.model_text, empty.notes, empty.notes_through) == ("", "", (), 0)
    await notes(db, ada.id, "first", "second", "third")
    halves = await load_dossier(db, ada.id, notes_limit=2)
    assert [body for _, body in halves.notes] == ["second", "third"]
    assert halves.owner_text == "" and halves.model_half == "- second\n- third"


async def test_owner_edits_keep_revisions_and_are_checked(db, ada) -> None:
    assert await set_owner_text(db, ada.id, "I am vegetarian.", source="cli")
    assert not await set_owner_text(db, ada.id, "  I am vegetarian.  ")  # unchanged: no new revision
    assert await set_owner_text(db, ada.id, "I am vegetarian. I live in Lyon.")
    with pytest.raises(InvalidInput, match="limit"):
        await set_owner_text(db, ada.id, "x" * 9000)
    bodies = [r["body"] for r in await db.fetch("SELECT body FROM dossier_revisions WHERE half = 'owner' ORDER BY id")]
    assert bodies == ["I am vegetarian.", "I am vegetarian. I live in Lyon."]
    assert (await load_dossier(db, ada.id)).owner_text == "I am vegetarian. I live in Lyon."


async def test_an_accepted_rewrite_folds_the_notes_in_and_keeps_them(db, ada, peer_router) -> None:
    peer, router = peer_router
    await set_owner_text(db, ada.id, "OWNER-HALF: I am vegetarian.")
    await notes(db, ada.id, "Sister is called Bea", "Prefers texts to calls")
    await summary(db, ada.id, "week", date(2025, 5, 26), "WEEK: Ada planned Bea's visit and booked a dentist.")
    new_half = "- Sister is called Bea\n- Prefers texts to calls\n- Sees the dentist regularly"
    peer.script(reply_text(new_half))

    result = await rewrite_model_half(db, router, ada.id, NOW, config=CONFIG)

    assert result.outcome == "accepted"
    sent = str(peer.requests[0].body)
    assert "Sister is called Bea" in sent and "WEEK: Ada planned" in sent and "OWNER-HALF" in sent
    assert peer.requests[0].body["service_tier"] == "flex"
    halves = await load_dossier(db, ada.id)
    assert halves.model_text == new_half and halves.notes == ()
    assert await db.fetchval("SELECT count(*) FROM dossier_notes WHERE account_id = $1", ada.id) == 2
    text = await dossier_text(db, ada.id)
    assert text.index("OWNER-HALF") < text.index("Sees the dentist") and text.count("Sister is called Bea") == 1
    # A note added after the rewrite shows under it until the next rewrite.
    await notes(db, ada.id, "Allergic to cats")
    assert (await dossier_text(db, ada.id)).endswith("Sees the dentist regularly\n- Allergic to cats")
    revision = await db.fetchrow("SELECT * FROM dossier_revisions WHERE half = 'model'")
    assert revision["accepted"] and revision["body"] == new_half and revision["source"] == "rewrite"


@pytest.mark.parametrize(
    ("written", "reason"),
    [("", "empty"), ("- Bea", "much shorter"), ("- " + "very long " * 60, "too long")],
)
async def test_a_rejected_rewrite_changes_nothing_but_is_recorded(db, ada, peer_router, written, reason) -> None:
    peer, router = peer_router
    await notes(db, ada.id, "Sister is called Bea", "Prefers texts to calls", "Works at the observatory")
    before = await dossier_text(db, ada.id)
    peer.script(reply_text(written))

    result = await rewrite_model_half(db, router, ada.id, NOW, config=CONFIG)

    assert result.outcome == "rejected" and result.reason.startswith(reason)
    assert await dossier_text(db, ada.id) == before
    row = await db.fetchrow("SELECT accepted, reason FROM dossier_revisions WHERE half = 'model'")
    assert not row["accepted"] and row["reason"].startswith(reason)


async def test_nothing_new_means_no_model_call(db, ada, peer_router) -> None:
    peer, router = peer_router
    assert (await rewrite_model_half(db, router, ada.id, NOW, config=CONFIG)).outcome == "nothing"
    assert not peer.requests


async def test_a_note_is_staged_until_the_reply_is_delivered(db, ada, models) -> None:
    from core.testing.scripted import calls, reply
    from text_loop import HarnessDeps, deliver, run_turn

    deps = HarnessDeps(db=db, models=models, clock=lambda: datetime(2025, 6, 4, 12, tzinfo=UTC))
    models.script(calls(("add_dossier_note", {"note": "Runs on Sundays"})), reply("Noted."))
    outcome = await run_turn(deps, ada.id, "web", "I run every Sunday")
    assert "Runs on Sundays" not in await dossier_text(db, ada.id)
    await deliver(deps, outcome.turn_id, ok=True)
    assert "- Runs on Sundays" in await dossier_text(db, ada.id)
