"""The circuit breaker: a conversation whose turns fail three times in a row within an hour is
paused (the owner told once), answers without a model while paused, and resumes after an hour or
at ``pepper breaker reset``; a turn that ends well clears the strikes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cli_support import run_cli

from core.identity import create_account
from core.models.errors import ModelTransientError
from core.testing.scripted import reply
from core.usage.breaker import PAUSED_REPLY, tripped_notice
from text_loop import HarnessDeps, run_turn
from text_loop.loop import MODEL_ERROR_REPLY

START = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def failure() -> ModelTransientError:
    return ModelTransientError("the provider is down", provider="scripted", status=503)


async def test_three_failures_in_a_row_pause_the_conversation_until_an_hour_passes(db, models) -> None:
    ada = await create_account(db, "Ada", timezone="UTC")
    clock = Clock()
    deps = HarnessDeps(db=db, models=models, clock=clock)
    models.script(failure(), reply("Fine."), failure(), failure())
    assert (await run_turn(deps, ada.id, "web", "one")).status == "model-error"
    assert (await run_turn(deps, ada.id, "web", "two")).status == "replied"  # clears the strike
    for n in (1, 2):
        clock.now += timedelta(minutes=5)
        assert (await run_turn(deps, ada.id, "web", f"again {n}")).reply == MODEL_ERROR_REPLY
    models.script(failure())
    tripped = await run_turn(deps, ada.id, "web", "three")
    assert tripped.reply == f"{MODEL_ERROR_REPLY}\n\n({tripped_notice('this conversation', 3)})"
    calls = len(models.received)
    paused = await run_turn(deps, ada.id, "web", "hello?")
    assert (paused.status, paused.reply) == ("paused", PAUSED_REPLY)
    assert len(models.received) == calls  # no model call while paused
    clock.now += timedelta(hours=1, minutes=1)
    models.script(reply("Back."))
    assert (await run_turn(deps, ada.id, "web", "hello?")).reply == "Back."


async def test_failures_spread_over_more_than_an_hour_do_not_trip_it(db, models) -> None:
    ada = await create_account(db, "Ada", timezone="UTC")
    clock = Clock()
    deps = HarnessDeps(db=db, models=models, clock=clock)
    for _ in range(4):
        models.script(failure())
        assert (await run_turn(deps, ada.id, "web", "hi")).status == "model-error"
        clock.now += timedelta(minutes=40)


def test_breaker_list_and_reset(db_url, monkeypatch, capsys) -> None:
    import asyncio

    from core.store import Database
    from core.usage.breaker import record

    monkeypatch.setenv("DATABASE_URL", db_url)

    async def trip() -> None:
        db = await Database.open(db_url, max_size=1)
        ada = await create_account(db, "Ada")
        for _ in range(3):
            await record(db, "task:7", ada.id, "capped", START, 3)
        await db.close()

    asyncio.run(trip())
    code, out, _ = run_cli(monkeypatch, capsys, "breaker", "list")
    assert code == 0 and out == "task:7  3 strike(s), last capped  paused since 2025-06-02 12:00 UTC"
    assert run_cli(monkeypatch, capsys, "breaker", "reset", "task:7")[1] == "cleared 1 breaker(s)"
    assert run_cli(monkeypatch, capsys, "breaker", "list")[1] == "no strikes and nothing paused"
