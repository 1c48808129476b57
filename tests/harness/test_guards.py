"""Each guard of the turn loop, with a scripted model."""

import json
from dataclasses import replace

import pytest

from core.testing.scripted import calls, reply
from core.tools.gate import Policy, Verdict
from text_loop import HarnessConfig, run_turn
from text_loop.loop import EMPTY_REPLY, REPEAT_MARK
from text_loop.prompt import LABEL

ZONES = ["Europe/Paris", "Asia/Tokyo", "America/Lima", "Africa/Cairo", "Europe/Oslo", "Asia/Seoul"]


@pytest.fixture
def config() -> HarnessConfig:
    return HarnessConfig(round_caps={"live": 3}, budget_notice_within=2, free_wasted_rounds=2)


def _last_result(prompt):
    return next(m.tool_result for m in reversed(prompt.messages) if m.role == "tool")


def _labelled_user_messages_ok(prompt) -> bool:
    """The person's own message comes first; every other user message is the harness's, labelled."""
    users = [m for m in prompt.messages if m.role == "user"]
    first_is_person = not users[0].content.startswith(LABEL)
    return all(m.content.startswith(LABEL + "\n") for m in users[1:] if first_is_person) and (
        first_is_person or all(m.content.startswith(LABEL + "\n") for m in users)
    )


async def test_the_round_cap_ends_with_one_generation_without_tools(db, deps, models, account):
    models.script(*(calls(("current_time", {"timezone": z})) for z in ZONES[:3]), reply("It is late everywhere."))
    outcome = await run_turn(deps, account.id, "web", "time everywhere?")
    assert outcome.status == "capped"
    assert outcome.reply == "It is late everywhere."
    assert len(models.prompts) == 4
    assert all(p.tools for p in models.prompts[:3])
    final = models.prompts[3]
    assert final.tools == ()
    assert all(m.role == "user" and not m.tool_calls for m in final.messages)
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert [r["purpose"] for r in rounds] == ["turn", "turn", "turn", "final"]


async def test_the_model_is_told_its_budget_near_the_cap(db, deps, models, account):
    models.script(*(calls(("current_time", {"timezone": z})) for z in ZONES[:3]), reply("done"))
    await run_turn(deps, account.id, "web", "time?")
    notes = [p.messages[-1].content for p in models.prompts[:3]]
    assert not notes[0].startswith(LABEL)
    assert notes[1].startswith(LABEL) and "2 rounds with tools remain" in notes[1]
    assert notes[2].startswith(LABEL) and "last round" in notes[2]
    # A budget note is shown for one round only, never piled up in the history.
    assert sum("Round budget" in m.content for m in models.prompts[2].messages) == 1


async def test_rounds_of_only_unknown_tools_do_not_count_a_few_times(db, deps, models, account):
    models.script(
        calls(("teleport", {})),
        calls(("teleport", {"to": "moon"})),
        calls(("current_time", {})),
        calls(("current_time", {"timezone": "Asia/Tokyo"})),
        reply("Here."),
    )
    outcome = await run_turn(deps, account.id, "web", "beam me up")
    # Cap 3: two wasted rounds were free, so two real rounds and the reply fit.
    assert outcome.status == "replied" and outcome.reply == "Here."
    assert _last_result(models.prompts[1]).content.startswith("Unknown tool 'teleport'")
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert [r.get("wasted", False) for r in rounds] == [True, True, False, False, False]


async def test_wasted_rounds_count_once_the_allowance_is_spent(db, deps, models, account):
    models.script(*(calls(("teleport", {"n": i})) for i in range(5)), reply("I can't do that."))
    outcome = await run_turn(deps, account.id, "web", "beam me up")
    # 2 free + 3 counted = 5 generations with tools, then the capped summary.
    assert outcome.status == "capped"
    assert [bool(p.tools) for p in models.prompts] == [True] * 5 + [False]


async def test_a_round_of_refusals_is_wasted_too(db, deps, models, account):
    deps.gate = deps.gate.with_policy(Policy("no-clock", lambda t, a, s: Verdict.deny("clock is off")))
    models.script(calls(("current_time", {})), reply("No clock today."))
    deps.config = replace(deps.config, round_caps={"live": 1})
    outcome = await run_turn(deps, account.id, "web", "time?")
    assert outcome.status == "replied"
    assert _last_result(models.prompts[1]).content.startswith("Refused by Pepper's rules: clock is off")


async def test_an_identical_successful_call_is_not_run_again(db, deps, models, account):
    models.script(
        calls(("add_note", {"text": "buy milk"})),
        calls(("add_note", {"text": "buy milk"})),
        reply("Noted."),
    )
    outcome = await run_turn(deps, account.id, "web", "note: buy milk")
    assert await db.fetchval("SELECT count(*) FROM notes WHERE account_id = $1", account.id) == 1
    repeated = _last_result(models.prompts[2])
    assert repeated.content.startswith(REPEAT_MARK) and "note saved" in repeated.content
    records = json.loads(await db.fetchval("SELECT tool_calls FROM turns WHERE id = $1", outcome.turn_id))
    assert [r["status"] for r in records] == ["ok", "repeat"]
    assert records[1]["repeat_of"] == records[0]["id"]


async def test_a_failed_call_may_be_tried_again(db, deps, models, account):
    models.script(
        calls(("complete_todo", {"id": 99})),
        calls(("complete_todo", {"id": 99})),
        reply("There is no such todo."),
    )
    outcome = await run_turn(deps, account.id, "web", "done with 99")
    records = json.loads(await db.fetchval("SELECT tool_calls FROM turns WHERE id = $1", outcome.turn_id))
    assert [r["status"] for r in records] == ["failed", "failed"]


async def test_a_capped_turn_is_told_which_writes_did_not_complete(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'call mum') RETURNING id", account.id)
    deps.gate = deps.gate.with_policy(
        Policy(
            "no-dossier", lambda t, a, s: Verdict.deny("not now") if t.name == "add_dossier_note" else Verdict.allow()
        )
    )
    models.script(
        calls(("add_note", {"text": "mum's birthday is 3 May"}), ("complete_todo", {"id": todo + 100})),
        calls(("add_dossier_note", {"note": "Has a mum"}), ("complete_todo", {"id": todo})),
        calls(("current_time", {})),
        reply("I saved the note and closed 'call mum'."),
    )
    outcome = await run_turn(deps, account.id, "web", "note mum's birthday, tick off call mum")
    assert outcome.status == "capped"
    final_note = models.prompts[-1].messages[-1].content
    assert final_note.startswith(LABEL + "\n")
    done, not_done = final_note.split("Writes that did NOT complete", 1)
    assert "add_note: note saved" in done
    assert f"complete_todo: todo #{todo} marked done (saved when this reply is delivered)" in done
    assert f"complete_todo: failed: Failed: there is no todo #{todo + 100}" in not_done
    assert "add_dossier_note: denied" in not_done
    assert "add_dossier_note" not in done


async def test_every_message_the_harness_adds_is_labelled(db, deps, models, account):
    models.script(
        *(calls(("current_time", {"timezone": z})) for z in ZONES[:3]),
        reply("fine"),
    )
    await run_turn(deps, account.id, "web", "hi")
    assert all(_labelled_user_messages_ok(p) for p in models.prompts)
    assert models.prompts[-1].messages[0].content.startswith(LABEL + "\n")


async def test_an_empty_reply_is_retried_once_as_plain_text(db, deps, models, account):
    models.script(calls(("current_time", {})), reply(""), reply("It is 14:30."))
    outcome = await run_turn(deps, account.id, "web", "time?")
    assert outcome.status == "recovered" and outcome.reply == "It is 14:30."
    retry = models.prompts[2]
    assert retry.tools == ()
    assert len(retry.messages) == 1 and retry.messages[0].role == "user"
    assert retry.messages[0].content.startswith(LABEL + "\n")
    assert "Result of current_time" in retry.messages[0].content and "time?" in retry.messages[0].content
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert [r["purpose"] for r in rounds] == ["turn", "turn", "recovery"]
    assert rounds[1]["response"]["text"] == "" and rounds[2]["response"]["text"] == "It is 14:30."


async def test_a_second_empty_reply_gives_up_and_drops_staged_writes(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'x') RETURNING id", account.id)
    models.script(calls(("complete_todo", {"id": todo})), reply(""), reply("  "))
    outcome = await run_turn(deps, account.id, "web", "done with x")
    assert outcome.status == "empty" and outcome.reply == EMPTY_REPLY
    assert len(models.prompts) == 3
    assert await db.fetchval("SELECT status FROM staged_writes WHERE turn_id = $1", outcome.turn_id) == "dropped"


async def test_a_turn_whose_time_is_up_starts_no_new_round_and_ends_as_at_the_cap(
    db, deps, models, account, budget_clock
):
    deps.config = replace(deps.config, round_caps={"live": 8}, time_budgets={"live": 0.3})
    generate = models.generate

    async def slow(prompt, **kw):  # each generation takes 0.2 s of the turn's clock
        budget_clock.advance(0.2)
        return await generate(prompt, **kw)

    models.generate = slow
    models.script(
        calls(("current_time", {"timezone": "Europe/Paris"})),
        calls(("current_time", {"timezone": "Asia/Tokyo"})),
        reply("Paris and Tokyo I have; the rest took too long."),
    )
    outcome = await run_turn(deps, account.id, "web", "time everywhere?")
    # Two rounds with tools (0.4 s), then the budget is spent: one generation without tools.
    assert outcome.status == "capped"
    assert outcome.reply == "Paris and Tokyo I have; the rest took too long."
    assert [bool(p.tools) for p in models.prompts] == [True, True, False]
    assert "The time for this turn is up and tools are now off." in models.prompts[-1].messages[-1].content
    rounds = json.loads(await db.fetchval("SELECT rounds FROM turns WHERE id = $1", outcome.turn_id))
    assert [(r["purpose"], r.get("cap")) for r in rounds] == [("turn", None), ("turn", None), ("final", "time")]
