"""Replay runs a recorded turn again: recorded tool results, never a write."""

import json
from uuid import uuid4

import pytest

from core.errors import NotFound
from core.testing.scripted import ScriptedModels, calls, reply
from gateway import cli
from text_loop import deliver, run_turn
from text_loop.replay import NOT_RECORDED, replay_turn, side_by_side


async def _recorded_turn(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'call mum') RETURNING id", account.id)
    await db.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'mum: 3 May')", account.id)
    models.script(
        calls(("search_notes", {"query": "mum"})),
        calls(("add_note", {"text": "gift for mum"}), ("complete_todo", {"id": todo})),
        reply("Her birthday is 3 May; I noted the gift and ticked off the call."),
    )
    outcome = await run_turn(deps, account.id, "web", "when is mum's birthday? note gift, and I called her")
    await deliver(deps, outcome.turn_id, True)
    return outcome, todo


async def test_replay_uses_recorded_results_and_never_runs_a_write(db, deps, models, account):
    original, todo = await _recorded_turn(db, deps, models, account)
    # Change the world after the turn: replay must not see it, and must not change it back.
    await db.execute("DELETE FROM notes WHERE body = 'mum: 3 May'")
    await db.execute("UPDATE todos SET done_at = NULL WHERE id = $1", todo)
    notes_before = await db.fetchval("SELECT count(*) FROM notes")

    replay_models = ScriptedModels(
        [
            calls(("search_notes", {"query": "mum"})),
            calls(
                ("add_note", {"text": "gift for mum"}), ("complete_todo", {"id": todo}), ("add_todo", {"title": "x"})
            ),
            reply("3 May. Noted the gift, ticked off the call."),
        ]
    )
    deps.models = replay_models
    result = await replay_turn(deps, original.turn_id, tier="medium")

    assert result.old_reply == "Her birthday is 3 May; I noted the gift and ticked off the call."
    assert result.new_reply == "3 May. Noted the gift, ticked off the call."
    assert all(r.tier == "medium" for r in replay_models.received)
    assert replay_models.prompts[0].system_stable == models.prompts[0].system_stable
    assert replay_models.prompts[0].messages == models.prompts[0].messages
    search_result = replay_models.prompts[1].messages[-1].tool_result.content
    assert "mum: 3 May" in search_result  # the recorded result, though the note is gone now
    results = [m.tool_result for m in replay_models.prompts[2].messages if m.role == "tool"][-3:]
    assert results[0].content.startswith("Done: note saved")
    assert NOT_RECORDED in results[2].content and result.unmatched_calls == 1

    assert await db.fetchval("SELECT count(*) FROM notes") == notes_before
    assert await db.fetchval("SELECT count(*) FROM todos") == 1
    assert await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is None
    assert await db.fetchval("SELECT count(*) FROM staged_writes WHERE turn_id = $1", result.replay_turn_id) == 0
    row = await db.fetchrow("SELECT kind, replay_of, reply, tier FROM turns WHERE id = $1", result.replay_turn_id)
    assert (row["kind"], row["replay_of"], row["reply"], row["tier"]) == (
        "replay", original.turn_id, result.new_reply, "medium"
    )  # fmt: skip
    # Delivering a replay (it never is, but if it were) has nothing to commit.
    assert await deliver(deps, result.replay_turn_id, True) == []
    assert await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is None


async def test_pepper_replay_prints_old_and_new_side_by_side(db, db_url, deps, models, account, monkeypatch):
    original, _ = await _recorded_turn(db, deps, models, account)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: ScriptedModels([reply("New answer: 3 May.")]))
    lines: list[str] = []
    args = cli._parser().parse_args(["replay", str(original.turn_id), "--tier", "large"])
    assert await cli._run(args, lines.append) == 0
    assert lines[0].startswith(f"replayed turn {original.turn_id}") and "tier large" in lines[0]
    assert "before (gpt-small)" in lines[1] and "| replay (scripted-small)" in lines[1]
    assert any(line.startswith("Her birthday is 3 May;") and "| New answer: 3 May." in line for line in lines)
    tool_calls = json.loads(await db.fetchval("SELECT tool_calls FROM turns WHERE replay_of = $1", original.turn_id))
    assert tool_calls == []


async def test_pepper_replay_refuses_a_bad_or_unknown_turn(db, db_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: ScriptedModels())
    with pytest.raises(cli.CommandError, match="not a turn id"):
        await cli._run(cli._parser().parse_args(["replay", "not-a-uuid"]), print)
    with pytest.raises(NotFound):
        await cli._run(cli._parser().parse_args(["replay", str(uuid4())]), print)


def test_side_by_side_wraps_both_columns():
    lines = side_by_side("old", "a " * 40, "new", "b", width=20)
    assert lines[0].startswith("old" + " " * 17 + " | new")
    assert lines[2] == "a a a a a a a a a a  | b"
    assert all(line[20:23] == " | " for line in lines[2:])
