"""``pepper turns show`` and ``list`` of a phone call's turn: its notice, transcript and calls."""

from __future__ import annotations

import asyncio

from cli_support import run_cli
from phone_support import speech

from voice.testing.realtime_peer import call_tool


async def test_a_call_turn_shows_its_transcript_and_calls_and_a_failed_model_flags_it(
    phone, db_url, monkeypatch, capsys
):
    phone.model.script(call_tool("current_time", {}))
    phone.model.hear("what time is it")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        call.say(speech("hello"))
        await phone.model.wait_for(lambda: phone.model.sessions[0].tool_outputs, within=15)
        for session in (0, 1):  # the model's line drops, and drops again after the reconnect
            await phone.model.wait_for(lambda n=session: len(phone.model.sessions) > n)
            await phone.model.drop(session)
        await call.wait(lambda: call.closed.is_set(), within=10, what="Pepper to end the call")
    turn = (await phone.call_row(answer.call_sid))["turn_id"]

    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "turns", "show", str(turn))
    assert code == 0, err
    assert "channel voice  kind call  status failed" in out and "flags: failed" in out
    assert '"end_reason": "model-failed"' in out
    assert "opening notice:" in out and "transcript:" in out and "caller: what time is it" in out
    assert "tool calls:\n  call current_time {} -> ok\n" in out
    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "turns", "list", "--flagged", "--kind", "call")
    lines = out.splitlines()[1:]
    assert code == 0 and len(lines) == 1 and lines[0].startswith(str(turn)) and lines[0].endswith("  failed")
    assert lines[0].split()[-3] == "-"  # a call records what was said, not model rounds
