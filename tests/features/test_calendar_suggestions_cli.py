"""``pepper suggestions`` and ``pepper places`` as the owner runs them: list, accept through the
gate, dismiss, with garbage, another account's id and a duplicate accept."""

from __future__ import annotations

import asyncio

import pytest
from cli_support import run_cli

from core.identity import add_handle, create_account
from gateway import cli_suggestions

from .support import NOW, OWNER_EMAIL


@pytest.fixture
def pepper(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(cli_suggestions, "clock", lambda: NOW)

    async def run(*argv: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(run_cli, monkeypatch, capsys, *argv)

    return run


async def test_the_owner_lists_accepts_and_dismisses_cards_from_the_command_line(db, pepper):
    ada = await create_account(db, "Ada", timezone="Europe/Paris")
    await add_handle(db, ada.id, "email", OWNER_EMAIL, verified=True)
    bea = await create_account(db, "Bea")
    await db.execute("INSERT INTO todos (account_id, title) VALUES ($1, 'Write the report (1h)')", ada.id)
    await db.execute("INSERT INTO todos (account_id, title) VALUES ($1, 'Plan the trip (30 min)')", ada.id)

    code, out, _ = await pepper("suggestions", "run", "Ada")
    assert code == 0 and "todo-slot 2" in out and "0 card(s) open" in out  # in shadow: found, not shown
    code, out, _ = await pepper("suggestions", "list", "Ada")
    assert code == 0 and out == "no suggestions"
    code, out, _ = await pepper("suggestions", "list", "Ada", "--shadow")
    assert "Write the report" in out and "Plan the trip" in out

    assert (await pepper("detectors", "promote", "todo-slot"))[0] == 0
    code, out, _ = await pepper("suggestions", "run", "Ada")
    assert "2 card(s) open" in out
    ids = [int(x) for x in await db.fetchval(
        "SELECT array_agg(id ORDER BY id) FROM suggestions WHERE account_id = $1", ada.id)]  # fmt: skip
    report, trip = ids

    for bad in ("abc", "99999999999999999999999"):
        code, _, err = await pepper("suggestions", "accept", "Ada", bad)
        assert code == 1 and "a suggestion id is a number" in err
    code, _, err = await pepper("suggestions", "accept", "Bea", str(report))  # another account's card
    assert code == 1 and "no open suggestion" in err
    code, _, err = await pepper("suggestions", "dismiss", "Bea", str(report))
    assert code == 1 and "no open suggestion" in err

    code, out, _ = await pepper("suggestions", "accept", "Ada", str(report))
    assert code == 0 and "Done" in out, out
    code, _, err = await pepper("suggestions", "accept", "Ada", str(report))  # a duplicate does nothing twice
    assert code == 1 and "no open suggestion" in err
    made = await db.fetchval("SELECT count(*) FROM calendar_events WHERE title = 'Write the report (1h)'")
    assert made == 1

    code, out, _ = await pepper("suggestions", "dismiss", "Ada", str(trip))
    assert code == 0 and "will not come back" in out
    await pepper("suggestions", "run", "Ada")
    code, out, _ = await pepper("suggestions", "list", "Ada")
    assert out == "no suggestions"
    code, out, _ = await pepper("suggestions", "list", "Ada", "--all")
    assert "(accepted)" in out and "(dismissed)" in out
    assert bea.id != ada.id


async def test_places_are_saved_with_coordinates_and_garbage_is_refused(db, pepper):
    await create_account(db, "Ada")
    code, out, _ = await pepper("places", "add", "Ada", "Office", "--at", "48.8566,2.3522")
    assert code == 0 and "48.85660, 2.35220" in out
    for bad in ("north", "95,10"):
        code, _, err = await pepper("places", "add", "Ada", "Office", "--at", bad)
        assert code == 1 and "latitude" in err
    code, out, _ = await pepper("places", "list", "Ada")
    assert out == "Office: 48.85660, 2.35220 (saved)"
