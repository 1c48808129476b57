import asyncio
import json
import logging

import pytest

from core.conversation import record_inbound
from core.models.errors import ModelNotConfigured, ModelTransientError
from core.testing.scripted import calls, reply
from core.tools import Tool, ToolRegistry
from text_loop import run_turn
from text_loop.loop import MODEL_ERROR_REPLY, NO_MODEL_REPLY
from text_loop.prompt import LABEL


async def test_a_turn_runs_tools_in_order_and_replies_with_the_first_plain_answer(db, deps, models, account):
    models.script(
        calls(("current_time", {}), ("search_notes", {"query": "bike"})),
        reply("It is 14:30 and you have no notes about your bike."),
    )
    outcome = await run_turn(deps, account.id, "web", "what time is it, and any bike notes?")

    assert outcome.status == "replied"
    assert outcome.reply == "It is 14:30 and you have no notes about your bike."
    second = models.prompts[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool", "tool"]
    assert "Monday 02 June 2025, 14:30" in second[2].tool_result.content
    assert second[3].tool_result.content.startswith("Found nothing: no notes match 'bike'")

    row = await db.fetchrow("SELECT t.*, turn_prompt(t) AS whole_prompt FROM turns t WHERE id = $1", outcome.turn_id)
    assert row["status"] == "replied" and row["reply"] == outcome.reply and row["model"] == "gpt-small"
    rounds = json.loads(row["rounds"])
    assert [r["purpose"] for r in rounds] == ["turn", "turn"]
    assert [c["name"] for c in json.loads(row["tool_calls"])] == ["current_time", "search_notes"]
    assert json.loads(row["whole_prompt"])["system_stable"] == models.prompts[0].system_stable
    assert json.loads(row["timings"])["harness_ms"] >= 0


async def test_a_failed_lookup_reads_differently_from_an_empty_one(db, deps, models, account):
    models.script(calls(("current_time", {"timezone": "Mars/Olympus"})), reply("Sorry, I could not check."))
    await run_turn(deps, account.id, "web", "time on mars?")
    result = models.prompts[1].messages[-1].tool_result
    assert result.is_error
    assert result.content.startswith("Failed: unknown time zone")
    assert "not an empty result" in result.content


async def test_the_prefix_is_byte_stable_and_the_clock_rides_on_the_newest_message(db, deps, models, account):
    models.script(reply("one"), reply("two"))
    await run_turn(deps, account.id, "web", "hello")
    deps.clock = lambda: __import__("datetime").datetime(2025, 6, 3, 8, 0, tzinfo=__import__("datetime").UTC)
    await run_turn(deps, account.id, "web", "again")
    first, second = models.prompts
    assert first.system_stable == second.system_stable
    assert first.tools == second.tools
    assert "2025" not in first.system_stable
    assert "Monday 02 June 2025, 14:30" in first.messages[-1].content
    assert "Tuesday 03 June 2025, 10:00" in second.messages[-1].content
    assert first.messages[-1].content.startswith("hello\n\n" + LABEL)


async def test_memory_holds_recent_messages_but_not_the_one_being_answered(db, deps, models, account):
    await record_inbound(db, account.id, "sms", "my sister is called Bea")
    new, _ = await record_inbound(db, account.id, "sms", "what is my sister called?")
    models.script(reply("Bea."), reply("Bea."))  # the answer, then the SMS repair pass
    outcome = await run_turn(deps, account.id, "sms", new.body, inbound_message_ids=[new.id])
    memory = models.prompts[0].system_dynamic
    assert "my sister is called Bea" in memory
    assert "what is my sister called?" not in memory
    assert await db.fetchval("SELECT turn_id FROM messages WHERE id = $1", new.id) == outcome.turn_id


async def test_an_unverified_caller_sees_no_memory_and_no_writing_tools(db, deps, models, account):
    await record_inbound(db, account.id, "sms", "my door code is 4411")
    models.script(reply("Hello."), reply("Hello."))
    await run_turn(deps, account.id, "sms", "hi", trust="owner_unverified")
    prompt = models.prompts[0]
    assert "4411" not in prompt.system_dynamic + prompt.system_stable
    names = {t.name for t in prompt.tools}
    assert "current_time" in names and "add_note" not in names and "search_notes" not in names


async def test_with_no_model_configured_the_turn_says_so_plainly(db, deps, models, account):
    models.script(ModelNotConfigured("no provider"))
    outcome = await run_turn(deps, account.id, "web", "hello")
    assert outcome.status == "no-model"
    assert outcome.reply == NO_MODEL_REPLY
    row = await db.fetchrow("SELECT status, error, reply FROM turns WHERE id = $1", outcome.turn_id)
    assert (row["status"], row["error"], row["reply"]) == ("replied", "model-not-configured", NO_MODEL_REPLY)


async def test_a_model_failure_mid_turn_drops_what_the_turn_staged(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'x') RETURNING id", account.id)
    models.script(calls(("complete_todo", {"id": todo})), ModelTransientError("503"))
    outcome = await run_turn(deps, account.id, "web", "done with x")
    assert outcome.status == "model-error" and outcome.reply == MODEL_ERROR_REPLY
    assert await db.fetchval("SELECT status FROM staged_writes WHERE turn_id = $1", outcome.turn_id) == "dropped"


async def test_cancelling_a_turn_passes_through_and_leaves_its_writes_to_the_crash_rule(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'x') RETURNING id", account.id)
    models.script(calls(("complete_todo", {"id": todo})), asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await run_turn(deps, account.id, "web", "done with x")
    row = await db.fetchrow("SELECT t.status, s.status AS write FROM turns t JOIN staged_writes s ON s.turn_id = t.id")
    assert (row["status"], row["write"]) == ("running", "staged")


async def test_a_tool_that_raises_fails_plainly_and_logs_no_arguments(db, deps, models, account, caplog):
    async def broken(ctx, args):
        raise KeyError("boom")

    deps.registry = ToolRegistry([Tool("lookup", "Look up.", {"type": "object"}, broken, area="test")])
    models.script(calls(("lookup", {"secret": "door code 4411"})), reply("I could not check."))
    with caplog.at_level(logging.ERROR):
        outcome = await run_turn(deps, account.id, "web", "look it up")
    result = models.prompts[1].messages[-1].tool_result
    assert result.is_error and result.content.startswith("Failed: lookup hit an internal error (KeyError)")
    assert "tool failed: tool=lookup" in caplog.text and "4411" not in caplog.text
    assert outcome.status == "replied"
