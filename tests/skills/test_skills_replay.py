"""Replay of a turn that ran a skill worker: the worker runs again on the replay's tier with the
recorded tool results, and its direct report stays the reply (no extra generation)."""

from __future__ import annotations

from skill_support import outputs, turn_record

from core.testing.peers import ScriptedCall, reply_text, reply_tools
from text_loop import run_turn
from text_loop.replay import NOT_RECORDED, replay_turn


def use(name: str, **args) -> ScriptedCall:
    return ScriptedCall("use_skill", {"name": name, **args})


async def test_replay_runs_the_worker_again_and_keeps_its_direct_report(db, deps, peer, account):
    peer.script(
        reply_tools(use("agenda", request="what is on today")),
        reply_tools(("list_events", {"day": "monday"})),
        reply_text("Today: 09:00 Dentist, 14:00 Design review."),
    )
    original = await run_turn(deps, account.id, "web", "what's on today?")
    assert (await turn_record(db, original.turn_id))["skills"]["ended_by"] == "direct_report"
    before = len(peer.requests)

    peer.script(
        reply_tools(use("agenda", request="what is on today")),
        # The worker runs again: the same call gets the recorded result, a new one no result at all.
        reply_tools(("list_events", {"day": "monday"}), ("list_events", {"day": "sunday"})),
        reply_text("Dentist at 9, design review at 2."),
    )
    result = await replay_turn(deps, original.turn_id, tier="medium")

    orchestrator, worker, worker_2 = peer.requests[before:]
    assert orchestrator.body["model"] == worker.body["model"] == "gpt-medium"
    assert "list_events" in [t["name"] for t in worker.body["tools"]]
    recorded, unmatched = outputs(worker_2)
    assert recorded.startswith("09:00-09:30 Dentist") and NOT_RECORDED in unmatched
    # The worker's report is the replay's reply, as it was the original's: no fourth generation.
    assert result.new_reply == "Dentist at 9, design review at 2." and len(peer.requests) == before + 3
    assert result.old_reply == "Today: 09:00 Dentist, 14:00 Design review."
    record = await turn_record(db, result.replay_turn_id)
    assert record["skills"]["ended_by"] == "direct_report"
    assert [(w["skill"], w["status"]) for w in record["skills"]["workers"]] == [("agenda", "replied")]
    assert await db.fetchval("SELECT count(*) FROM staged_writes WHERE turn_id = $1", result.replay_turn_id) == 0
