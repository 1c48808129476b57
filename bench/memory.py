"""Memory figures: the memory block for a year of history, search over 100k and 1M messages, and
nightly-job throughput against a loopback model peer.

    PYTHONPATH=. .venv/bin/python bench/memory.py [--sizes 100000,1000000] [--people 200]

1. **Block build**: one person with a year of history (30 messages a day, every day, month/week/
   day summaries as the nightly jobs leave them, 20 messages today). Median and p99 of
   ``build_memory_block`` over 300 builds.
2. **Search**: synthetic messages bulk-loaded with COPY, with synthetic 384-dimension unit
   vectors (clustered, as real embeddings are) in ``memory_index`` and the model's partial HNSW
   index (m=16, ef_construction=64), split over 10 people; every search is scoped to one person
   (each person past ``index_person_min_rows`` also has an HNSW index of their own).
   Median and p99 of the SQL search (``BuiltinMemorySearch.meaning`` with the query vector
   given) and, beside it, end to end with the local ONNX embedder embedding the query text.
   Target: median <= 10 ms at 1M.
3. **Nightly throughput**: N people with a day of 20 messages each; ``run_nightly_summaries``
   through the real router and OpenAI adapter to a loopback peer that answers at once. People
   per minute.

Runs its own embedded Postgres with shared_buffers=2GB, maintenance_work_mem=3GB (for the HNSW
builds), in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np

from core.identity import create_account
from core.memory import MemoryConfig, build_memory_block, run_nightly_summaries
from core.memory.index import (
    EMBEDDERS,
    drop_model_indexes,
    ensure_model_index,
    ensure_person_indexes,
    person_filter,
    vector_sql,
)
from core.memory.periods import local_date, period_end, span
from core.memory.search import BuiltinMemorySearch
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.embeddings import LocalEmbedder
from core.models.router import ModelChoice, ModelRouter, Tier
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import with_database

NOW = datetime(2025, 6, 4, 13, 0, tzinfo=UTC)  # a Wednesday
MODEL_ID = LocalEmbedder.model_id
DIMS = 384
WORDS = (
    "meeting dentist flight train dinner school invoice plumber birthday report garden doctor car "
    "insurance holiday concert football groceries laundry package bank tax passport museum"
).split()


def stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms (n={len(ordered)})"


def start_postgres(root: Path) -> tuple[EmbeddedPostgres, str]:
    pg = EmbeddedPostgres(root)
    pg.start()
    pg.stop()
    with open(pg.pgdata / "postgresql.conf", "a") as conf:
        conf.write(
            "\nshared_buffers = '2GB'\nmaintenance_work_mem = '3GB'\nmax_parallel_maintenance_workers = 1\n"
            "synchronous_commit = off\nwork_mem = '64MB'\n"
        )
    return pg, pg.start()


async def fresh_db(admin_dsn: str, name: str) -> Database:
    import asyncpg

    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    return await Database.open(with_database(admin_dsn, name), max_size=6)


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(6, 18))))


# 1. The memory block ---------------------------------------------------------------------------
async def bench_block(db: Database, builds: int) -> None:
    rng = np.random.default_rng(1)
    account = await create_account(db, "Year", timezone="Europe/Paris")
    conv = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
    tz = account.timezone
    today = local_date(NOW, tz)
    first = today - timedelta(days=365)
    rows = []
    for d in range(366):
        day = first + timedelta(days=d)
        start, _ = span("day", day, tz)
        count = 20 if day == today else 30
        for n in range(count):
            at = start + timedelta(hours=8, minutes=25 * n)
            if at >= NOW:
                break
            rows.append((conv, ("sms", "email", "web")[n % 3], ("inbound", "outbound")[n % 2], sentence(rng), at))
    async with db.pool.acquire() as conn:
        await conn.copy_records_to_table(
            "messages", records=rows, columns=["conversation_id", "channel", "direction", "body", "created_at"]
        )
    summaries = []
    for d in range(365):  # what a year of nightly jobs leaves: every day, week and month before today
        day = first + timedelta(days=d)
        for period, start in (("day", day), ("week", day), ("month", day)):
            if (period == "week" and day.weekday() != 0) or (period == "month" and day.day != 1):
                continue
            if period_end(period, start) > today:  # type: ignore[arg-type]
                continue
            a, b = span(period, start, tz)  # type: ignore[arg-type]
            body = " ".join(sentence(rng) for _ in range({"day": 6, "week": 10, "month": 14}[period]))
            summaries.append((account.id, period, start, period_end(period, start) - timedelta(days=1), a, b, body,
                              30, 10))  # type: ignore[arg-type]  # fmt: skip
    async with db.pool.acquire() as conn:
        await conn.copy_records_to_table(
            "memory_summaries", records=summaries,
            columns=["account_id", "period", "starts_on", "ends_on", "covers_from", "covers_until", "body",
                     "messages", "turns"],
        )  # fmt: skip
        await conn.execute("ANALYZE")
    config = MemoryConfig()
    samples = []
    block = ""
    for _ in range(builds):
        t = time.perf_counter()
        block = await build_memory_block(db, account.id, conv, tz, NOW, config=config)
        samples.append((time.perf_counter() - t) * 1000)
    print(f"memory block, a year of history ({len(rows)} messages, {len(summaries)} summaries): {stats(samples)};"
          f" block is {len(block)} characters")  # fmt: skip


# 2. Search ----------------------------------------------------------------------------------------
async def load_synthetic(db: Database, people: list[UUID], convs: list[UUID], start: int, count: int) -> None:
    rng = np.random.default_rng(start + 7)
    centroids = np.random.default_rng(0).standard_normal((2_000, DIMS)).astype(np.float32)
    chunk = 50_000
    async with db.pool.acquire() as conn:
        for lo in range(start, start + count, chunk):
            n = min(chunk, start + count - lo)
            owners = rng.integers(0, len(people), size=n)
            at = [NOW - timedelta(minutes=int(x)) for x in rng.integers(0, 525_600, size=n)]
            bodies = [sentence(rng) for _ in range(n)]
            rows = [(convs[o], "sms", "inbound", b, t) for o, b, t in zip(owners, bodies, at, strict=True)]
            await conn.copy_records_to_table(
                "messages", records=rows, columns=["conversation_id", "channel", "direction", "body", "created_at"]
            )
            ids = await conn.fetch("SELECT id FROM messages ORDER BY id DESC LIMIT $1", n)
            ids = [r["id"] for r in reversed(ids)]
            vectors = centroids[rng.integers(0, len(centroids), size=n)] + 0.35 * rng.standard_normal((n, DIMS)).astype(
                np.float32
            )
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            records = [
                (people[o], MODEL_ID, i, 0, 0, len(b), t, v)
                for o, i, b, t, v in zip(owners, ids, bodies, at, vectors, strict=True)
            ]
            await conn.copy_records_to_table(
                "memory_index", records=records,
                columns=["account_id", "model_id", "message_id", "chunk", "chunk_start", "chunk_end", "created_at",
                         "embedding"],
            )  # fmt: skip
            print(f"  loaded {lo + n - start}/{count}", flush=True)


async def bench_search(db: Database, total: int, people: list[UUID], queries: int, search: BuiltinMemorySearch) -> None:
    await db.execute(
        "UPDATE memory_index_state SET active_model = $1, target_model = $1, target_dimensions = $2", MODEL_ID, DIMS
    )
    t = time.perf_counter()
    async with db.pool.acquire() as conn:
        await conn.execute("SET maintenance_work_mem = '3GB'; SET max_parallel_maintenance_workers = 1")
        await ensure_model_index(conn, MODEL_ID, DIMS)
        print(f"  HNSW index over {total} vectors built in {time.perf_counter() - t:.0f} s", flush=True)
        t = time.perf_counter()
        made = await ensure_person_indexes(conn, MODEL_ID, DIMS, MemoryConfig().index_person_min_rows)
        print(f"  {made} HNSW indexes of a person's own built in {time.perf_counter() - t:.0f} s", flush=True)
        await conn.execute("ANALYZE memory_index; ANALYZE messages")
    rng = np.random.default_rng(99)
    centroids = np.random.default_rng(0).standard_normal((2_000, DIMS)).astype(np.float32)
    cast, where = vector_sql(MODEL_ID, DIMS)
    scoped, whole, e2e_samples, counts = [], [], [], []

    async def nearest(person: UUID | None, q: list[float]) -> tuple[float, int]:
        scope = f"AND {person_filter(person)} AND account_id = $2" if person is not None else ""
        params: list[Any] = [q, person] if person is not None else [q]
        t = time.perf_counter()
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL hnsw.ef_search = 64; SET LOCAL hnsw.iterative_scan = 'relaxed_order'")
            rows = await conn.fetch(
                f"SELECT message_id, {cast} <=> $1::real[]::vector AS d FROM memory_index"
                f" WHERE {where} {scope} ORDER BY {cast} <=> $1::real[]::vector LIMIT 16",
                *params,
            )
        return (time.perf_counter() - t) * 1000, len(rows)

    for n in range(queries + 20):
        person = people[n % len(people)]
        q = centroids[rng.integers(0, len(centroids))] + 0.35 * rng.standard_normal(DIMS).astype(np.float32)
        q = (q / np.linalg.norm(q)).tolist()
        one, rows = await nearest(person, q)
        everyone, _ = await nearest(None, q)
        t = time.perf_counter()
        hits = await search.search(db, person, f"{WORDS[n % len(WORDS)]} next week", limit=8)
        e2e = (time.perf_counter() - t) * 1000
        if n >= 20:  # warm-up
            scoped.append(one)
            whole.append(everyone)
            e2e_samples.append(e2e)
            counts.append(rows)
        assert hits is not None
    plan = await db.fetch(
        f"EXPLAIN SELECT message_id FROM memory_index WHERE {where} AND {person_filter(people[0])} AND account_id = $1"
        f" ORDER BY {cast} <=> $2::real[]::vector LIMIT 16",
        people[0],
        [0.0] * DIMS,
    )
    used = [w for r in plan for w in r[0].split() if w.startswith("memory_index_hnsw")]
    uses = f"scoped search uses {used[0]}" if used else "no HNSW: " + plan[0][0]
    print(f"search over {total} messages ({uses}):")
    print(f"  one person owning all {total} (no other rows to skip), 16 nearest: {stats(whole)}")
    print(
        f"  scoped to one of {len(people)} people ({total // len(people)} each), 16 nearest: {stats(scoped)};"
        f" mean rows {statistics.mean(counts):.1f}"
    )
    print(f"  end to end (local ONNX query embedding + scoped search), 8 results: {stats(e2e_samples)}")


# 3. Nightly throughput ------------------------------------------------------------------------------
async def bench_nightly(db: Database, people: int) -> None:
    rng = np.random.default_rng(3)
    day = date(2025, 6, 3)  # a Tuesday: only daily jobs are due on Wednesday
    rows = []
    for n in range(people):
        account = await create_account(db, f"P{n}", timezone="Europe/Paris")
        conv = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
        start, _ = span("day", day, "Europe/Paris")
        for k in range(20):
            rows.append(
                (conv, "sms", ("inbound", "outbound")[k % 2], sentence(rng), start + timedelta(hours=8, minutes=20 * k))
            )
    async with db.pool.acquire() as conn:
        await conn.copy_records_to_table(
            "messages", records=rows, columns=["conversation_id", "channel", "direction", "body", "created_at"]
        )
    async with OpenAIPeer() as peer:
        peer.script(
            *(reply_text("A short summary of the day: plans, errands and a dentist booking.") for _ in range(people))
        )
        adapter = OpenAIResponsesAdapter(api_key="k", base_url=peer.base_url, timeout=30)
        router = ModelRouter({"openai": adapter}, {"small": Tier("small", (ModelChoice("gpt-x-mini"),))})
        t = time.perf_counter()
        report = await run_nightly_summaries(db, router, NOW + timedelta(hours=20), config=MemoryConfig())
        elapsed = time.perf_counter() - t
        await router.aclose()
    written = report.outcomes.get("written", 0)
    print(f"nightly jobs: {written} daily summaries for {len(report.people)} people in {elapsed:.2f} s ="
          f" {60 * len(report.people) / elapsed:.0f} people per minute (loopback peer, no model latency,"
          f" {MemoryConfig().job_concurrency} people at once)")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--people", type=int, default=200)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--builds", type=int, default=300)
    parser.add_argument("--skip", default="", help="comma list of block,search,nightly to skip")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    root = Path(tempfile.mkdtemp(prefix="pepper-bench-memory-"))
    pg, admin = start_postgres(root)
    try:
        if "block" not in skip:
            db = await fresh_db(admin, "block")
            await bench_block(db, args.builds)
            await db.close()
        if "nightly" not in skip:
            db = await fresh_db(admin, "nightly")
            await bench_nightly(db, args.people)
            await db.close()
        if "search" not in skip:
            db = await fresh_db(admin, "search")
            people = [(await create_account(db, f"S{n}")).id for n in range(10)]
            convs = [await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", p) for p in people]
            search = BuiltinMemorySearch(EMBEDDERS)
            await EMBEDDERS.configured().embed(["warm up"])
            loaded = 0
            for size in (int(s) for s in args.sizes.split(",")):
                t = time.perf_counter()
                await drop_model_indexes(db, MODEL_ID)
                await load_synthetic(db, people, convs, loaded, size - loaded)
                print(f"  loaded {size - loaded} messages with COPY in {time.perf_counter() - t:.0f} s", flush=True)
                loaded = size
                await bench_search(db, size, people, args.queries, search)
            await db.close()
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
