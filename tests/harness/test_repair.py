"""The repair pass and each rule of its deterministic check."""

import json

import pytest

from core.models.errors import ModelTransientError
from core.testing.scripted import reply
from text_loop import HarnessConfig, run_turn
from text_loop.repair import check_repair

CONFIG = HarnessConfig()
ORIGINAL = "Your train probably leaves at 9:40. Your train probably leaves at 9:40. Bring the blue ticket."
FIXED = "Your train probably leaves at 9:40. Bring the blue ticket."


def test_removing_a_duplicated_sentence_passes():
    assert check_repair(ORIGINAL, FIXED, CONFIG) is None


def test_an_empty_edit_is_rejected():
    assert check_repair(ORIGINAL, "  ", CONFIG) == "empty"


def test_an_edit_that_changes_the_length_too_much_is_rejected():
    assert check_repair(ORIGINAL, "Train at 9:40.", CONFIG).startswith("length changed by")
    assert check_repair("Short reply here.", "Short reply here, " + "indeed " * 5, CONFIG).startswith("length")


def test_an_edit_that_adds_more_than_a_few_words_is_rejected():
    base = (
        "Your train probably leaves at 9:40 and arrives around noon in Lyon. Bring the blue ticket and your passport."
    )
    edited = base.replace("9:40", "9:40 from platform two, so hurry,")
    assert check_repair(base, edited, CONFIG) == "added 5 words"
    assert check_repair(base, base.replace("9:40", "9:40 from platform two"), CONFIG) is None


@pytest.mark.parametrize("hedge", ["probably", "I think", "might", "not"])
def test_an_edit_that_drops_a_hedge_is_rejected(hedge):
    original = f"{hedge.capitalize()} the shop is open until 8 on Sundays."
    if hedge == "not":
        original = "The shop is not open until 8 on Sundays."
    edited = original.replace(hedge.capitalize() + " ", "").replace(hedge + " ", "")
    edited = edited[0].upper() + edited[1:]
    assert check_repair(original, edited, CONFIG) == f"removed the hedge {hedge.lower()!r}"


async def test_an_sms_reply_goes_through_the_repair_pass(db, deps, models, account):
    models.script(reply(ORIGINAL), reply(FIXED))
    outcome = await run_turn(deps, account.id, "sms", "when is my train?")
    assert outcome.reply == FIXED and outcome.repaired
    repair_prompt = models.prompts[1]
    assert repair_prompt.tools == () and ORIGINAL in repair_prompt.messages[0].content
    assert models.received[1].tier == "small"
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert rounds[-1]["purpose"] == "repair" and rounds[-1]["verdict"] == "accepted"
    assert await db.fetchval("SELECT reply FROM turns WHERE id = $1", outcome.turn_id) == FIXED


@pytest.mark.parametrize(
    ("edit", "verdict"),
    [
        (reply(ORIGINAL.replace("probably ", "")), "rejected: removed the hedge 'probably'"),
        (reply(FIXED + " Have a lovely trip and say hi to everyone."), "rejected: added 9 words"),
        (ModelTransientError("overloaded"), "failed: model-unavailable"),
        (reply(""), "rejected: empty"),
    ],
)
async def test_on_any_repair_failure_the_original_goes_out(db, deps, models, account, edit, verdict):
    models.script(reply(ORIGINAL), edit)
    outcome = await run_turn(deps, account.id, "email", "when is my train?")
    assert outcome.reply == ORIGINAL and not outcome.repaired
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert rounds[-1]["verdict"] == verdict


async def test_web_chat_has_no_repair_pass(db, deps, models, account):
    models.script(reply(ORIGINAL))
    outcome = await run_turn(deps, account.id, "web", "when is my train?")
    assert outcome.reply == ORIGINAL and len(models.prompts) == 1
