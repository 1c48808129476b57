"""Each call's latency broken down (endpointing as the model reports it, the model's first audio,
tools, Pepper's own relay) in the call's record, and ``pepper calls show``."""

from __future__ import annotations

import asyncio
import json

from cli_support import run_cli
from phone_support import grown, scrape, scrape_after_call, speech, until

from core.records import calls as call_records
from voice.engine import SAMPLE_EVERY
from voice.testing.realtime_peer import call_tool, speak


async def test_a_calls_latency_is_recorded_broken_down_and_shown(phone, db_url, monkeypatch, capsys):
    phone.model.script(call_tool("current_time", {}), speak("It is noon.", ms=400))
    phone.model.hear("what time is it")
    before = await scrape(phone.caller)
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        call.say(speech("hello"))
        session = phone.model.sessions[0]
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        stats = phone.calls.sessions[answer.call_sid].stats
        await call.wait(lambda: stats.response_ms, within=15, what="the answer's first audio")
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    stats = await phone.db.fetchval("SELECT stats FROM calls WHERE call_sid = $1", answer.call_sid)
    stats = json.loads(stats) if isinstance(stats, str) else stats
    # The peer's VAD waits 500 ms of silence before speech_stopped: that is its endpointing.
    assert stats["endpointing_ms"] and all(480 <= v <= 2000 for v in stats["endpointing_ms"])
    assert len(stats["tool_ms"]) == 1 and stats["tool_ms"][0] >= 0
    assert stats["model_ms"] and stats["relay_ms"] and len(stats["model_ms"]) == len(stats["relay_ms"])
    for model, relay, total in zip(stats["model_ms"], stats["relay_ms"], stats["response_ms"], strict=True):
        assert relay < 50 and abs(model + relay - total) < 1.0  # the parts add up to the whole
    # Per reply, for the call page's bars: the endpointing it answers and the tools inside its model time.
    assert len(stats["reply_tool_ms"]) == len(stats["reply_endpointing_ms"]) == len(stats["model_ms"])
    assert max(stats["reply_tool_ms"]) == stats["tool_ms"][0]
    assert all(t <= m for t, m in zip(stats["reply_tool_ms"], stats["model_ms"], strict=True))
    assert set(stats["reply_endpointing_ms"]) <= set(stats["endpointing_ms"])

    # The recording's last chunk is written just after the call's record (it holds what finishing
    # the call did), batched with other calls' chunks: wait for it as a reader a moment later would.
    async def recorded() -> bool:
        loaded = await call_records.load_recording(phone.db, answer.call_sid)
        return loaded is not None and loaded[1]

    await until(recorded, 10, "the call's recording complete")
    monkeypatch.setenv("DATABASE_URL", db_url)
    for which in (answer.call_sid, str(row["turn_id"])):
        code, out, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "calls", "show", which)
        assert code == 0, err
        assert f"call {answer.call_sid}  route owner  status completed  ended: hangup" in out
        lines = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ")}
        assert "endpointing (the model's, as it reports it)" in lines and "tools, per call" in lines
        assert lines["tools, per call"].split()[3] == "1"
        assert "recording for replay: complete" in out
    code, _, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "calls", "show", "CAnope'--")
    assert code == 1 and "no call" in err

    # The same figures in /metrics, added once at the call's end; each way's frames sampled (the
    # first of the call, then one in SAMPLE_EVERY), never one observation per frame.
    after = await scrape_after_call(phone.caller, before)
    assert grown(before, after, "pepper_calls_started_total", route="owner") == 1
    assert grown(before, after, "pepper_calls_ended_total", reason="hangup") == 1
    for key in ("model_ms", "relay_ms", "tool_ms", "endpointing_ms"):
        name = "pepper_call_" + key
        assert grown(before, after, name + "_count") == len(stats[key]), name
        assert abs(grown(before, after, name + "_sum") - sum(stats[key])) < 1.0, name
    frames_in, frames_out = stats["frames_in"], stats["audio_out_bytes"] // 160
    up, down = (
        grown(before, after, "pepper_call_caller_to_model_ms_count"),
        grown(before, after, "pepper_call_model_to_caller_ms_count"),
    )
    assert 1 <= up <= frames_in // SAMPLE_EVERY + 1 and 1 <= down <= frames_out // SAMPLE_EVERY + 1
    assert grown(before, after, "pepper_call_caller_to_model_ms_bucket", le="+Inf") == up
    assert grown(before, after, "pepper_call_delegation_ms_count") == 0  # not a GPT-Live call
