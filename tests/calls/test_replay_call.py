"""Deterministic replay of a recorded call (``pepper replay-call``): the recording is kept with the
call, replays identically on the same build, and a change to barge-in handling shows up."""

from __future__ import annotations

import asyncio
import base64

import pytest
from cli_support import run_cli
from phone_support import speech, until, verify_by_keypad

from core.adapters.twilio import media_streams as media
from core.errors import InvalidInput
from core.records import calls as call_records
from voice.call_tape import CallTape, TapeWriter
from voice.realtime import AudioDelta
from voice.replay_call import outputs_of, replay_call
from voice.testing.realtime_peer import call_tool, speak


async def _todo(phone) -> int:
    return await phone.db.fetchval(
        "INSERT INTO todos (account_id, title) VALUES ($1, 'call the plumber') RETURNING id", phone.account_id
    )


async def _final(phone, call_sid: str) -> tuple[list, bool]:
    """The call's recording once its final chunk is written (just after the call's record)."""

    async def finished() -> object:
        loaded = await call_records.load_recording(phone.db, call_sid)
        return loaded if loaded and loaded[1] else None

    return await until(finished, what="the recording's final chunk")


async def _barged_call(phone) -> str:
    """A call with the keypad PIN, a staged write and a barge-in before its confirmation played."""
    todo = await _todo(phone)
    phone.model.script(speak("You're verified."), call_tool("complete_todo", {"id": todo}),
                       speak("Done, I ticked off call the plumber, and here is a long tail.", ms=4000))  # fmt: skip
    phone.model.hear("tick off the plumber", "wait")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await verify_by_keypad(phone, call)
        call.say(speech("todo"))
        session = phone.model.sessions[0]
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        await call.wait(lambda: call.received_media_bytes > 8 * 3000, within=15, what="the confirmation to arrive")
        call.say(speech("interrupt"))
        await call.wait(lambda: call.clears, within=10, what="a clear")
        await phone.model.wait_for(lambda: any("NOT saved" in n for n in session.notes))
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    return answer.call_sid


async def test_a_recorded_call_replays_identically_and_a_barge_in_change_shows(phone, db_url, monkeypatch, capsys):
    call_sid = await _barged_call(phone)
    entries, complete = await _final(phone, call_sid)
    assert complete
    codes = {e[0] for e in entries}
    assert {"hdr", "a", "mk", "dt", "ss", "ad", "fc", "td", "otool", "oc", "otr", "ow", "oe"} <= codes
    keys = [e[2] for e in entries if e[0] == "dt"]
    assert keys == ["d", "d", "d", "d", "#"]  # the PIN keyed in is withheld, the pound key kept

    same = await replay_call(phone.db, entries, complete=complete)
    assert same.identical, same.differences
    assert same.recorded_outputs == same.replayed_outputs > 10

    def no_clear_on_speech(engine) -> None:
        async def ignore() -> None:
            return None

        engine._barge_in = ignore  # the deliberate change: speech_started no longer clears

    changed = await replay_call(phone.db, entries, complete=complete, change=no_clear_on_speech)
    assert not changed.identical
    said = "\n".join(changed.differences)
    # Every barge-in's clear, cancel and truncation is gone from the replay, and said so.
    clears = sum(1 for e in entries if e[0] == "oc")
    assert clears >= 1 and not any(e[0] == "oc" for e in changed.replayed)
    assert said.count("clear") >= clears and "response.cancel" in said and "truncate item_" in said

    # From the command line, by CallSid or by the call's turn; a call with no recording is refused.
    monkeypatch.setenv("DATABASE_URL", db_url)
    turn = (await phone.call_row(call_sid))["turn_id"]
    for which in (call_sid, str(turn)):
        code, out, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "replay-call", which)
        assert code == 0, err
        assert f"call {call_sid}: recording complete" in out and "replay identical" in out
    code, out, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "replay-call", "CA' OR 1=1 --")
    assert code == 1 and "no recorded call" in err


async def test_a_call_whose_model_reported_a_server_error_replays_identically(phone):
    """The model's own failure as an error event replaces the session as a drop does; the recording
    holds the event and no drop after it, so the replay reconnects once, as the call did."""
    phone.model.script(speak("Sorry, the line dropped for a moment."))  # the second socket's apology
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        at = await phone.model.server_error(0)
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 2)
        second = phone.model.sessions[1]
        asked = second.response_creates
        await phone.model.wait_for(lambda: any("Apologise" in r.get("instructions", "") for r in asked))
        await call.wait(lambda: call.first_sound_after(at) is not None, what="the apology")
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["end_reason"] == "hangup"
    entries, complete = await _final(phone, answer.call_sid)
    assert complete
    assert any(e[0] == "er" for e in entries) and not any(e[0] == "drop" for e in entries)
    same = await replay_call(phone.db, entries, complete=complete)
    assert same.identical, same.differences


async def test_a_call_cut_short_leaves_a_readable_incomplete_recording(phone):
    phone.tune(tape_flush_s=0.05)
    phone.model.script(speak("Sure.", ms=400))
    phone.model.hear("hello")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        call.say(speech("hello"))

        async def chunks() -> object:
            loaded = await call_records.load_recording(phone.db, answer.call_sid)
            heard = loaded and any(e[0] == "a" and e[5] for e in loaded[0])  # caller audio reached the model
            return loaded if heard else None

        # Mid-call (as a process killed now would leave it): what is written so far reads, incomplete.
        entries, complete = await until(chunks, what="chunks written while the call runs")
        assert not complete and entries[0][0] == "hdr"
        partial = await replay_call(phone.db, entries, complete=complete)
        assert not partial.complete and partial.recorded_outputs > 0
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    entries, complete = await _final(phone, answer.call_sid)
    assert complete and entries[-1][0] == "oe"


async def test_garbage_recordings_are_refused(phone):
    assert await call_records.load_recording(phone.db, "CAnothing") is None
    for bad in (
        [],
        [["a", 0, 1, 0, 0, 0]],
        [["hdr", 0, {"version": 99}]],
        [["hdr", 0, {"version": 1, "full_duplex": True}]],
    ):
        with pytest.raises(InvalidInput):
            await replay_call(phone.db, bad)


async def test_recording_chunks_are_written_once_and_a_gap_reads_as_incomplete(db):
    first = [["hdr", 0.0, {"version": 1}], ["mk", 1.0, "n1"]]
    await call_records.store_recording(db, "CAgap", None, 0, first, final=False)
    await call_records.store_recording(db, "CAgap", None, 0, [["forged", 0.0]], final=True)  # a duplicate seq
    await call_records.store_recording(db, "CAgap", None, 2, [["oe", 9.0, "hangup"]], final=True)
    entries, complete = await call_records.load_recording(db, "CAgap")
    assert entries == first and not complete  # chunk 1 never came: what came before it still reads
    await call_records.store_recording(db, "CAgap", None, 1, [["stop", 5.0]], final=False)
    entries, complete = await call_records.load_recording(db, "CAgap")
    assert [e[0] for e in entries] == ["hdr", "mk", "stop", "oe"] and complete


def test_a_streaming_reply_tapes_as_three_entries_and_compares_as_a_version_1_tape_would():
    """The audio marks sent and echoed while a reply streams stay inside the runs (not an entry
    per mark), and the outputs read from them are those of the old shape, in order."""
    sid = "MZ" + "5" * 32
    tape = CallTape({"stream_sid": sid})
    delta = AudioDelta("resp_1", "item_1", base64.b64encode(b"\xff" * 160).decode())
    for i in range(1, 11):
        tape.audio_in(delta.payload)
        tape.to_model()
        tape.model_audio(delta)
        tape.sent(media.media_frame(sid, delta.payload))
        if i % 5 == 0:
            tape.sent(media.mark_frame(sid, f"a{i}"))
            tape.frame_in("mark", {"event": "mark", "mark": {"name": f"a{i}"}})
    tape.sent(media.mark_frame(sid, "c11"))  # a commit mark is an entry of its own, and ends the model run
    tape.sent(media.media_frame(sid, delta.payload))
    _, entries = tape.take()
    assert [e[0] for e in entries] == ["hdr", "a", "ad", "mk", "om", "op"]
    assert entries[2][5:] == [10, 10, [[5, "a5"], [10, "a10"]]] and entries[3][2:] == ["a5", "a10"]
    version_1 = [
        ["hdr", 0.0, {"version": 1}], ["a", 0.0, 5, 0, 0.1, 5], ["ad", 0.0, "resp_1", "item_1", 160, 5, 5],
        ["om", 0.1, "a5"], ["mk", 0.1, "a5"], ["a", 0.1, 5, 0, 0.2, 5], ["ad", 0.1, "resp_1", "item_1", 160, 5, 5],
        ["om", 0.2, "a10"], ["mk", 0.2, "a10"], ["om", 0.2, "c11"], ["op", 0.2, 160, 1],
    ]  # fmt: skip
    # Caller audio to the model counted once per stretch of streaming: where the old shape cut its
    # run (at each mark echoed) is not behaviour, and the two shapes compare equal.
    expected = [("to_model", 10), ("op", 160, 5), ("om", "a5"), ("op", 160, 5), ("om", "a10"), ("om", "c11"),
                ("op", 160, 1)]  # fmt: skip
    assert [o[0] for o in outputs_of(version_1)] == [o[0] for o in outputs_of(entries)] == expected


async def test_chunks_of_many_calls_are_written_together_and_once(db):
    writer = TapeWriter(db, batch_s=0.05)
    first = [["hdr", 0.0, {"version": 2}], ["mk", 1.0, "n1"]]
    await asyncio.gather(
        writer.write("CAone", None, 0, first, final=False),
        writer.write("CAtwo", None, 0, [["hdr", 0.0, {"version": 2}]], final=True),
        writer.write("CAone", None, 0, [["forged", 0.0]], final=True),  # the same chunk again: ignored
        writer.write("CAone", None, 1, [["oe", 9.0, "hangup"]], final=True),
    )
    assert await call_records.load_recording(db, "CAone") == ([*first, ["oe", 9.0, "hangup"]], True)
    assert await call_records.load_recording(db, "CAtwo") == ([["hdr", 0.0, {"version": 2}]], True)
    assert await db.fetchval("SELECT count(*) FROM call_recordings") == 3
    # One statement for all four (now() is its transaction's time): not a round trip per chunk.
    assert await db.fetchval("SELECT count(DISTINCT written_at) FROM call_recordings") == 1
