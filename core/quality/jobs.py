"""The judge's nightly jobs, leased like the memory jobs, and the grades over time.

* :func:`enqueue_judging` creates one ``quality_jobs`` row per person and finished local day with
  real turns, due the night after at ``judge_hour`` plus the person's stable offset within the
  hour (``core.memory.periods.due_at``), so people's grading does not all call the model at once.
* :func:`run_due_judging` claims due rows with a lease (``FOR UPDATE SKIP LOCKED``), runs
  :func:`core.quality.judge.judge_day` on the background service tier, and marks the job done
  with its report, or failed with a doubling delay (``abandoned`` after ``max_attempts``). A job
  whose lease ran out (its process died) is claimed again; the grades' key makes that harmless.
* :func:`quality_tick` does both, then moves each detector to the state its precision gives it.
  ``core.memory.worker.MemoryWorker`` calls it every tick, beside the memory work.
* :func:`grades_report` counts grades per point per model and tier over a period
  (``pepper quality report``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from uuid import UUID

from core.memory.periods import due_at, local_date
from core.models.errors import ModelNotConfigured
from core.models.types import ModelService
from core.quality.detectors import review_detectors
from core.quality.judge import JudgeReport, judge_day
from core.store.queries import Queries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QualityConfig:
    judge_hour: int = 4  # local hour the night's grading starts (after the memory jobs at 3)
    sample: int = 20  # turns graded per person and day
    tier: str = "small"
    lookback_days: int = 3
    lease: timedelta = timedelta(minutes=15)
    max_attempts: int = 4
    retry_base: timedelta = timedelta(minutes=10)
    retry_max: timedelta = timedelta(hours=6)
    batch: int = 20


@dataclass
class JudgingReport:
    enqueued: int = 0
    claimed: int = 0
    done: int = 0
    failed: int = 0
    days: list[JudgeReport] = field(default_factory=list)
    detectors: dict[str, str] = field(default_factory=dict)


async def enqueue_judging(db: Queries, now: datetime, *, config: QualityConfig) -> int:
    """Jobs for finished local days with real turns in the last ``lookback_days``; returns how many."""
    rows = await db.fetch(
        """
        SELECT DISTINCT a.id, a.timezone, (t.started_at AT TIME ZONE a.timezone)::date AS day
        FROM turns t JOIN conversations c ON c.id = t.conversation_id JOIN accounts a ON a.id = c.account_id
        WHERE t.started_at >= $1 AND t.started_at < $2 AND t.kind IN ('live', 'scheduled', 'room')
        """,
        now - timedelta(days=config.lookback_days),
        now,
    )
    wanted = [
        (r["id"], r["day"], due_at("day", r["day"], r["timezone"], r["id"], config.judge_hour))
        for r in rows
        if local_date(now, r["timezone"]) > r["day"]
    ]
    if not wanted:
        return 0
    people, days, dues = (list(x) for x in zip(*wanted, strict=True))
    return int(
        await db.fetchval(
            """
            WITH added AS (
                INSERT INTO quality_jobs (account_id, day, due_at)
                SELECT * FROM unnest($1::uuid[], $2::date[], $3::timestamptz[])
                ON CONFLICT DO NOTHING RETURNING 1
            ) SELECT count(*) FROM added
            """,
            people,
            days,
            dues,
        )
    )


async def claim_judging(
    db: Queries, now: datetime, *, config: QualityConfig, limit: int, ignore_due: bool = False,
    account_id: UUID | None = None, day: date | None = None,
) -> list[tuple[UUID, date, int]]:  # fmt: skip
    rows = await db.fetch(
        """
        UPDATE quality_jobs j SET status = 'running', attempts = j.attempts + 1, leased_until = $2
        FROM (
            SELECT account_id, day FROM quality_jobs
            -- By hand (``$4``) only pending jobs jump the queue: one that failed in this run waits for its retry.
            WHERE (due_at <= $1 OR ($4 AND status = 'pending'))
              AND (status IN ('pending', 'failed') OR (status = 'running' AND leased_until < $1))
              AND ($5::uuid IS NULL OR account_id = $5) AND ($6::date IS NULL OR day = $6)
            ORDER BY due_at LIMIT $3
            FOR UPDATE SKIP LOCKED
        ) d
        WHERE j.account_id = d.account_id AND j.day = d.day
        RETURNING j.account_id, j.day, j.attempts
        """,
        now,
        now + config.lease,
        limit,
        ignore_due,
        account_id,
        day,
    )
    return [(r["account_id"], r["day"], r["attempts"]) for r in rows]


async def run_judging_job(
    db: Queries, models: ModelService, account_id: UUID, day: date, attempts: int, now: datetime, *,
    config: QualityConfig,
) -> JudgeReport | None:  # fmt: skip
    try:
        report = await judge_day(db, models, account_id, day, now, tier=config.tier, sample=config.sample)
    except ModelNotConfigured:
        await db.execute(
            "UPDATE quality_jobs SET status = 'pending', attempts = attempts - 1, due_at = $3, leased_until = NULL,"
            " last_error = 'ModelNotConfigured' WHERE account_id = $1 AND day = $2",
            account_id,
            day,
            now + timedelta(hours=1),
        )
        return None
    except Exception as exc:  # CancelledError passes: the lease lapses and the job is claimed again
        final = attempts >= config.max_attempts
        log.warning("quality judge job failed: attempt=%s error=%s final=%s", attempts, type(exc).__name__, final)
        delay = min(config.retry_base * (2 ** max(0, attempts - 1)), config.retry_max)
        await db.execute(
            "UPDATE quality_jobs SET status = $3, due_at = $4, leased_until = NULL, last_error = $5"
            " WHERE account_id = $1 AND day = $2",
            account_id,
            day,
            "abandoned" if final else "failed",
            now + delay,
            type(exc).__name__,
        )
        return None
    await db.execute(
        "UPDATE quality_jobs SET status = 'done', outcome = $3, finished_at = $4, leased_until = NULL,"
        " last_error = NULL WHERE account_id = $1 AND day = $2",
        account_id,
        day,
        json.dumps(report.as_record()),
        now,
    )
    return report


async def run_due_judging(
    db: Queries, models: ModelService, now: datetime, *, config: QualityConfig, ignore_due: bool = False,
    account_id: UUID | None = None, day: date | None = None,
) -> JudgingReport:  # fmt: skip
    """Claim and run due judge jobs until none are left; one at a time (a background chore)."""
    report = JudgingReport()
    while jobs := await claim_judging(
        db, now, config=config, limit=config.batch, ignore_due=ignore_due, account_id=account_id, day=day
    ):
        report.claimed += len(jobs)
        for person, job_day, attempts in jobs:
            result = await run_judging_job(db, models, person, job_day, attempts, now, config=config)
            if result is None:
                report.failed += 1
            else:
                report.done += 1
                report.days.append(result)
    return report


async def judge_now(
    db: Queries, models: ModelService, now: datetime, *, day: date | None = None, account_id: UUID | None = None,
    config: QualityConfig | None = None,
) -> JudgingReport:  # fmt: skip
    """By hand (``pepper quality judge``): grade ``day`` (default: each person's yesterday) now,
    without waiting for the night's slot. A day judged before is judged again for turns not yet
    graded (a graded turn is never graded twice)."""
    config = config or QualityConfig()
    rows = await db.fetch("SELECT id, timezone FROM accounts WHERE $1::uuid IS NULL OR id = $1", account_id)
    for row in rows:
        wanted = day or local_date(now, row["timezone"]) - timedelta(days=1)
        await db.execute(
            """
            INSERT INTO quality_jobs (account_id, day, due_at) VALUES ($1, $2, $3)
            ON CONFLICT (account_id, day) DO UPDATE SET status = 'pending', due_at = $3, attempts = 0
            WHERE quality_jobs.status IN ('done', 'failed', 'abandoned')
            """,
            row["id"],
            wanted,
            now,
        )
    report = await run_due_judging(db, models, now, config=config, ignore_due=True, account_id=account_id, day=day)
    report.detectors = await review_detectors(db, now)
    return report


async def quality_tick(
    db: Queries, models: ModelService, now: datetime, *, config: QualityConfig | None = None, enqueue: bool = True
) -> JudgingReport:
    """One round of the quality loop: enqueue (every few minutes is plenty), run due jobs, and
    review the detectors. Safe to call from several processes at once."""
    config = config or QualityConfig()
    enqueued = await enqueue_judging(db, now, config=config) if enqueue else 0
    report = await run_due_judging(db, models, now, config=config)
    report.enqueued = enqueued
    if report.done or enqueue:
        report.detectors = await review_detectors(db, now)
    return report


async def grades_report(db: Queries, since: datetime, until: datetime, *, account_id: UUID | None = None) -> list[Any]:
    """Grades per point per model and tier between ``since`` and ``until`` (by grading time), of
    every account or of ``account_id``'s turns."""
    return await db.fetch(
        """
        SELECT coalesce(tier, '-') AS tier, coalesce(model, '-') AS model, point,
               count(*) FILTER (WHERE grade = 'pass') AS passed,
               count(*) FILTER (WHERE grade = 'fail') AS failed,
               count(*) FILTER (WHERE grade = 'n/a') AS not_graded,
               count(DISTINCT turn_id) AS turns
        FROM quality_grades WHERE graded_at >= $1 AND graded_at < $2 AND ($3::uuid IS NULL OR account_id = $3)
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        """,
        since,
        until,
        account_id,
    )


async def judged_failing(
    db: Queries, *, since: datetime, account_id: UUID | None = None, point: str | None = None, limit: int = 20
) -> list[UUID]:
    """Turns the judge failed on some point (or on ``point``) since ``since``, newest first."""
    rows = await db.fetch(
        """
        SELECT g.turn_id, max(t.started_at) AS at FROM quality_grades g JOIN turns t ON t.id = g.turn_id
        WHERE g.grade = 'fail' AND t.started_at >= $1 AND ($2::uuid IS NULL OR g.account_id = $2)
          AND ($3::text IS NULL OR g.point = $3)
        GROUP BY g.turn_id ORDER BY at DESC LIMIT $4
        """,
        since,
        account_id,
        point,
        limit,
    )
    return [r["turn_id"] for r in rows]


async def stored_grades(db: Queries, turn_id: UUID) -> dict[str, str]:
    """The judge's stored grades of one turn, point by point (empty when it was never judged)."""
    rows = await db.fetch("SELECT point, grade FROM quality_grades WHERE turn_id = $1", turn_id)
    return {r["point"]: r["grade"] for r in rows}
