"""The nightly jobs through the real router and adapter against a loopback peer: summaries from
records (never from other summaries), stable offsets, the background tier, retries, no half-writes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from uuid import UUID

from memory_kit import NOW, say, sent_text, summary, turn

from core.memory import MemoryConfig, memory_jobs_tick, run_nightly_summaries
from core.memory.jobs import claim_jobs, enqueue_due
from core.memory.periods import due_at, person_offset
from core.testing.peers import fault, reply_text

CONFIG = MemoryConfig()


async def test_a_daily_summary_is_built_from_the_records_on_the_background_tier(db, ada, peer_router) -> None:
    peer, router = peer_router
    t = datetime(2025, 6, 3, 7, 0, tzinfo=UTC)  # Tuesday 3 June, 09:00 in Paris
    live = await turn(db, ada.id, t, calls=[{"name": "add_todo", "arguments": {"title": "call the plumber"},
                                             "status": "ok", "content": "todo added"}])  # fmt: skip
    await say(db, ada.id, t, "Remind me to call the plumber", channel="email", turn_id=live)
    await say(db, ada.id, t + timedelta(minutes=1), "Added.", inbound=False, turn_id=live)
    await turn(db, ada.id, t + timedelta(hours=2), kind="scheduled", reply="Brief: rain at noon, take an umbrella.")
    # Another summary that exists already must never feed this one.
    await summary(db, ada.id, "day", date(2025, 6, 2), "SENTINEL-OLD-SUMMARY")
    peer.script(reply_text("Ada asked to be reminded to call the plumber; Pepper added a todo."))

    report = await run_nightly_summaries(db, router, NOW, config=CONFIG)

    assert report.outcomes["written"] == 1
    (request,) = peer.requests
    text = sent_text(request)
    assert "Remind me to call the plumber" in text and "add_todo" in text
    assert "rain at noon" in text  # a scheduled run is remembered through its summary
    assert "SENTINEL-OLD-SUMMARY" not in text
    assert request.body["service_tier"] == "flex"  # the background tier
    row = await db.fetchrow("SELECT * FROM memory_summaries WHERE account_id = $1 AND period = 'day'"
                            " AND starts_on = '2025-06-03'", ada.id)  # fmt: skip
    assert row["body"].startswith("Ada asked") and row["messages"] == 2 and row["turns"] == 2
    assert row["covers_from"] == datetime(2025, 6, 2, 22, 0, tzinfo=UTC)  # Paris midnight
    # Run again: nothing is due, nothing is written twice.
    again = await run_nightly_summaries(db, router, NOW, config=CONFIG)
    assert again.claimed == 0 and len(peer.requests) == 1


async def test_weekly_and_monthly_summaries_read_records_never_summaries(db, ada, peer_router) -> None:
    peer, router = peer_router
    # Activity on Wednesday 28 May and Friday 30 May; the week (26 May to 1 June) and May are over.
    await say(db, ada.id, datetime(2025, 5, 28, 9, tzinfo=UTC), "My sister Bea arrives on Friday")
    await say(db, ada.id, datetime(2025, 5, 30, 9, tzinfo=UTC), "Bea has landed", channel="whatsapp")
    await summary(db, ada.id, "day", date(2025, 5, 28), "SENTINEL-DAY-SUMMARY")
    peer.script(*(reply_text(f"summary {n}") for n in range(4)))

    await run_nightly_summaries(db, router, NOW, config=CONFIG)

    periods = {r["period"]: r["starts_on"] for r in await db.fetch(
        "SELECT period, starts_on FROM memory_summaries WHERE body LIKE 'summary %'")}  # fmt: skip
    assert periods == {"day": date(2025, 5, 30), "week": date(2025, 5, 26), "month": date(2025, 5, 1)}
    texts = [sent_text(r) for r in peer.requests]
    weekly = next(t for t in texts if "Summarise Week of 26 May" in t)
    monthly = next(t for t in texts if "Summarise May 2025" in t)
    for text in (weekly, monthly):
        assert "My sister Bea arrives on Friday" in text and "Bea has landed" in text
        assert "SENTINEL-DAY-SUMMARY" not in text


async def test_people_start_at_stable_offsets_within_the_hour(db, ada, peer_router) -> None:
    peer, router = peer_router
    # Fixed ids, not the fixtures' random ones: two random people share a second of
    # the hour one time in 3600, which must not fail the suite.
    offsets = [person_offset(UUID(int=n)) for n in range(200)]
    assert all(timedelta(0) <= o < timedelta(hours=1) for o in offsets)
    assert len(set(offsets)) >= 180
    assert {o // timedelta(minutes=15) for o in offsets} == {0, 1, 2, 3}
    assert person_offset(ada.id) == person_offset(ada.id)
    await say(db, ada.id, datetime(2025, 6, 3, 9, tzinfo=UTC), "hello")
    due = due_at("day", date(2025, 6, 3), "Europe/Paris", ada.id, CONFIG.nightly_hour)
    assert due == datetime(2025, 6, 4, 3, 0, tzinfo=due.tzinfo) + person_offset(ada.id)
    peer.script(reply_text("A greeting."))
    early = await run_nightly_summaries(db, router, due - timedelta(seconds=1), config=CONFIG)
    assert early.claimed == 0 and not peer.requests
    on_time = await run_nightly_summaries(db, router, due, config=CONFIG)
    assert on_time.outcomes["written"] == 1


async def test_a_failed_job_writes_nothing_and_is_retried_later(db, ada, peer_router) -> None:
    peer, router = peer_router
    await say(db, ada.id, datetime(2025, 6, 3, 9, tzinfo=UTC), "Book the dentist")
    # Busy on the background tier and then on the standard tier: the job fails.
    peer.script(fault(503), fault(503))
    first = await run_nightly_summaries(db, router, NOW, config=CONFIG)
    assert first.outcomes["failed"] == 1
    assert await db.fetchval("SELECT count(*) FROM memory_summaries") == 0
    job = await db.fetchrow("SELECT * FROM memory_jobs WHERE kind = 'day'")
    assert (job["status"], job["attempts"], job["last_error"]) == ("failed", 1, "ModelTransientError")
    assert job["due_at"] == NOW + CONFIG.job_retry_base
    # Not before the retry time; then it succeeds (an empty reply also counts as a failure).
    assert (await run_nightly_summaries(db, router, NOW + timedelta(minutes=1), config=CONFIG)).claimed == 0
    peer.script(reply_text(""), reply_text("Ada wants a dentist appointment."))
    second = await run_nightly_summaries(db, router, NOW + CONFIG.job_retry_base, config=CONFIG)
    assert second.outcomes["failed"] == 1
    third = await run_nightly_summaries(db, router, NOW + timedelta(hours=1), config=CONFIG)
    assert third.outcomes["written"] == 1
    job = await db.fetchrow("SELECT * FROM memory_jobs WHERE kind = 'day'")
    assert (job["status"], job["attempts"], job["outcome"]) == ("done", 3, "written")
    assert await db.fetchval("SELECT count(*) FROM memory_summaries") == 1


async def test_leases_keep_two_workers_off_the_same_job(db, ada) -> None:
    for day in range(1, 4):
        await say(db, ada.id, datetime(2025, 6, day, 9, tzinfo=UTC), f"day {day}")
    assert await enqueue_due(db, NOW, config=CONFIG) >= 3
    first = await claim_jobs(db, NOW + timedelta(hours=1), config=CONFIG, limit=2)
    second = await claim_jobs(db, NOW + timedelta(hours=1), config=CONFIG, limit=50)
    assert {(j.kind, j.period_start) for j in first}.isdisjoint({(j.kind, j.period_start) for j in second})
    # A lease that lapses (its process died) is claimed again.
    later = await claim_jobs(db, NOW + timedelta(hours=1) + CONFIG.job_lease + timedelta(seconds=1),
                             config=CONFIG, limit=50)  # fmt: skip
    assert len(later) == len(first) + len(second)


async def test_the_tick_also_indexes_new_messages(db, ada, peer_router) -> None:
    peer, router = peer_router
    await say(db, ada.id, NOW - timedelta(minutes=5), "The spare key is under the blue flowerpot")
    report = await memory_jobs_tick(db, router, NOW, config=CONFIG)
    assert report.index is not None and report.index.finished and report.index.added == 1
    assert not peer.requests  # nothing finished yet to summarise


async def test_the_worker_ticks_in_a_named_task_and_stops(db, ada, peer_router) -> None:
    import asyncio

    from core.memory.worker import MemoryWorker

    _peer, router = peer_router
    await say(db, ada.id, NOW - timedelta(minutes=5), "The spare key is under the blue flowerpot")
    worker = MemoryWorker(db, router, interval=0.01, clock=lambda: NOW)
    worker.start()
    assert any(t.get_name() == "pepper-memory-jobs" for t in asyncio.all_tasks())
    for _ in range(500):
        if worker.ticks >= 2:
            break
        await asyncio.sleep(0.02)
    await worker.stop()
    assert worker.ticks >= 2
    assert not any(t.get_name() == "pepper-memory-jobs" for t in asyncio.all_tasks())
    assert await db.fetchval("SELECT count(*) FROM memory_index") == 1
    # The same tick runs the quality judge's round, which reviews the detectors.
    from core.quality.detectors import all_detectors

    shadow = await db.fetchval("SELECT count(*) FROM quality_detectors WHERE state = 'shadow'")
    assert shadow == len(all_detectors())  # the reply detectors and the calendar's


async def test_the_tick_prunes_old_security_events(db, ada, peer_router) -> None:
    _peer, router = peer_router
    for age in (timedelta(days=200), timedelta(days=91), timedelta(days=89), timedelta(hours=1)):
        await db.execute(
            "INSERT INTO security_events (kind, detail, created_at) VALUES ('twilio-signature-invalid', '{}', $1)",
            NOW - age,
        )
    await memory_jobs_tick(db, router, NOW, config=CONFIG)
    kept = await db.fetch("SELECT created_at FROM security_events ORDER BY created_at")
    assert [NOW - r["created_at"] for r in kept] == [timedelta(days=89), timedelta(hours=1)]


async def test_the_tick_prunes_verification_attempts_older_than_a_month(db, ada, peer_router) -> None:
    _peer, router = peer_router
    for age in (timedelta(days=31), timedelta(days=29), timedelta(minutes=5)):
        await db.execute(
            "INSERT INTO call_verification_attempts (account_id, source, kind, created_at)"
            " VALUES ($1, '+15550001111', 'pin-wrong', $2)",
            ada.id,
            NOW - age,
        )
    await memory_jobs_tick(db, router, NOW, config=CONFIG)
    kept = await db.fetch("SELECT created_at FROM call_verification_attempts ORDER BY created_at")
    assert [NOW - r["created_at"] for r in kept] == [timedelta(days=29), timedelta(minutes=5)]
