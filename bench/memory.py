"""Memory figures: the memory block for a year of history, search over 100k and 1M messages, and
nightly-job throughput against a loopback model peer.

    PYTHONPATH=. .venv/bin/python bench/memory.py [--sizes 100000,1000000] [--people 200]

1. **Block build**: one person with a year of history (30 messages a day, every day, month/week/
   day summaries as the nightly jobs leave them, 20 messages today). Median and p99 of
   ``build_memory_block`` over 300 builds.
2. **Search**: synthetic messages bulk-loaded with COPY, with synthetic 384-dimension unit
   vectors (clustered, as real embeddings are) in ``memory_index`` (one partition per person,
   each with its own HNSW graph, m=16, ef_construction=64), split over 10 people. Beside it the
   previous layout, as a baseline: the same rows in one unpartitioned table with one shared HNSW
   graph, searched with the person filter and pgvector's iterative scan. Median and p99 of:
   one person owning every row (one graph, nothing to skip: the same in both layouts); a search
   scoped to one of 10 people in each layout, and the production query
   (``BuiltinMemorySearch.nearest``); recall@10 of each against exact search on a sample; keyword
   (quoted phrase) search; end to end with the local ONNX embedder embedding the query text.
   Target: median <= 10 ms at 1M.
3. **Nightly throughput**: N people with a day of 20 messages each; ``run_nightly_summaries``
   through the real router and OpenAI adapter to a loopback peer that answers at once. People
   per minute.

Runs its own embedded Postgres with shared_buffers=2GB, maintenance_work_mem=3GB (for the HNSW
builds) in ``--cache`` (default ``~/.cache/pepper/bench-memory``). The search datasets are kept
there and reused by later runs (one database per size; ``--rebuild`` makes them again): the first
run at 1M loads for minutes and builds HNSW graphs for tens of minutes on two busy cores; later
runs start measuring at once. About 9 GB of disk for 100k and 1M together.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np

from core.identity import create_account
from core.memory import MemoryConfig, build_memory_block, run_nightly_summaries
from core.memory.index import EMBEDDERS, ensure_model_index, person_filter, vector_sql
from core.memory.periods import local_date, period_end, span
from core.memory.search import BuiltinMemorySearch
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.embeddings import LocalEmbedder
from core.models.router import ModelChoice, ModelRouter, Tier
from core.store import Database
from core.store.embedded import EmbeddedPostgres
from core.testing.figures import p99
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
    return f"median {statistics.median(ordered):.2f} ms, p99 {p99(ordered):.2f} ms (n={len(ordered)})"


def start_postgres(root: Path) -> tuple[EmbeddedPostgres | None, str]:
    """The bench's own server in ``root``, made and tuned on the first run, reused after. A server
    another run left going is used as it is and not stopped (None): that run may still need it."""
    pg = EmbeddedPostgres(root)
    if pg.is_running():
        return None, pg.dsn()
    tuned = root / "tuned"
    if not tuned.exists():
        pg.start()
        pg.stop()
        with open(pg.pgdata / "postgresql.conf", "a") as conf:
            conf.write(
                "\nshared_buffers = '2GB'\nmaintenance_work_mem = '3GB'\nmax_parallel_maintenance_workers = 1\n"
                "synchronous_commit = off\nwork_mem = '64MB'\n"
            )
        tuned.touch()
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
DATASET = 2  # bump when what build_dataset makes changes: cached datasets of another number are rebuilt
FLAT = "memory_index_flat"  # the previous layout (one table, one shared graph), kept beside as the baseline


async def load_synthetic(db: Database, people: list[UUID], convs: list[UUID], count: int) -> None:
    rng = np.random.default_rng(7)
    centroids = np.random.default_rng(0).standard_normal((2_000, DIMS)).astype(np.float32)
    chunk = 50_000
    async with db.pool.acquire() as conn:
        for lo in range(0, count, chunk):
            n = min(chunk, count - lo)
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
            print(f"  loaded {lo + n}/{count}", flush=True)


async def build_dataset(admin_dsn: str, size: int, rebuild: bool, baseline: bool) -> Database:
    """The search database for ``size`` messages over 10 people, from the cache when it is there."""
    import asyncpg

    name = f"search_{size}"
    admin = await asyncpg.connect(admin_dsn)
    exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
    await admin.close()
    stage = None
    if exists and not rebuild:
        db = await Database.open(with_database(admin_dsn, name), max_size=6)
        if await db.fetchval("SELECT to_regclass('bench_dataset') IS NOT NULL"):
            stage = await db.fetchval("SELECT stage FROM bench_dataset WHERE number = $1 AND size = $2", DATASET, size)
        if stage is None:
            await db.close()
    if stage is None:
        db = await fresh_db(admin_dsn, name)
        people = [(await create_account(db, f"S{n}")).id for n in range(10)]
        convs = [await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", p) for p in people]
        await db.execute(
            "UPDATE memory_index_state SET active_model = $1, target_model = $1, target_dimensions = $2", MODEL_ID, DIMS
        )
        t = time.perf_counter()
        await load_synthetic(db, people, convs, size)
        print(f"  loaded {size} messages with COPY in {time.perf_counter() - t:.0f} s", flush=True)
        t = time.perf_counter()
        async with db.pool.acquire() as conn:
            await conn.execute("SET maintenance_work_mem = '3GB'; SET max_parallel_maintenance_workers = 1")
            await ensure_model_index(conn, MODEL_ID, DIMS)
            await conn.execute("ANALYZE")
        print(f"  an HNSW graph per person over {size} vectors built in {time.perf_counter() - t:.0f} s", flush=True)
        await db.execute("CREATE TABLE bench_dataset (number integer, size integer, stage text)")
        await db.execute("INSERT INTO bench_dataset VALUES ($1, $2, 'partitioned')", DATASET, size)
        stage = "partitioned"
    if stage == "partitioned" and baseline:
        t = time.perf_counter()
        cast, where = vector_sql(MODEL_ID, DIMS)
        async with db.pool.acquire() as conn:
            await conn.execute(f"DROP TABLE IF EXISTS {FLAT}")
            await conn.execute(f"CREATE TABLE {FLAT} AS SELECT * FROM memory_index")
            await conn.execute("SET maintenance_work_mem = '3GB'; SET max_parallel_maintenance_workers = 1")
            await conn.execute(f"CREATE INDEX ON {FLAT} USING hnsw (({cast}) vector_cosine_ops) WHERE {where}")
            await conn.execute(f"CREATE INDEX ON {FLAT} (account_id, model_id)")
            await conn.execute("ANALYZE")
            await conn.execute("UPDATE bench_dataset SET stage = 'done'")
        print(f"  baseline (one shared HNSW graph over {size}) built in {time.perf_counter() - t:.0f} s", flush=True)
    else:
        print(f"  reusing the cached dataset {name}", flush=True)
    return db


def recall(found: list[int], exact: list[int]) -> float:
    return len(set(found) & set(exact)) / max(1, len(exact))


async def bench_search(
    db: Database, total: int, queries: int, recall_sample: int, search: BuiltinMemorySearch, baseline: bool
) -> None:
    people = [r["id"] for r in await db.fetch("SELECT id FROM accounts ORDER BY name")]
    rng = np.random.default_rng(99)
    centroids = np.random.default_rng(0).standard_normal((2_000, DIMS)).astype(np.float32)
    cast, where = vector_sql(MODEL_ID, DIMS)

    async def nearest(table: str, person: UUID | None, q: list[float], limit: int, exact: bool = False) -> list[int]:
        """The bare nearest-neighbour query on either layout; ``exact`` turns the graphs off."""
        scope = f"AND {person_filter(person)} AND account_id = $2" if person is not None else ""
        params: list[Any] = [q, person] if person is not None else [q]
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SET LOCAL enable_indexscan = off" if exact
                else "SET LOCAL hnsw.ef_search = 64; SET LOCAL hnsw.iterative_scan = 'relaxed_order'"
            )  # fmt: skip
            rows = await conn.fetch(
                f"SELECT message_id FROM {table} WHERE {where} {scope} ORDER BY {cast} <=> $1::real[]::vector"
                f" LIMIT {limit}",
                *params,
            )
        return [r["message_id"] for r in rows]

    async def timed(make: Any) -> float:
        t = time.perf_counter()
        await make
        return (time.perf_counter() - t) * 1000

    def query_vector() -> list[float]:
        q = centroids[rng.integers(0, len(centroids))] + 0.35 * rng.standard_normal(DIMS).astype(np.float32)
        return (q / np.linalg.norm(q)).tolist()

    # One pass per kind of search over the same queries, each after its own warm-up: a pass does not
    # measure what the pass before it left in (or pushed out of) the caches. The keyword passes run
    # last: a common phrase reads many heap pages.
    work = [(people[n % len(people)], query_vector(), " ".join(rng.choice(WORDS, size=2))) for n in range(queries + 20)]
    matches: list[int] = []

    async def words(person: UUID, phrase: str) -> None:
        matches.append(len(await search.keyword(db, person, phrase, limit=8)))

    passes: dict[str, Any] = {
        "one": lambda p, q, w: nearest(FLAT, None, q, 16),
        "flat": lambda p, q, w: nearest(FLAT, p, q, 16),
        "parts": lambda p, q, w: nearest("memory_index", p, q, 16),
        "prod": lambda p, q, w: search.nearest(db, p, MODEL_ID, DIMS, q, 16),
        "e2e": lambda p, q, w: search.search(db, p, f"{w} next week", limit=8),
        "words": lambda p, q, w: words(p, w),
        "miss": lambda p, q, w: search.keyword(db, p, "blue umbrella", limit=8),
    }
    samples: dict[str, list[float]] = {k: [] for k in passes}
    for kind, make in passes.items():
        if kind in ("one", "flat") and not baseline:
            continue
        # Meaning searches warm up with a whole untimed pass: each layout's graphs are GBs at 1M, and
        # the pass before (the other layout) has pushed them out of shared buffers.
        warm = len(work) if kind in ("one", "flat", "parts", "prod") else 20
        for n, (person, q, phrase) in enumerate(work[:warm] + work[20:]):
            took = await timed(make(person, q, phrase))
            if n >= warm:
                samples[kind].append(took)
    recalls: dict[str, list[float]] = {"one": [], "flat": [], "parts": []}
    for n in range(recall_sample):
        person = people[n % len(people)]
        q = query_vector()
        exact = await nearest("memory_index", person, q, 10, exact=True)
        if baseline:
            recalls["flat"].append(recall(await nearest(FLAT, person, q, 10), exact))
        recalls["parts"].append(recall(await nearest("memory_index", person, q, 10), exact))
        if baseline and n < max(5, recall_sample // 3):  # exact over every row is slow at 1M: a smaller sample
            recalls["one"].append(recall(await nearest(FLAT, None, q, 10), await nearest(FLAT, None, q, 10, True)))

    def r10(key: str) -> str:
        return f"recall@10 {statistics.mean(recalls[key]):.3f} (n={len(recalls[key])})"

    plan = await db.fetch(
        f"EXPLAIN SELECT message_id FROM memory_index WHERE {where} AND {person_filter(people[0])} AND account_id = $1"
        f" ORDER BY {cast} <=> $2::real[]::vector LIMIT 16",
        people[0],
        [0.0] * DIMS,
    )
    scans = [line[0].strip() for line in plan if "Index Scan" in line[0]]
    sizes = await db.fetchrow(
        "SELECT coalesce(pg_total_relation_size(to_regclass('memory_index_flat')), 0) AS flat,"
        " (SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits"
        "  WHERE inhparent = 'memory_index'::regclass) AS parts"
    )
    each = total // len(people)
    print(f"search over {total} messages, {len(people)} people ({each} each); 16 nearest unless said:")
    print(f"  plan of a scoped search: {scans[0] if len(scans) == 1 else plan}")
    if baseline:
        print(f"  one person owning all {total} (one graph, nothing to skip): {stats(samples['one'])}; {r10('one')}")
        print(f"  scoped, previous layout (one shared graph, iterative scan): {stats(samples['flat'])}; {r10('flat')}")
    print(f"  scoped, a partition and a graph per person: {stats(samples['parts'])}; {r10('parts')}")
    print(f"  scoped, the production query with sources (BuiltinMemorySearch.nearest): {stats(samples['prod'])}")
    print(f"  keyword, a two-word phrase (mean {statistics.mean(matches):.1f} of 8 found): {stats(samples['words'])}")
    print(f"  keyword, a phrase said nowhere: {stats(samples['miss'])}")
    print(f"  end to end (local ONNX query embedding + meaning search), 8 results: {stats(samples['e2e'])}")
    print(f"  on disk with indexes: shared layout {sizes['flat'] / 2**20:.0f} MB,"
          f" partitions {sizes['parts'] / 2**20:.0f} MB")  # fmt: skip


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
    parser.add_argument("--recall", type=int, default=30, help="queries checked against exact search")
    parser.add_argument("--skip", default="", help="comma list of block,search,nightly to skip")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "pepper" / "bench-memory"))
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the previous layout (its 1M graph is slow to build)"
    )
    parser.add_argument("--rebuild", action="store_true", help="make the cached search datasets again")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    root = Path(args.cache)
    root.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before anything runs
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
            search = BuiltinMemorySearch(EMBEDDERS)
            await EMBEDDERS.configured().embed(["warm up"])
            for size in (int(s) for s in args.sizes.split(",")):
                db = await build_dataset(admin, size, args.rebuild, not args.no_baseline)
                await bench_search(db, size, args.queries, args.recall, search, not args.no_baseline)
                await db.close()
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
