"""Writes on a call, where the model runs tools while it talks: a staged write is saved only after
the caller heard the response asked to confirm it, and the per-turn limits hold when tool calls
run at once."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime

from phone_support import speech, until, verify_by_keypad

from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.tools.registry import ToolRegistry
from core.tools.starter import starter_registry
from voice.testing.realtime_peer import ScriptedResponse, speak, tone


async def test_a_staged_write_is_not_saved_by_a_response_the_model_began_while_its_tool_ran(phone):
    """The tool result comes while the model is already saying something else ("Mm-hm, one
    moment."): the request to confirm waits for that response to end, and only the mark after the
    confirming response saves the write."""
    todo = await phone.db.fetchval(
        "INSERT INTO todos (account_id, title) VALUES ($1, 'call the plumber') RETURNING id", phone.account_id
    )
    entered, release = asyncio.Event(), asyncio.Event()
    tools = starter_registry().all()
    real = next(t for t in tools if t.name == "complete_todo")

    async def held(ctx, args):
        entered.set()
        await release.wait()
        return await real.handler(ctx, args)

    phone.calls.deps.registry = ToolRegistry(
        dataclasses.replace(t, handler=held) if t.name == "complete_todo" else t for t in tools
    )
    confirmation = tone(600, hz=880)  # what the confirming response sounds like, told apart from the rest
    phone.model.script(
        speak("You're verified."),
        ScriptedResponse(calls=(("complete_todo", {"id": todo}),), ms=0),
        speak("Mm-hm, one moment.", ms=1500),
        speak("Done, I ticked off call the plumber.", audio=confirmation),
    )
    phone.model.hear("tick off the plumber")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await verify_by_keypad(phone, call)
        session = phone.model.sessions[0]
        await phone.model.wait_for(lambda: len(session.response_creates) >= 2)  # "You're verified."
        call.say(speech("todo"))
        await asyncio.wait_for(entered.wait(), 15)
        # The model begins a response of its own while the tool runs, and is still in it when the
        # tool's result comes.
        phone.model.pace = 0.1
        creates = len(session.response_creates)
        heard = call.received_media_bytes
        await phone.model.respond(0)
        await call.wait(lambda: call.received_media_bytes > heard, what="the model's own response to play")
        release.set()
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        phone.model.pace = 0.01
        done_at = await until(
            lambda: phone.db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo), 15, "the write to be saved"
        )
        assert done_at is not None
        # Saved only once the caller heard the confirming response, the one asked for after the
        # tool result (sent once the model's own response had ended).
        heard_the_confirmation = confirmation[:1600] in bytes(call.heard)
        assert heard_the_confirmation
        assert len(session.response_creates) == creates + 1
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert f"saved: todo #{todo} marked done" in row["summary"]
    assert await phone.db.fetchval("SELECT status FROM staged_writes") == "committed"


async def test_four_cancellations_at_once_on_a_call_still_stop_at_two_without_the_bulk_flag(phone):
    """A fooled model asks to cancel four tasks in one response, one call each and no ``bulk``:
    the call runs tool calls at once, and the two-per-turn speed bump still holds."""
    now = datetime.now(UTC)
    ids = []
    async with phone.db.transaction() as conn:
        for i in range(4):
            task = await create_task(conn, phone.account_id, title=f"task {i}", prompt="p",
                                     schedule=parse_schedule("mornings", now=now, timezone="UTC"), now=now)  # fmt: skip
            ids.append(task.id)
    phone.model.script(
        speak("You're verified."),
        ScriptedResponse(calls=tuple(("cancel_tasks", {"ids": [i]}) for i in ids), ms=0),
        speak("I cancelled two of them; the others need you to confirm."),
    )
    phone.model.hear("turn them all off")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await verify_by_keypad(phone, call)
        session = phone.model.sessions[0]
        await phone.model.wait_for(lambda: len(session.response_creates) >= 2)
        call.say(speech("todo"))
        await phone.model.wait_for(lambda: len(session.tool_outputs) == 4, within=15)
        outputs = [o["output"] for o in session.tool_outputs]
        await call.hang_up()
    assert await phone.db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'cancelled'") == 2
    assert await phone.db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'active'") == 2
    refused = [o for o in outputs if "needs bulk=true" in o]
    assert len(refused) == 2 and all("Nothing was cancelled" in o for o in refused)
    await phone.call_row(answer.call_sid)


async def test_a_write_whose_confirmation_was_cut_by_a_model_drop_is_not_saved_by_the_apology(phone):
    """The model's socket drops while the confirmation plays; the new socket's apology speaks,
    but it never confirmed the write (that session never saw the tool result): dropped, and the
    new session is told."""
    todo = await phone.db.fetchval(
        "INSERT INTO todos (account_id, title) VALUES ($1, 'call the plumber') RETURNING id", phone.account_id
    )
    phone.model.script(
        speak("You're verified."),
        ScriptedResponse(calls=(("complete_todo", {"id": todo}),), ms=0),
        speak("Done, I ticked off call the plumber.", ms=3000),
        speak("Sorry, the line dropped for a moment."),
    )
    phone.model.hear("tick off the plumber")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await verify_by_keypad(phone, call)
        session = phone.model.sessions[0]
        await phone.model.wait_for(lambda: len(session.response_creates) >= 2)
        phone.model.pace = 0.1  # the confirmation streams in real time
        call.say(speech("todo"))
        await phone.model.wait_for(lambda: session.tool_outputs, within=15)
        heard = call.received_media_bytes
        await call.wait(lambda: call.received_media_bytes > heard, what="the confirmation to start")
        await phone.model.drop(0)
        phone.model.pace = 0.01
        await phone.model.wait_for(lambda: len(phone.model.sessions) == 2)
        second = phone.model.sessions[1]
        await phone.model.wait_for(lambda: any("NOT saved" in n for n in second.notes))
        # The apology is spoken; the write is resolved (before the fix: committed on its mark).
        await until(lambda: phone.db.fetchval("SELECT count(*) FROM messages WHERE body = $1",
                                              "Sorry, the line dropped for a moment."), 10, "the apology")  # fmt: skip
        await until(lambda: phone.db.fetchval("SELECT status <> 'staged' FROM staged_writes"), 10, "the write resolved")
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    assert await phone.db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is None
    assert await phone.db.fetchval("SELECT status FROM staged_writes") == "dropped"
