"""What a turn leaves on disk by the time its reply can go out.

A turn's calls commit without waiting for the disk; the finished record's commit waits, which
flushes them too (the write-ahead log is written in order). The probe: right after ``run_turn``
returns, nothing the turn committed may still sit beyond the flushed end of the log.
"""

from uuid import uuid4

import asyncpg
import pytest

from core.errors import NotFound
from core.store.pool import connection, transaction
from core.testing.scripted import calls, reply
from text_loop import run_turn

# The probe reads the server's log: nothing else may write meanwhile.
pytestmark = pytest.mark.usefixtures("quiet_server")


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


async def test_a_write_that_need_not_wait_commits_in_a_transaction_begun_with_its_setting(db, account):
    async with connection(db) as conn:
        async with transaction(conn, wait_for_disk=False):
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
            await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'kept')", account.id)
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SHOW synchronous_commit") == "on"  # local to the transaction
    assert await db.fetchval("SELECT count(*) FROM notes WHERE body = 'kept'") == 1


async def test_a_failure_rolls_back_the_whole_write_and_is_raised_as_it_was(db, account):
    async with connection(db) as conn:
        with pytest.raises(LookupError, match="planned failure"):
            async with transaction(conn, wait_for_disk=False):
                await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'lost')", account.id)
                raise LookupError("planned failure")
        assert not conn.is_in_transaction()
        with pytest.raises(asyncpg.UniqueViolationError):
            async with transaction(conn, wait_for_disk=False):
                await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'lost too')", account.id)
                await conn.execute("INSERT INTO accounts (id, name) VALUES ($1, 'twice')", account.id)
        assert await conn.fetchval("SELECT 1") == 1  # the connection is usable again
    assert await db.fetchval("SELECT count(*) FROM notes") == 0


async def test_a_transaction_nested_in_one_begun_by_hand_is_a_savepoint(db, account):
    async with connection(db) as conn:
        async with transaction(conn, wait_for_disk=False):
            await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'outer')", account.id)
            with pytest.raises(LookupError):
                async with transaction(conn):  # e.g. a booking helper an applier calls
                    await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'inner, undone')", account.id)
                    raise LookupError
            async with transaction(conn) as inner:
                await inner.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'inner, kept')", account.id)
    bodies = {r["body"] for r in await db.fetch("SELECT body FROM notes")}
    assert bodies == {"outer", "inner, kept"}
