"""What a turn leaves on disk by the time its reply can go out.

A turn's calls commit without waiting for the disk; the finished record's commit waits, which
flushes them too (the write-ahead log is written in order). The probe: right after ``run_turn``
returns, nothing the turn committed may still sit beyond the flushed end of the log.
"""

from uuid import uuid4

import pytest

from core.errors import NotFound
from core.testing.scripted import calls, reply
from text_loop import run_turn


async def _log_flushed(db) -> bool:
    return await db.fetchval("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")


async def test_a_turns_writes_and_reply_are_on_disk_when_the_turn_returns(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'bins') RETURNING id", account.id)
    models.script(
        calls(("add_note", {"text": "the bins go out on Tuesday"}), ("complete_todo", {"id": todo})),
        reply("Noted, and the bins todo is ticked off once you see this."),
    )
    outcome = await run_turn(deps, account.id, "web", "note the bins day and tick off the todo")

    assert await _log_flushed(db)
    assert outcome.status == "replied" and outcome.staged_writes == 1
    assert await db.fetchval("SELECT count(*) FROM notes WHERE body = 'the bins go out on Tuesday'") == 1
    staged = await db.fetchval("SELECT status FROM staged_writes WHERE turn_id = $1", outcome.turn_id)
    assert staged == "staged"
    assert await db.fetchval("SELECT reply FROM turns WHERE id = $1", outcome.turn_id) == outcome.reply


async def test_an_unknown_account_starts_no_turn(db, deps, models, account):
    with pytest.raises(NotFound):
        await run_turn(deps, uuid4(), "web", "hello")
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    assert models.prompts == []
