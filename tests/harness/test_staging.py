"""Staged writes: committed when the reply is delivered, dropped when it is not, and the crash rule."""

import json
from datetime import timedelta

from core.conversation import record_outbound
from core.testing.scripted import calls, reply
from core.tools import Tool, ToolOutcome, ToolRegistry, recover_unresolved
from core.tools.starter import starter_registry
from text_loop import deliver, run_turn


async def _todo(db, account, title="call mum"):
    return await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, $2) RETURNING id", account.id, title)


async def _done(db, todo) -> bool:
    return await db.fetchval("SELECT done_at IS NOT NULL FROM todos WHERE id = $1", todo)


async def _staged_turn(deps, models, account, todo, note="Prefers mornings"):
    models.script(
        calls(("complete_todo", {"id": todo}), ("add_dossier_note", {"note": note})),
        reply("Ticked off, and noted."),
    )
    return await run_turn(deps, account.id, "web", "done with that; I prefer mornings")


async def test_staged_writes_wait_for_delivery_then_commit(db, deps, models, account):
    todo = await _todo(db, account)
    outcome = await _staged_turn(deps, models, account, todo)
    assert outcome.staged_writes == 2
    assert not await _done(db, todo)
    assert await db.fetchval("SELECT count(*) FROM dossier_notes") == 0

    writes = await deliver(deps, outcome.turn_id, True, detail={"provider_status": "delivered"})
    assert [w.status for w in writes] == ["committed", "committed"]
    assert await _done(db, todo)
    assert await db.fetchval("SELECT body FROM dossier_notes") == "Prefers mornings"
    row = await db.fetchrow(
        "SELECT status, delivered_at, committed_writes, delivery FROM turns WHERE id = $1", outcome.turn_id
    )
    assert row["status"] == "delivered" and row["delivered_at"] is not None
    assert [w["tool"] for w in json.loads(row["committed_writes"])] == ["complete_todo", "add_dossier_note"]
    assert json.loads(row["delivery"]) == {"ok": True, "provider_status": "delivered"}
    # The next turn's prompt carries the new dossier note.
    models.script(reply("Morning it is."))
    await run_turn(deps, account.id, "web", "when should we meet?")
    assert "Prefers mornings" in models.prompts[-1].system_stable


async def test_a_failed_delivery_drops_every_staged_write(db, deps, models, account):
    todo = await _todo(db, account)
    outcome = await _staged_turn(deps, models, account, todo)
    writes = await deliver(deps, outcome.turn_id, False)
    assert [w.status for w in writes] == ["dropped", "dropped"]
    assert not await _done(db, todo)
    assert await db.fetchval("SELECT count(*) FROM dossier_notes") == 0
    assert await db.fetchval("SELECT status FROM turns WHERE id = $1", outcome.turn_id) == "failed"
    # Resolution happens once: a late success report commits nothing.
    assert await deliver(deps, outcome.turn_id, True) == []
    assert not await _done(db, todo)


async def test_an_unstaged_write_happens_at_once(db, deps, models, account):
    models.script(calls(("add_todo", {"title": "water plants"})), reply("Added."))
    outcome = await run_turn(deps, account.id, "web", "todo: water plants")
    assert await db.fetchval("SELECT title FROM todos") == "water plants"
    assert outcome.staged_writes == 0


async def test_a_write_whose_apply_fails_is_marked_and_the_others_commit(db, deps, models, account):
    async def plan(ctx, args):
        return ToolOutcome.planned({}, "flaky thing done")

    async def explode(conn, account_id, payload):
        await conn.execute("SELECT 1/0")

    flaky = Tool(
        "flaky", "Flaky write.", {"type": "object"}, plan, area="test", writes=True, staged=True, apply=explode
    )
    deps.registry = ToolRegistry([*starter_registry().all(), flaky])
    todo = await _todo(db, account)
    models.script(calls(("flaky", {}), ("complete_todo", {"id": todo})), reply("Done both."))
    outcome = await run_turn(deps, account.id, "web", "do both")
    writes = await deliver(deps, outcome.turn_id, True)
    assert [(w.tool, w.status) for w in writes] == [("flaky", "failed"), ("complete_todo", "committed")]
    assert await _done(db, todo)


async def test_after_a_crash_writes_commit_only_where_delivery_is_on_record(db, deps, models, account):
    """The crash rule: delivered on record -> commit; no delivery on record -> drop; young turns wait."""
    delivered_todo, lost_todo, young_todo = (
        await _todo(db, account, "a"),
        await _todo(db, account, "b"),
        await _todo(db, account, "c"),
    )
    delivered = await _staged_turn(deps, models, account, delivered_todo, "note a")
    lost = await _staged_turn(deps, models, account, lost_todo, "note b")
    young = await _staged_turn(deps, models, account, young_todo, "note c")
    # The gateway sent the first reply and the provider's report arrived; then the process died.
    conversation = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
    message = await record_outbound(db, conversation, "sms", "Ticked off.", turn_id=delivered.turn_id)
    await db.execute("UPDATE messages SET delivery_status = 'delivered' WHERE id = $1", message.id)
    await db.execute(
        "UPDATE turns SET started_at = now() - interval '1 hour' WHERE id = ANY($1::uuid[])",
        [delivered.turn_id, lost.turn_id],
    )

    counts = await recover_unresolved(db, deps.registry, grace=timedelta(minutes=10))
    assert counts == {"committed": 2, "dropped": 2, "failed": 0}
    assert await _done(db, delivered_todo) and not await _done(db, lost_todo) and not await _done(db, young_todo)
    assert [r["body"] for r in await db.fetch("SELECT body FROM dossier_notes")] == ["note a"]
    assert (
        await db.fetchval("SELECT count(*) FROM staged_writes WHERE turn_id = $1 AND status = 'staged'", young.turn_id)
        == 2
    )
    # A long reply whose first part went out before the crash, the second not: not delivered.
    half_todo = await _todo(db, account, "d")
    half = await _staged_turn(deps, models, account, half_todo, "note d")
    for status in ("sent", "sending"):
        await record_outbound(db, conversation, "sms", "part", turn_id=half.turn_id, delivery_status=status)
    await db.execute("UPDATE turns SET started_at = now() - interval '1 hour' WHERE id = $1", half.turn_id)
    assert await recover_unresolved(db, deps.registry, grace=timedelta(minutes=10)) == {
        "committed": 0,
        "dropped": 2,
        "failed": 0,
    }
    assert not await _done(db, half_todo)
    # Running it again changes nothing.
    assert await recover_unresolved(db, deps.registry, grace=timedelta(minutes=10)) == {
        "committed": 0,
        "dropped": 0,
        "failed": 0,
    }
