"""``pepper turns`` of a turn that ran a worker skill: its rounds, its calls, the detector's flag."""

from __future__ import annotations

import asyncio

from cli_support import run_cli

from core.testing.peers import ScriptedCall, reply_text, reply_tools
from text_loop import run_turn


async def test_a_worker_skills_rounds_calls_and_skipped_step_are_shown(
    db_url, deps, peer, account, monkeypatch, capsys
):
    peer.script(
        reply_tools(ScriptedCall("use_skill", {"name": "agenda"})),
        reply_tools(("find_free_time", {})),
        reply_text("You are free at 10."),
    )
    turn = (await run_turn(deps, account.id, "web", "what's on?")).turn_id
    monkeypatch.setenv("DATABASE_URL", db_url)

    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "turns", "list", "--flagged")
    (line,) = out.splitlines()[1:]
    # One round of the turn's and two of the worker's, whose tokens the totals hold too.
    assert code == 0 and line.startswith(str(turn)) and line.split()[-3:] == ["3", "30/15", "skipped-required-step"]

    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "turns", "show", str(turn))
    assert code == 0 and "flags: skipped-required-step" in out
    assert '  call use_skill {"name": "agenda"} -> ok\n' in out
    worker = out[out.index("worker agenda (run 1") :]
    assert "  round 1 turn: gpt-small" in worker and "    call find_free_time {} -> ok\n      free: 10:00" in worker
    assert "  round 2 turn: gpt-small" in worker and "  report: You are free at 10." in worker
