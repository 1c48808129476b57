"""The turn record's prompt: encoded from tool schemas cached across turns, its byte-stable parts
stored once, yet always the prompt sent."""

from __future__ import annotations

import hashlib
import json

import pytest

from core.models.types import ToolSpec
from core.testing.scripted import ScriptedModels, reply
from core.tools.connectors import GOOGLE_SCOPES
from text_loop import HarnessDeps, run_turn
from text_loop.records import message_record, tool_spec_json, tool_spec_record
from text_loop.replay import replay_turn


def _recorded(prompt_json: str) -> dict:
    return json.loads(prompt_json)


async def test_the_recorded_prompt_is_the_prompt_sent_and_a_tool_connected_mid_conversation_joins_the_next(
    db, deps, models, account
):
    models.script(reply("Hello."), reply("Hello again."))
    first = await run_turn(deps, account.id, "web", "hi")
    sent = models.prompts[0]
    recorded = _recorded(await db.fetchval("SELECT turn_prompt(t) FROM turns t WHERE id = $1", first.turn_id))
    assert recorded["system_stable"] == sent.system_stable and recorded["system_dynamic"] == sent.system_dynamic
    assert recorded["tools"] == [tool_spec_record(s) for s in sent.tools]
    assert recorded["messages"][0]["role"] == "user" and "hi" in recorded["messages"][0]["content"]
    assert "email_from_my_gmail" not in [t["name"] for t in recorded["tools"]]

    # The person connects Gmail between two turns: the next prompt and its record offer the tool.
    await db.execute(
        "INSERT INTO connections (account_id, provider, scopes) VALUES ($1, 'google', $2)",
        account.id,
        list(GOOGLE_SCOPES["gmail"]),
    )
    second = await run_turn(deps, account.id, "web", "hi again")
    offered = [t.name for t in models.prompts[1].tools]
    assert "email_from_my_gmail" in offered
    recorded = _recorded(await db.fetchval("SELECT turn_prompt(t) FROM turns t WHERE id = $1", second.turn_id))
    assert [t["name"] for t in recorded["tools"]] == offered
    assert recorded["tools"] == [tool_spec_record(s) for s in models.prompts[1].tools]


def test_an_encoded_schema_is_reused_only_for_the_same_schema_object():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    spec = ToolSpec("find", "Find things.", schema)
    text = tool_spec_json(spec)
    assert json.loads(text) == tool_spec_record(spec)
    assert tool_spec_json(ToolSpec("find", "Find things.", schema)) is text  # same schema: encoded once
    # A tool declared anew under the same name (a new schema object, other arguments) is encoded afresh.
    changed = ToolSpec("find", "Find things.", {"type": "object", "properties": {"q": {"type": "integer"}}})
    assert json.loads(tool_spec_json(changed))["parameters"]["properties"]["q"]["type"] == "integer"
    assert json.loads(tool_spec_json(ToolSpec("find", "Find other things.", schema)))["description"] == (
        "Find other things."
    )


async def _parts(db, turn_id):
    return await db.fetchrow("SELECT prompt, prompt_prefix, prompt_tools FROM turns WHERE id = $1", turn_id)


async def test_the_stable_parts_are_stored_once_and_a_changed_tool_set_is_a_new_part(db, deps, models, account):
    models.script(reply("One."), reply("Two."), reply("Three."))
    first = await run_turn(deps, account.id, "web", "one")
    second = await run_turn(deps, account.id, "web", "two")
    a, b = await _parts(db, first.turn_id), await _parts(db, second.turn_id)
    assert (a["prompt_prefix"], a["prompt_tools"]) == (b["prompt_prefix"], b["prompt_tools"])
    # Only the memory block and the messages are kept in each record.
    assert set(json.loads(a["prompt"])) == {"system_dynamic", "messages"}
    assert await db.fetchval("SELECT count(*) FROM prompt_parts") == 2
    # Named by the SHA-256 of the JSON that was sent.
    prefix = json.dumps(models.prompts[0].system_stable)
    assert a["prompt_prefix"] == hashlib.sha256(prefix.encode()).digest()
    assert json.loads(await db.fetchval("SELECT body FROM prompt_parts WHERE hash = $1", a["prompt_prefix"])) == (
        models.prompts[0].system_stable
    )

    # Another process (nothing known as stored) stores nothing new for the same parts.
    fresh = HarnessDeps(db=db, models=models, config=deps.config, clock=deps.clock)
    models.script(reply("Again."))
    again = await run_turn(fresh, account.id, "web", "again")
    assert (await _parts(db, again.turn_id))["prompt_tools"] == a["prompt_tools"]
    assert await db.fetchval("SELECT count(*) FROM prompt_parts") == 2

    await db.execute(
        "INSERT INTO connections (account_id, provider, scopes) VALUES ($1, 'google', $2)",
        account.id,
        list(GOOGLE_SCOPES["gmail"]),
    )
    third = await run_turn(deps, account.id, "web", "three")
    c = await _parts(db, third.turn_id)
    assert c["prompt_prefix"] == a["prompt_prefix"] and c["prompt_tools"] != a["prompt_tools"]
    assert await db.fetchval("SELECT count(*) FROM prompt_parts") == 3
    tools = json.loads(await db.fetchval("SELECT body FROM prompt_parts WHERE hash = $1", c["prompt_tools"]))
    assert tools == [tool_spec_record(s) for s in models.prompts[-1].tools]


async def test_a_replay_sends_exactly_the_prompt_the_turn_sent(db, deps, models, account):
    await db.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'bike: new chain')", account.id)
    models.script(reply("Your bike has a new chain."))
    original = await run_turn(deps, account.id, "web", "what about my bike?")
    sent = models.prompts[0]

    replay_models = ScriptedModels([reply("A new chain.")])
    deps.models = replay_models
    deps.stored_prompt_parts.clear()  # as a `pepper replay` process that has stored nothing yet
    parts_before = await db.fetchval("SELECT count(*) FROM prompt_parts")
    outcome = await replay_turn(deps, original.turn_id)
    again = replay_models.prompts[0]
    # It names the original's parts (read back through jsonb they hash differently), storing none.
    assert await db.fetchval("SELECT count(*) FROM prompt_parts") == parts_before
    names = "SELECT prompt_prefix, prompt_tools FROM turns WHERE id = $1"
    assert tuple(await db.fetchrow(names, outcome.replay_turn_id)) == tuple(await db.fetchrow(names, original.turn_id))
    assert again.system_stable == sent.system_stable and again.system_dynamic == sent.system_dynamic
    assert again.tools == sent.tools and again.messages == sent.messages
    # The replay's own record puts back the same prompt.
    recorded = json.loads(await db.fetchval("SELECT turn_prompt(t) FROM turns t WHERE id = $1", outcome.replay_turn_id))
    assert recorded["system_stable"] == sent.system_stable
    assert recorded["tools"] == [tool_spec_record(s) for s in sent.tools]
    assert recorded["messages"] == [message_record(m) for m in sent.messages]


async def test_a_record_written_before_the_parts_existed_still_replays(db, deps, models, account):
    models.script(reply("Hello."))
    original = await run_turn(deps, account.id, "web", "hi")
    sent = models.prompts[0]
    # As a row written before migration 0098: the whole prompt inline, no parts named.
    whole = {
        "system_stable": sent.system_stable,
        "system_dynamic": sent.system_dynamic,
        "tools": [tool_spec_record(s) for s in sent.tools],
        "messages": [message_record(m) for m in sent.messages],
    }
    await db.execute(
        "UPDATE turns SET prompt = $2::jsonb, prompt_prefix = NULL, prompt_tools = NULL WHERE id = $1",
        original.turn_id,
        json.dumps(whole),
    )
    replay_models = ScriptedModels([reply("Hi.")])
    deps.models = replay_models
    await replay_turn(deps, original.turn_id)
    assert replay_models.prompts[0].system_stable == sent.system_stable
    assert replay_models.prompts[0].tools == sent.tools and replay_models.prompts[0].messages == sent.messages


@pytest.mark.usefixtures("quiet_server")  # the probe reads the server's log: nothing else may write meanwhile
async def test_only_a_record_that_stores_a_part_waits_for_the_disk(db, deps, models, account):
    """A later record may name a part without storing it: the first one stores it durably."""
    models.script(reply("One."), reply("Two."))
    await run_turn(deps, account.id, "web", "one")
    assert await db.fetchval("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")
    assert len(deps.stored_prompt_parts) == 2
    # The next record sends neither part again.
    outcome = await run_turn(deps, account.id, "web", "two")
    assert await db.fetchval("SELECT status FROM turns WHERE id = $1", outcome.turn_id) == "replied"
    assert await db.fetchval("SELECT count(*) FROM prompt_parts") == 2
