"""The scheduler's loop runs the calendar's detectors for people whose calendar changed, and a
turn (the morning brief's tool, scripted model) reads the cards in a labelled untrusted block."""

from __future__ import annotations

import json
from datetime import timedelta

from core.quality.detectors import promote
from core.suggestions import cards
from core.testing.scripted import calls, reply
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event
from text_loop import run_turn


async def test_the_loop_runs_detectors_on_change_and_a_turn_reads_the_cards(db, deps, models, account, scheduler,
                                                                           clock):  # fmt: skip
    await promote(db, "clash", clock())
    calendar_id = await ensure_pepper_calendar(db, account.id)
    start = clock() + timedelta(hours=3)
    for title, offset in (("Dentist", 0), ("Standup", 30)):
        await insert_event(db, account.id, calendar_id, title=title, start=start + timedelta(minutes=offset),
                           end=start + timedelta(minutes=offset + 60), tzid="Europe/Paris")  # fmt: skip
    assert await scheduler.suggest() == 1
    [card] = await cards(db, account.id)
    assert "Dentist and Standup overlap" in card.title
    assert await scheduler.suggest() == 0  # nothing changed since

    models.script(calls(("calendar_suggestions", {})), reply("Dentist and standup clash at 10:00."))
    outcome = await run_turn(deps, account.id, "web", "anything I should know about today?")
    [call] = json.loads(await db.fetchval("SELECT tool_calls FROM turns WHERE id = $1", outcome.turn_id))
    assert call["name"] == "calendar_suggestions" and call["status"] == "ok"
    assert "[the calendar's suggestions;" in call["content"] and f'#{card.id} clash: "Dentist' in call["content"]
    assert len(await cards(db, account.id)) == 1  # the tool's run found the same clash: no second card
