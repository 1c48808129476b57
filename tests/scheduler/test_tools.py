"""The chat tools: create, list and cancel tasks, reminders, and the cancel speed bump."""

from __future__ import annotations

from datetime import UTC, datetime

from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.testing.scripted import calls, reply
from text_loop import run_turn


async def _contents(db, turn_id):
    import json

    return [(c["name"], c["status"], c["content"]) for c in json.loads(
        await db.fetchval("SELECT tool_calls FROM turns WHERE id = $1", turn_id)
    )]  # fmt: skip


async def _tasks(db, account, clock, n):
    ids = []
    async with db.transaction() as conn:
        for i in range(n):
            task = await create_task(
                conn, account.id, title=f"task {i}", prompt="p",
                schedule=parse_schedule("mornings", now=clock(), timezone="Europe/Paris"), now=clock(),
            )  # fmt: skip
            ids.append(task.id)
    return ids


async def test_the_owner_creates_a_task_in_chat(db, deps, models, account):
    models.script(
        calls(("create_task", {"title": "Brief", "prompt": "Brief me.", "schedule": "weekdays at 7:30",
                               "deliver_to": ["sms"]})),
        reply("Done: every weekday at 07:30."),
    )  # fmt: skip
    outcome = await run_turn(deps, account.id, "web", "brief me every weekday at 7:30 by text")
    [(name, status, content)] = await _contents(db, outcome.turn_id)
    assert (name, status) == ("create_task", "ok")
    assert "weekdays at 07:30, first run Mon 02 Jun 07:30" in content
    row = await db.fetchrow("SELECT * FROM scheduled_tasks")
    assert row["deliver_to"] == ["sms"] and row["next_run_at"] == datetime(2025, 6, 2, 5, 30, tzinfo=UTC)
    assert row["created_turn_id"] == outcome.turn_id
    assert 0 <= row["offset_seconds"] < 300


async def test_a_bad_schedule_fails_plainly_and_creates_nothing(db, deps, models, account):
    models.script(calls(("create_task", {"title": "x", "prompt": "y", "schedule": "whenever"})), reply("I could not."))
    outcome = await run_turn(deps, account.id, "web", "do x whenever")
    [(_, status, content)] = await _contents(db, outcome.turn_id)
    assert status == "failed" and "not a day: 'whenever'" in content and "Write a schedule like" in content
    assert await db.fetchval("SELECT count(*) FROM scheduled_tasks") == 0


async def test_a_sun_schedule_needs_the_owners_place(db, deps, models, account):
    from core.scheduling.schedule import Place
    from core.scheduling.tasks import set_owner_place

    args = {"title": "Lights", "prompt": "Remind me to close the shutters.", "schedule": "sunset"}
    models.script(calls(("create_task", args)), reply("no"), calls(("create_task", args)), reply("yes"))
    first = await run_turn(deps, account.id, "web", "at sunset")
    assert "does not know where you are" in (await _contents(db, first.turn_id))[0][2]
    await set_owner_place(db, account.id, Place(48.8566, 2.3522))
    second = await run_turn(deps, account.id, "web", "at sunset")
    assert (await _contents(db, second.turn_id))[0][1] == "ok"


async def test_at_most_two_tasks_are_cancelled_in_one_turn_without_the_bulk_flag(db, deps, models, account, clock):
    ids = await _tasks(db, account, clock, 4)
    models.script(
        calls(("cancel_tasks", {"ids": [ids[0]]}), ("cancel_tasks", {"ids": [ids[1]]}),
              ("cancel_tasks", {"ids": [ids[2]]})),
        reply("I cancelled two; the third needs your confirmation."),
    )  # fmt: skip
    outcome = await run_turn(deps, account.id, "web", "turn these off")
    results = await _contents(db, outcome.turn_id)
    assert [s for _, s, _ in results] == ["ok", "ok", "failed"]
    assert "needs bulk=true" in results[2][2] and "Nothing was cancelled" in results[2][2]
    statuses = [r["status"] for r in await db.fetch("SELECT status FROM scheduled_tasks ORDER BY id")]
    assert statuses == ["cancelled", "cancelled", "active", "active"]

    models.script(calls(("cancel_tasks", {"ids": ids[2:]})), reply("no"))
    one_call = await run_turn(deps, account.id, "web", "cancel the other two as well... and more")
    assert [s for _, s, _ in await _contents(db, one_call.turn_id)] == ["ok"]  # a new turn: two are fine


async def test_three_at_once_need_bulk_and_bulk_allows_them(db, deps, models, account, clock):
    ids = await _tasks(db, account, clock, 3)
    models.script(
        calls(("cancel_tasks", {"ids": ids})), reply("Asking first."),
        calls(("cancel_tasks", {"ids": ids, "bulk": True})), reply("All three cancelled."),
    )  # fmt: skip
    refused = await run_turn(deps, account.id, "web", "cancel all my tasks")
    assert (await _contents(db, refused.turn_id))[0][1] == "failed"
    assert await db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'active'") == 3
    allowed = await run_turn(deps, account.id, "web", "yes, all of them")
    assert (await _contents(db, allowed.turn_id))[0][1] == "ok"
    assert await db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'active'") == 0


async def test_a_scheduled_run_cannot_cancel_or_create_tasks(db, deps, models, account, clock):
    ids = await _tasks(db, account, clock, 1)
    models.script(
        calls(("cancel_tasks", {"ids": ids}), ("set_reminder", {"text": "x", "when": "in 5 minutes"})), reply("ok")
    )
    outcome = await run_turn(deps, account.id, "web", "clean up", kind="scheduled")
    assert [s for _, s, _ in await _contents(db, outcome.turn_id)] == ["failed", "failed"]
    assert await db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'active'") == 1


async def test_a_room_does_not_see_one_members_tasks(db, deps, account):
    from core.tools.context import SessionContext

    room = SessionContext("room", "owner_verified", "web", account.id)
    visible = {t.name for t in deps.registry.visible(room, deps.gate.hides)}
    assert not visible & {"create_task", "list_tasks", "cancel_tasks", "set_reminder", "list_reminders"}


async def test_reminders_are_one_shot_tasks(db, deps, models, account):
    models.script(
        calls(("set_reminder", {"text": "call mum", "when": "tomorrow at 9am"}),
              ("set_reminder", {"text": "stretch", "when": "weekdays at 10:00"}),
              ("list_reminders", {}), ("list_tasks", {})),
        reply("Set."),
    )  # fmt: skip
    outcome = await run_turn(deps, account.id, "web", "remind me")
    results = await _contents(db, outcome.turn_id)
    assert results[0][1] == "ok" and "Tue 03 Jun 09:00" in results[0][2]
    assert results[1][1] == "failed" and "happens once" in results[1][2]
    assert "call mum" in results[2][2]
    assert "[reminder]" in results[3][2]
    row = await db.fetchrow("SELECT kind, schedule, next_run_at FROM scheduled_tasks")
    assert row["kind"] == "reminder" and row["next_run_at"] == datetime(2025, 6, 3, 7, 0, tzinfo=UTC)


async def test_cancellations_run_at_once_in_one_turn_still_stop_at_two(db, deps, account, clock):
    """A call runs the model's tool calls at once: four single cancellations in one turn, all
    started together, still cancel two and refuse the rest."""
    import asyncio

    from core.conversation import conversation_for, start_turn
    from core.models.types import ToolCall
    from core.tools.context import SessionContext
    from core.tools.registry import ToolContext
    from core.tools.runner import run_call

    ids = await _tasks(db, account, clock, 4)
    conversation = await conversation_for(db, account.id)
    turn_id = await start_turn(db, conversation, channel="voice", kind="call")
    session = SessionContext(kind="call", trust="owner_verified", channel="voice", account_id=account.id,
                             conversation_id=conversation, turn_id=turn_id, timezone="Europe/Paris")  # fmt: skip
    ctx = ToolContext(session, db, clock())
    outcomes = await asyncio.gather(*(
        run_call(deps.registry, deps.gate, ctx, ToolCall(f"call-{i}", "cancel_tasks", {"ids": [i]})) for i in ids
    ))  # fmt: skip
    assert sorted(o.status for o in outcomes) == ["failed", "failed", "ok", "ok"]
    assert all("needs bulk=true" in o.content for o in outcomes if o.status == "failed")
    assert await db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE status = 'cancelled'") == 2
