"""The turn record's prompt: encoded from tool schemas cached across turns, yet always the prompt sent."""

from __future__ import annotations

import json

from core.models.types import ToolSpec
from core.testing.scripted import reply
from core.tools.connectors import GOOGLE_SCOPES
from text_loop import run_turn
from text_loop.records import tool_spec_json, tool_spec_record


def _recorded(prompt_json: str) -> dict:
    return json.loads(prompt_json)


async def test_the_recorded_prompt_is_the_prompt_sent_and_a_tool_connected_mid_conversation_joins_the_next(
    db, deps, models, account
):
    models.script(reply("Hello."), reply("Hello again."))
    first = await run_turn(deps, account.id, "web", "hi")
    sent = models.prompts[0]
    recorded = _recorded(await db.fetchval("SELECT prompt FROM turns WHERE id = $1", first.turn_id))
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
    recorded = _recorded(await db.fetchval("SELECT prompt FROM turns WHERE id = $1", second.turn_id))
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
