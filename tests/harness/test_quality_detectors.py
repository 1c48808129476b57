"""Shadow detectors: they record and change nothing; the judge's grades give their precision; at
20 judged firings they are deleted below 40 % or promotable at 70 %; a four-week trial ends; a
promoted fix changes the reply, and a broken one lets the original reply through."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import InvalidInput
from core.quality import detectors
from core.quality.detectors import (
    DETECTORS,
    Detector,
    TurnView,
    detector_statuses,
    ensure_detectors,
    promote,
    review_detectors,
    run_detectors,
)
from core.testing.scripted import calls, reply
from gateway import cli, cli_quality
from text_loop import run_turn

REPEATING = "Your train leaves at nine tomorrow. Your train leaves at nine tomorrow. Safe trip!"


async def _graded_firings(db, account, detector, *, firings, true):
    """``firings`` turns the detector fired on, ``true`` of them graded failing on its point."""
    conversation = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
    turns = await db.fetch(
        "INSERT INTO turns (conversation_id, channel, status, reply) SELECT $1, 'web', 'delivered', 'x'"
        " FROM generate_series(1, $2) RETURNING id",
        conversation,
        firings,
    )
    point = DETECTORS[detector].point
    for n, row in enumerate(turns):
        await db.execute(
            "INSERT INTO detector_firings (detector, turn_id, account_id) VALUES ($1, $2, $3)",
            detector,
            row["id"],
            account.id,
        )
        await db.execute(
            "INSERT INTO quality_grades (turn_id, point, grade, reason, account_id) VALUES ($1, $2, $3, 'r', $4)",
            row["id"],
            point,
            "fail" if n < true else "pass",
            account.id,
        )


async def _conversation(deps, models, account):
    models.script(reply("Hello."))
    await run_turn(deps, account.id, "web", "hi")


async def test_precision_decides_deleted_promotable_and_the_trial_limit(db, db_url, deps, models, account, monkeypatch):
    await _conversation(deps, models, account)
    now = datetime.now(UTC)
    await ensure_detectors(db, now)
    await _graded_firings(db, account, "repeats", firings=19, true=6)
    await _graded_firings(db, account, "nothing-found", firings=19, true=16)
    assert await review_detectors(db, now) == {}  # 19 judged firings decide nothing yet
    await _graded_firings(db, account, "repeats", firings=1, true=1)  # 7 of 20: 35 %
    await _graded_firings(db, account, "nothing-found", firings=1, true=0)  # 16 of 20: 80 %
    await db.execute(
        "UPDATE quality_detectors SET trial_started_at = $1 WHERE name = 'required-step'", now - timedelta(weeks=5)
    )
    assert await review_detectors(db, now) == {
        "repeats": "deleted", "nothing-found": "promotable", "required-step": "ended"
    }  # fmt: skip
    statuses = {s.name: s for s in await detector_statuses(db)}
    assert statuses["repeats"].precision == pytest.approx(0.35)
    assert statuses["nothing-found"].precision == pytest.approx(0.80)
    assert statuses["claimed-write"].state == "shadow"

    # The owner promotes with one command; a deleted or shadow detector cannot be promoted.
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(cli_quality, "clock", lambda: now)
    lines: list[str] = []
    assert await cli._run(cli._parser().parse_args(["detectors", "promote", "nothing-found"]), lines.append) == 0
    assert lines == ["detector nothing-found promoted: it now applies its fix to replies"]
    for name in ("repeats", "claimed-write"):
        with pytest.raises(InvalidInput, match="only a promotable one"):
            await promote(db, name, now)
    lines.clear()
    assert await cli._run(cli._parser().parse_args(["detectors", "list"]), lines.append) == 0
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["nothing-found"][1:6] == ["grounding", "promoted", "20", "20", "80%"]
    assert rows["repeats"][1:6] == ["tone", "deleted", "20", "20", "35%"]
    assert rows["required-step"][1:3] == ["completeness", "ended"]
    assert rows["claimed-write"][1:6] == ["honesty", "shadow", "0", "0", "-"]
    # A promoted fix whose precision later falls below 40 % is deleted too.
    await _graded_firings(db, account, "nothing-found", firings=30, true=0)
    assert await review_detectors(db, now) == {"nothing-found": "deleted"}


async def test_a_shadow_detector_records_and_changes_nothing(db, deps, models, account):
    models.script(reply(REPEATING))
    outcome = await run_turn(deps, account.id, "web", "when is my train?")
    assert outcome.reply == REPEATING
    firing = await db.fetchrow("SELECT * FROM detector_firings WHERE turn_id = $1", outcome.turn_id)
    assert firing["detector"] == "repeats" and not firing["applied"]
    assert json.loads(firing["detail"]) == {"repeated": "Your train leaves at nine tomorrow."}
    # A claim of a write with no write behind it fires the claimed-write detector, in shadow.
    models.script(reply("Done: I've saved that to your notes."))
    claimed = await run_turn(deps, account.id, "web", "save that")
    assert claimed.reply == "Done: I've saved that to your notes."
    assert await db.fetchval("SELECT detector FROM detector_firings WHERE turn_id = $1", claimed.turn_id) == (
        "claimed-write"
    )
    # A write that was made does not fire it.
    models.script(calls(("add_note", {"text": "x"})), reply("I've saved that to your notes."))
    saved = await run_turn(deps, account.id, "web", "save x")
    assert await db.fetchval("SELECT count(*) FROM detector_firings WHERE turn_id = $1", saved.turn_id) == 0


async def test_a_promoted_fix_changes_the_reply_and_a_broken_one_lets_it_through(
    db, deps, models, account, monkeypatch
):
    await ensure_detectors(db, datetime.now(UTC))
    await db.execute("UPDATE quality_detectors SET state = 'promoted' WHERE name = 'repeats'")
    detectors._CACHE.clear()
    models.script(reply(REPEATING))
    fixed = await run_turn(deps, account.id, "web", "when is my train?")
    assert fixed.reply == "Your train leaves at nine tomorrow. Safe trip!"
    assert await db.fetchval("SELECT reply FROM turns WHERE id = $1", fixed.turn_id) == fixed.reply
    assert await db.fetchval("SELECT applied FROM detector_firings WHERE turn_id = $1", fixed.turn_id)

    def broken(reply_text, detail):
        raise RuntimeError("the fix is broken")

    original = DETECTORS["repeats"]
    monkeypatch.setitem(DETECTORS, "repeats", Detector("repeats", original.point, original.fires, broken))
    models.script(reply(REPEATING))
    through = await run_turn(deps, account.id, "web", "when is my train?")
    assert through.reply == REPEATING  # fail open: the original reply goes out
    firing = await db.fetchrow("SELECT applied, error FROM detector_firings WHERE turn_id = $1", through.turn_id)
    assert (firing["applied"], firing["error"]) == (False, "RuntimeError")

    # A detector that itself raises changes nothing either, and the others still run.
    def crashing(view):
        raise ValueError("bad detector")

    monkeypatch.setitem(DETECTORS, "repeats", Detector("repeats", original.point, crashing, broken))
    result = run_detectors(TurnView("Done: I've saved it."), {"repeats": "promoted"})
    assert result.reply == "Done: I've saved it." and [f["detector"] for f in result.firings] == ["claimed-write"]


def test_deleted_and_ended_detectors_no_longer_run():
    view = TurnView(REPEATING)
    assert [f["detector"] for f in run_detectors(view, {}).firings] == ["repeats"]
    assert run_detectors(view, {"repeats": "deleted"}).firings == []
    assert run_detectors(view, {"repeats": "ended"}).firings == []


def test_nothing_found_fires_only_after_a_failed_lookup():
    failed = [{"name": "search_notes", "status": "failed", "writes": False}]
    ok = [{"name": "search_notes", "status": "ok", "writes": False}]
    said = "I couldn't find any notes about that."
    assert DETECTORS["nothing-found"].fires(TurnView(said, failed)) == {
        "failed": ["search_notes"],
        "said": "couldn't find",
    }
    assert DETECTORS["nothing-found"].fires(TurnView(said, ok)) is None
    assert DETECTORS["nothing-found"].fires(TurnView("Here it is.", failed)) is None


async def test_pepper_turns_list_flags_a_firing_and_a_failing_grade(db, db_url, deps, models, account, monkeypatch):
    models.script(reply(REPEATING))
    outcome = await run_turn(deps, account.id, "web", "when is my train?")
    await db.execute(
        "INSERT INTO quality_grades (turn_id, point, grade, reason, account_id) VALUES ($1, 'tone', 'fail', 'r', $2)",
        outcome.turn_id,
        account.id,
    )
    monkeypatch.setenv("DATABASE_URL", db_url)
    lines: list[str] = []
    assert await cli._run(cli._parser().parse_args(["turns", "list", "--flagged"]), lines.append) == 0
    (line,) = [x for x in lines if str(outcome.turn_id)[:8] in x or str(outcome.turn_id) in x]
    assert "judged-failing" in line and "detector:repeats" in line
