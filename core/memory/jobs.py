"""The memory jobs: nightly summaries, the weekly dossier rewrite and indexing, as functions a
scheduler calls.

* :func:`enqueue_due` creates one ``memory_jobs`` row per person, kind and finished period with
  activity (a day, its week and its month; a dossier rewrite per finished week). A row's
  ``due_at`` is the night after the period, at ``nightly_hour`` plus the person's stable offset
  within the hour, so people's jobs do not all call the model at once.
* :func:`run_due_jobs` claims due rows with a lease (``FOR UPDATE SKIP LOCKED``: several
  processes never run one job twice), runs them on the background service tier, and either
  stores the result and marks the job done in one transaction, or records the failure and sets
  the next try after a doubling delay. After ``job_max_attempts`` the job is ``abandoned``.
  A job whose lease ran out (its process died) is claimed again.
* :func:`memory_jobs_tick` does both, then indexes new messages for search; call it every
  minute or so. :func:`run_nightly_summaries` is the same by hand (optionally ignoring the
  offsets), for the CLI and benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from uuid import UUID

from core.memory.config import MemoryConfig
from core.memory.dossier import rewrite_model_half
from core.memory.index import EMBEDDERS, Embedders, IndexProgress, index_pending
from core.memory.periods import PERIODS, Period, due_at, local_date, period_end, period_start
from core.memory.summaries import SummaryResult, draft_summary, store_summary
from core.metrics import metrics
from core.models.errors import ModelNotConfigured
from core.models.types import ModelService
from core.records import call_verification
from core.security import prune_security_events
from core.store.pool import transaction
from core.store.queries import Queries

log = logging.getLogger(__name__)

JOB_KINDS: tuple[str, ...] = ("day", "week", "month", "dossier")
_RANK = {kind: n for n, kind in enumerate(JOB_KINDS)}
DOSSIER_AFTER_WEEK = timedelta(minutes=10)
NOT_CONFIGURED_RETRY = timedelta(hours=1)


@dataclass(frozen=True)
class Job:
    account_id: UUID
    kind: str
    period_start: date
    attempts: int


@dataclass
class JobsReport:
    enqueued: int = 0
    claimed: int = 0
    done: int = 0
    failed: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    people: set[UUID] = field(default_factory=set)
    index: IndexProgress | None = None

    def merge(self, other: JobsReport) -> None:
        self.claimed += other.claimed
        self.done += other.done
        self.failed += other.failed
        for key, n in other.outcomes.items():
            self.outcomes[key] += n
        self.people |= other.people


async def enqueue_due(db: Queries, now: datetime, *, config: MemoryConfig, account_id: UUID | None = None) -> int:
    """Create the job rows for finished periods with activity in the last ``lookback_days``.

    Existing rows are left alone (a period is summarised once). Returns how many were created.
    """
    since = now - timedelta(days=config.lookback_days)
    rows = await db.fetch(
        """
        SELECT a.id AS account_id, a.timezone, (x.at AT TIME ZONE a.timezone)::date AS day
        FROM (
            SELECT conversation_id, created_at AS at FROM messages WHERE created_at >= $1 AND created_at < $2
            UNION ALL
            SELECT conversation_id, started_at FROM turns
            WHERE started_at >= $1 AND started_at < $2 AND kind <> 'replay'
        ) x
        JOIN conversations c ON c.id = x.conversation_id
        JOIN accounts a ON a.id = c.account_id
        WHERE $3::uuid IS NULL OR a.id = $3
        GROUP BY 1, 2, 3
        """,
        since,
        now,
        account_id,
    )
    wanted: dict[tuple[UUID, str, date], datetime] = {}
    for r in rows:
        person, timezone, day = r["account_id"], r["timezone"], r["day"]
        today = local_date(now, timezone)
        for period in PERIODS:
            start = period_start(period, day)
            if period_end(period, start) <= today:
                wanted[(person, period, start)] = due_at(period, start, timezone, person, config.nightly_hour)
        week = period_start("week", day)
        if period_end("week", week) <= today:
            wanted[(person, "dossier", week)] = (
                due_at("week", week, timezone, person, config.nightly_hour) + DOSSIER_AFTER_WEEK
            )
    if not wanted:
        return 0
    people, kinds, starts, dues = zip(*((k[0], k[1], k[2], v) for k, v in wanted.items()), strict=True)
    created = await db.fetchval(
        """
        WITH added AS (
            INSERT INTO memory_jobs (account_id, kind, period_start, due_at)
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::date[], $4::timestamptz[])
            ON CONFLICT DO NOTHING RETURNING 1
        ) SELECT count(*) FROM added
        """,
        list(people),
        list(kinds),
        list(starts),
        list(dues),
    )
    if created:
        metrics().memory_jobs_enqueued.inc(int(created))
    return int(created)


async def claim_jobs(
    db: Queries, now: datetime, *, config: MemoryConfig, limit: int, ignore_due: bool = False,
    account_id: UUID | None = None,
) -> list[Job]:  # fmt: skip
    """Lease up to ``limit`` due jobs (pending, failed and due for a retry, or with a lapsed lease)."""
    rows = await db.fetch(
        """
        UPDATE memory_jobs j SET status = 'running', attempts = j.attempts + 1, leased_until = $2
        FROM (
            SELECT account_id, kind, period_start FROM memory_jobs
            WHERE (due_at <= $1 OR $4)
              AND (status IN ('pending', 'failed') OR (status = 'running' AND leased_until < $1))
              AND ($5::uuid IS NULL OR account_id = $5)
            ORDER BY due_at LIMIT $3
            FOR UPDATE SKIP LOCKED
        ) d
        WHERE j.account_id = d.account_id AND j.kind = d.kind AND j.period_start = d.period_start
        RETURNING j.account_id, j.kind, j.period_start, j.attempts
        """,
        now,
        now + config.job_lease,
        limit,
        ignore_due,
        account_id,
    )
    return [Job(r["account_id"], r["kind"], r["period_start"], r["attempts"]) for r in rows]


async def _finish(conn: Queries, job: Job, outcome: str, now: datetime) -> None:
    await conn.execute(
        "UPDATE memory_jobs SET status = 'done', outcome = $4, finished_at = $5, leased_until = NULL, last_error = NULL"
        " WHERE account_id = $1 AND kind = $2 AND period_start = $3",
        job.account_id,
        job.kind,
        job.period_start,
        outcome,
        now,
    )


def retry_delay(attempts: int, config: MemoryConfig) -> timedelta:
    """The pause before try ``attempts + 1``: the base, doubling, capped."""
    return min(config.job_retry_base * (2 ** max(0, attempts - 1)), config.job_retry_max)


async def run_job(db: Queries, models: ModelService, job: Job, now: datetime, *, config: MemoryConfig) -> str:
    """Run one claimed job to the end: ``done`` or ``failed``/``abandoned`` (never half-written)."""
    try:
        if job.kind == "dossier":
            result = await rewrite_model_half(db, models, job.account_id, now, config=config)
            outcome = result.outcome
            async with transaction(db) as conn:
                await _finish(conn, job, outcome, now)
        else:
            period: Period = job.kind  # type: ignore[assignment]
            draft = await draft_summary(db, models, job.account_id, period, job.period_start, config=config)
            async with transaction(db) as conn:
                stored = draft if isinstance(draft, SummaryResult) else await store_summary(conn, draft)
                outcome = stored.outcome
                await _finish(conn, job, outcome, now)
        return outcome
    except ModelNotConfigured:
        # Not the job's fault: wait for a model without using up its tries.
        await db.execute(
            "UPDATE memory_jobs SET status = 'pending', attempts = attempts - 1, due_at = $4, leased_until = NULL,"
            " last_error = 'ModelNotConfigured' WHERE account_id = $1 AND kind = $2 AND period_start = $3",
            job.account_id,
            job.kind,
            job.period_start,
            now + NOT_CONFIGURED_RETRY,
        )
        return "waiting"
    except Exception as exc:  # CancelledError is a BaseException and passes: the lease lapses
        final = job.attempts >= config.job_max_attempts
        log.warning(
            "memory job failed: kind=%s attempt=%s error=%s final=%s", job.kind, job.attempts, type(exc).__name__, final
        )
        await db.execute(
            "UPDATE memory_jobs SET status = $4, due_at = $5, leased_until = NULL, last_error = $6"
            " WHERE account_id = $1 AND kind = $2 AND period_start = $3",
            job.account_id,
            job.kind,
            job.period_start,
            "abandoned" if final else "failed",
            now + retry_delay(job.attempts, config),
            type(exc).__name__,
        )
        return "abandoned" if final else "failed"


async def _run_person(
    db: Queries, models: ModelService, jobs: list[Job], now: datetime, config: MemoryConfig,
    gate: asyncio.Semaphore, report: JobsReport,
) -> None:  # fmt: skip
    async with gate:
        for job in sorted(jobs, key=lambda j: (_RANK[j.kind], j.period_start)):
            outcome = await run_job(db, models, job, now, config=config)
            metrics().memory_jobs.labels(job.kind, outcome).inc()
            report.outcomes[outcome] += 1
            if outcome in ("failed", "abandoned", "waiting"):
                report.failed += 1
            else:
                report.done += 1
                report.people.add(job.account_id)


async def run_due_jobs(
    db: Queries,
    models: ModelService,
    now: datetime,
    *,
    config: MemoryConfig,
    ignore_due: bool = False,
    account_id: UUID | None = None,
    max_jobs: int | None = None,
) -> JobsReport:
    """Claim and run due jobs until none are left (or ``max_jobs``). People run side by side, up
    to ``job_concurrency``; one person's jobs run in order (days, weeks, months, then the dossier)."""
    report = JobsReport()
    limit = config.job_batch
    while max_jobs is None or report.claimed < max_jobs:
        take = limit if max_jobs is None else min(limit, max_jobs - report.claimed)
        jobs = await claim_jobs(db, now, config=config, limit=take, ignore_due=ignore_due, account_id=account_id)
        if not jobs:
            break
        report.claimed += len(jobs)
        by_person: dict[UUID, list[Job]] = defaultdict(list)
        for job in jobs:
            by_person[job.account_id].append(job)
        gate = asyncio.Semaphore(config.job_concurrency)
        async with asyncio.TaskGroup() as group:
            for n, jobs_of in enumerate(by_person.values()):
                group.create_task(
                    _run_person(db, models, jobs_of, now, config, gate, report), name=f"memory-jobs-person-{n}"
                )
    return report


async def run_nightly_summaries(
    db: Queries,
    models: ModelService,
    now: datetime,
    *,
    config: MemoryConfig | None = None,
    ignore_offsets: bool = False,
    account_id: UUID | None = None,
) -> JobsReport:
    """Enqueue and run every due summary and dossier job now (by hand: ``ignore_offsets`` runs
    finished periods without waiting for each person's slot)."""
    config = config or MemoryConfig()
    enqueued = await enqueue_due(db, now, config=config, account_id=account_id)
    report = await run_due_jobs(db, models, now, config=config, ignore_due=ignore_offsets, account_id=account_id)
    report.enqueued = enqueued
    return report


async def memory_jobs_tick(
    db: Queries,
    models: ModelService,
    now: datetime,
    *,
    config: MemoryConfig | None = None,
    embedders: Embedders = EMBEDDERS,
    index_batches: int = 20,
    enqueue: bool = True,
) -> JobsReport:
    """One round of background memory work: enqueue (unless ``enqueue=False``; once every few
    minutes is plenty), run due jobs, index new messages.

    Meant to be called about once a minute by the scheduler (or :class:`MemoryWorker`). Safe to
    call from several processes at once.
    """
    config = config or MemoryConfig()
    if enqueue:
        report = await run_nightly_summaries(db, models, now, config=config)
        try:  # housekeeping beside the memory work: old refusals and verification attempts go
            await prune_security_events(db, now)
            await call_verification.prune_attempts(db, now)
        except Exception as exc:
            log.warning("pruning old security records failed: error=%s", type(exc).__name__, exc_info=exc)
    else:
        report = await run_due_jobs(db, models, now, config=config)
    try:
        report.index = await index_pending(
            db, embedders=embedders, config=config, now=now, max_batches=index_batches, count=False
        )
    except Exception as exc:
        log.warning("memory indexing failed; it resumes on the next tick: error=%s", type(exc).__name__, exc_info=exc)
    return report
