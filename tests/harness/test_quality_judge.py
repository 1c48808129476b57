"""The nightly judge against a scripted grading model: grades per point, quality issues with a
replay case that fails on the current build, refused answers, no double grading, the CLI."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import InvalidInput
from core.quality.jobs import QualityConfig, claim_judging, enqueue_judging, judge_now, quality_tick
from core.quality.judge import POINTS, JudgeReport, MalformedGrades, judge_day, judge_turns, parse_grades
from core.testing.scripted import ScriptedModels, calls, reply
from core.untrusted import JUDGED_TURN_LABEL
from gateway import cli, cli_quality
from text_loop import deliver, run_turn

CLAIM = "Done: I noted the gift idea for mum."


def grades(**failing: str) -> str:
    out = {p: {"grade": "fail" if p in failing else "pass", "reason": failing.get(p, "fine")} for p in POINTS}
    return json.dumps({"grades": out, "fixes": {p: f"fix {p}" for p in failing}})


async def _dropped_write_turn(db, deps, models, account, text="note a gift idea for mum"):
    """A turn that staged a note and claimed it, whose reply never reached the person: dropped."""
    models.script(calls(("add_dossier_note", {"note": "gift idea for mum"})), reply(CLAIM))
    outcome = await run_turn(deps, account.id, "web", text)
    await deliver(deps, outcome.turn_id, False)
    day = await db.fetchval(
        "SELECT (started_at AT TIME ZONE 'Europe/Paris')::date FROM turns WHERE id = $1", outcome.turn_id
    )
    return outcome, day


async def test_a_claimed_write_that_was_dropped_fails_honesty_and_opens_an_issue(
    db, db_url, deps, models, account, monkeypatch, tmp_path
):
    outcome, day = await _dropped_write_turn(db, deps, models, account)
    assert await db.fetchval("SELECT status FROM staged_writes WHERE turn_id = $1", outcome.turn_id) == "dropped"
    judge = ScriptedModels([reply(grades(honesty="Claims the note was saved; the write was dropped."), model="judge")])
    now = datetime.now(UTC)
    report = await judge_day(db, judge, account.id, day, now)

    assert (report.graded, report.refused, report.failing) == (1, 0, {"honesty": 1})
    asked = judge.received[0]
    assert asked.background and asked.tier == "small"
    # The judged turn reaches the judge only inside the labelled untrusted block.
    (message,) = asked.prompt.messages
    assert message.content.startswith(f"[{JUDGED_TURN_LABEL}]") and message.content.endswith("[end of recorded turn]")
    assert f'reply: "{CLAIM}"' in message.content and CLAIM not in asked.prompt.system_stable
    assert 'write: "add_dossier_note' in message.content and "-> dropped" in message.content
    stored = await db.fetch("SELECT point, grade, reason, model, judge_model FROM quality_grades ORDER BY point")
    assert len(stored) == 7 and {r["judge_model"] for r in stored} == {"judge"}
    honesty = next(r for r in stored if r["point"] == "honesty")
    assert (honesty["grade"], honesty["reason"]) == ("fail", "Claims the note was saved; the write was dropped.")
    issue = await db.fetchrow("SELECT * FROM quality_issues")
    assert (issue["turn_id"], issue["point"], issue["proposed_fix"], issue["status"]) == (
        outcome.turn_id, "honesty", "fix honesty", "open"
    )  # fmt: skip

    # The issue's replay case, run on the current build, fails: the model still claims the write.
    monkeypatch.setenv("DATABASE_URL", db_url)
    lines: list[str] = []
    case_file = tmp_path / "case.json"
    args = cli._parser().parse_args(["quality", "issues", "--case", str(issue["id"]), "--out", str(case_file)])
    assert await cli._run(args, lines.append) == 0
    case = json.loads(case_file.read_text())
    assert (case["turn_id"], case["point"], case["check"], case["writes_committed"]) == (
        str(outcome.turn_id), "honesty", "claimed-write", False
    )  # fmt: skip
    replayed = ScriptedModels([calls(("add_dossier_note", {"note": "gift idea for mum"})), reply(CLAIM)])
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: replayed)
    lines.clear()
    assert await cli._run(cli._parser().parse_args(["replay", "--case", str(case_file)]), lines.append) == 1
    assert lines[-1].startswith("case fails on honesty: claimed-write")
    # A fixed build (the reply no longer claims it) passes the same case.
    replayed.script(calls(("add_dossier_note", {"note": "gift idea for mum"})), reply("I'll note it once you confirm."))
    lines.clear()
    assert await cli._run(cli._parser().parse_args(["replay", "--case", str(case_file)]), lines.append) == 0
    assert lines[-1] == "case passes: the replay no longer fails on honesty"
    assert await db.fetchval("SELECT count(*) FROM dossier_notes") == 0  # a replay never runs a write

    # Re-running the same night grades nothing twice and never asks the model again.
    again = await judge_day(db, judge, account.id, day, now)
    assert (again.graded, again.already, len(judge.received)) == (0, 1, 1)
    assert await db.fetchval("SELECT count(*) FROM quality_grades") == 7
    assert await db.fetchval("SELECT count(*) FROM quality_issues") == 1


GARBAGE = [
    "not json at all",
    "[1, 2]",
    json.dumps({"grades": {"honesty": {"grade": "fail", "reason": "x"}}}),  # six points missing
    grades().replace('"pass"', '"maybe"', 1),  # an unknown grade
    json.dumps({"grades": {p: {"grade": "pass", "reason": "two\nlines"} for p in POINTS}}),
    json.dumps({"grades": {p: {"grade": "pass", "reason": "x" * 500} for p in POINTS}}),
    json.dumps({"grades": {p: {"grade": "pass", "reason": "ok \x1b[2J"} for p in POINTS}}),  # a terminal escape
    json.dumps({"grades": {p: {"grade": "pass", "reason": "ok"} for p in POINTS}, "fixes": {"tone": "a\u202eb"}}),
    json.dumps({"grades": {**{p: {"grade": "pass", "reason": "ok"} for p in POINTS}, "extra": {}}}),
    json.dumps({"grades": {p: {"grade": "pass", "reason": "ok"} for p in POINTS}, "fixes": {"nope": "x"}}),
]


@pytest.mark.parametrize("answer", GARBAGE)
def test_malformed_grades_are_refused(answer):
    with pytest.raises(MalformedGrades):
        parse_grades(answer)


async def test_a_refused_answer_stores_nothing_and_the_next_run_grades_the_turn(db, deps, models, account):
    _outcome, day = await _dropped_write_turn(db, deps, models, account)
    judge = ScriptedModels([reply(g) for g in GARBAGE[:3]])
    now = datetime.now(UTC)
    for _ in range(3):
        report = await judge_day(db, judge, account.id, day, now)
        assert (report.graded, report.refused) == (0, 1)
    assert await db.fetchval("SELECT count(*) FROM quality_grades") == 0
    assert await db.fetchval("SELECT count(*) FROM quality_issues") == 0
    judge.script(reply(grades()))
    assert (await judge_day(db, judge, account.id, day, now)).graded == 1
    assert await db.fetchval("SELECT count(*) FROM quality_grades WHERE grade = 'pass'") == 7


async def test_a_failure_matching_a_known_issue_counts_it_again_instead_of_opening_one(db, deps, models, account):
    first, _day = await _dropped_write_turn(db, deps, models, account)
    second, _ = await _dropped_write_turn(db, deps, models, account, text="note another gift idea")
    judge = ScriptedModels(default=reply(grades(honesty="claims a dropped write")))
    now = datetime.now(UTC)
    turns = [first.turn_id, second.turn_id]
    report = JudgeReport()
    await judge_turns(db, judge, turns[:1], now, tier="small", report=report)
    issue = await db.fetchval("SELECT id FROM quality_issues")
    # The second turn's failure goes to the known-issue comparison; a forged id is refused.
    judge.script(reply(grades(honesty="same again")), reply(json.dumps({"matches": {"honesty": issue + 99}})))
    await judge_turns(db, judge, turns[1:], now, tier="small", report=report)
    assert report.refused == 1 and await db.fetchval("SELECT count(*) FROM quality_grades") == 7
    judge.script(reply(grades(honesty="same again")), reply(json.dumps({"matches": {"honesty": issue}})))
    await judge_turns(db, judge, turns[1:], now, tier="small", report=report)
    compared = judge.prompts[-1].messages[0].content
    assert "Known issues:" in compared and f'- issue {issue} (honesty): "claims a dropped write"' in compared
    assert '- honesty: "same again"' in compared
    assert report.seen_again == [issue] and report.opened == [issue]
    assert await db.fetchval("SELECT seen FROM quality_issues WHERE id = $1", issue) == 2
    assert await db.fetchval("SELECT count(*) FROM quality_issues") == 1


async def test_judge_jobs_are_leased_and_spread_over_the_hour(db, deps, models, account):
    _outcome, day = await _dropped_write_turn(db, deps, models, account)
    config = QualityConfig()
    after = datetime.now(UTC) + timedelta(days=1, hours=12)
    assert await enqueue_judging(db, after, config=config) == 1
    assert await enqueue_judging(db, after, config=config) == 0  # one job per person and day
    due = await db.fetchval("SELECT due_at FROM quality_jobs")
    night = (await db.fetchval("SELECT ($1::date + 1)::timestamp AT TIME ZONE 'Europe/Paris'", day)) + timedelta(
        hours=config.judge_hour
    )
    assert night <= due < night + timedelta(hours=1)
    judge = ScriptedModels([reply(grades(honesty="dropped write claimed"))])
    # Two processes: the first holds the lease, the second finds nothing to claim.
    claimed = await claim_judging(db, due, config=config, limit=5)
    assert len(claimed) == 1 and await claim_judging(db, due, config=config, limit=5) == []
    await db.execute("UPDATE quality_jobs SET leased_until = $1", due - timedelta(seconds=1))  # its process died
    report = await quality_tick(db, judge, due, config=config, enqueue=False)
    assert (report.claimed, report.done, report.days[0].graded) == (1, 1, 1)
    row = await db.fetchrow("SELECT status, outcome FROM quality_jobs")
    assert row["status"] == "done" and json.loads(row["outcome"])["failing"] == {"honesty": 1}


async def test_pepper_quality_judge_issues_and_report(db, db_url, deps, models, account, monkeypatch):
    outcome, day = await _dropped_write_turn(db, deps, models, account)
    monkeypatch.setenv("DATABASE_URL", db_url)
    judge = ScriptedModels([reply(grades(honesty="claims a dropped write", tone="too long"), model="judge")])
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: judge)
    lines: list[str] = []
    args = cli._parser().parse_args(["quality", "judge", "--day", day.isoformat(), "--account", "Ada"])
    assert await cli._run(args, lines.append) == 0
    assert lines[0].startswith("judged 1 day(s): 1 turn(s) graded, 0 answer(s) refused")
    assert lines[1] == "failing: honesty 1, tone 1"
    assert lines[2].startswith("opened quality issue(s): ")
    lines.clear()
    assert await cli._run(cli._parser().parse_args(["quality", "judge", "--day", day.isoformat()]), lines.append) == 0
    assert "0 turn(s) graded" in lines[0] and "1 graded before" in lines[0]

    lines.clear()
    assert await cli._run(cli._parser().parse_args(["quality", "issues"]), lines.append) == 0
    assert sum(line.startswith("#") for line in lines) == 2
    assert any("honesty" in line and str(outcome.turn_id) in line for line in lines)
    assert "    why: claims a dropped write" in lines

    lines.clear()
    monkeypatch.setattr(cli_quality, "clock", lambda: datetime.now(UTC))
    assert await cli._run(cli._parser().parse_args(["quality", "report", "--since", "1d"]), lines.append) == 0
    (row,) = [line for line in lines if "scripted-small" in line or "gpt-small" in line]
    assert row.split()[:3] == ["small", row.split()[1], "1"]
    assert "0/1 0%" in row and "1/1 100%" in row

    with pytest.raises(Exception, match="not a day"):
        await cli._run(cli._parser().parse_args(["quality", "judge", "--day", "yesterday"]), lines.append)
    with pytest.raises(Exception, match="no quality issue"):
        await cli._run(cli._parser().parse_args(["quality", "issues", "--case", "999"]), lines.append)


async def test_pepper_replay_batch_replays_the_judges_failing_turns_side_by_side(
    db, db_url, deps, models, account, monkeypatch
):
    outcome, day = await _dropped_write_turn(db, deps, models, account)
    await judge_day(
        db, ScriptedModels([reply(grades(honesty="claims a dropped write"))]), account.id, day, datetime.now(UTC)
    )
    monkeypatch.setenv("DATABASE_URL", db_url)
    both = ScriptedModels(
        [
            calls(("add_dossier_note", {"note": "gift idea for mum"})),
            reply("I'll note it once you confirm.", model="gpt-large"),
            reply(grades(), model="judge"),  # the judge grades the replay
        ]
    )
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: both)
    lines: list[str] = []
    args = cli._parser().parse_args(["replay", "--batch", "--tier", "large", "--since", "2d"])
    assert await cli._run(args, lines.append) == 0
    assert lines[0] == f"turn {outcome.turn_id}: gpt-small -> gpt-large (tier large)"
    assert "before: fails honesty" in lines[1] and "| replay: passes all" in lines[1]
    assert any(line.startswith(CLAIM) and line.endswith("| I'll note it once you confirm.") for line in lines)
    assert lines[-1].split() == [str(outcome.turn_id), "gpt-small", "gpt-large", "fails", "honesty", "passes", "all"]
    assert [r.tier for r in both.received] == ["large", "large", "small"] and both.received[2].background
    assert await db.fetchval("SELECT count(*) FROM quality_grades") == 7  # the replay's grades are shown, not stored
    assert await db.fetchval("SELECT count(*) FROM dossier_notes") == 0
    with pytest.raises(cli.CommandError, match="needs --tier"):
        await cli._run(cli._parser().parse_args(["replay", "--batch"]), lines.append)
    with pytest.raises(cli.CommandError, match="give no turn id"):
        await cli._run(cli._parser().parse_args(["replay", str(outcome.turn_id), "--batch", "--tier", "x"]), print)


async def test_a_failing_judge_run_by_hand_tries_once_and_leaves_the_retry_for_later(db, deps, models, account):
    _outcome, day = await _dropped_write_turn(db, deps, models, account)
    judge = ScriptedModels(default=RuntimeError("model down"))
    report = await judge_now(db, judge, datetime.now(UTC), day=day)
    assert (report.claimed, report.failed, len(judge.received)) == (1, 1, 1)
    row = await db.fetchrow("SELECT status, attempts, last_error, due_at FROM quality_jobs")
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 1, "RuntimeError")
    assert row["due_at"] > datetime.now(UTC)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("not json", "cannot read replay case"),
        ('{"pepper_replay_case": 2, "turn_id": "x"}', "is not a Pepper replay case"),
        ('{"pepper_replay_case": 1, "turn_id": "nope", "point": "honesty", "check": "claimed-write"}', "not a turn id"),
        (
            '{"pepper_replay_case": 1, "turn_id": "00000000-0000-0000-0000-000000000000", "point": "x",'
            ' "check": "judge"}',
            "unknown point or check",
        ),
        (
            '{"pepper_replay_case": 1, "turn_id": "00000000-0000-0000-0000-000000000000", "point": "honesty",'
            ' "check": "rm -rf"}',
            "unknown point or check",
        ),
    ],
)
async def test_pepper_replay_refuses_a_garbage_case_file(db_url, monkeypatch, tmp_path, body, problem):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: ScriptedModels())
    case = tmp_path / "case.json"
    case.write_text(body)
    with pytest.raises(InvalidInput, match=problem):
        await cli._run(cli._parser().parse_args(["replay", "--case", str(case)]), print)
    with pytest.raises(cli.CommandError, match="one of them"):
        await cli._run(cli._parser().parse_args(["replay"]), print)
