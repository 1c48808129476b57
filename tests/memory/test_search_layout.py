"""The index is partitioned by person: each person's rows and graphs live in a partition of their
own, made with the account; a search walks only that partition, before and after a re-index; the
migration that made the layout keeps what was indexed before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from memory_kit import NOW, say

from core.identity import create_account
from core.memory.index import Embedders, hnsw_index_name, index_pending, person_filter, set_target, vector_sql
from core.memory.search import BuiltinMemorySearch
from core.models.adapters.openai_embeddings import OpenAIEmbedder
from core.models.embeddings import LocalEmbedder
from core.store import Database
from core.store.migrations import apply_migrations, load_migrations
from core.testing.peers import OpenAIPeer

T0 = datetime(2025, 5, 12, 8, 0, tzinfo=UTC)
SAME_WORDS = [
    "My dentist appointment is on Thursday at 3pm",
    "The wifi password for the cabin is on the blue umbrella stand",
    "Book a table for four at the Italian place on Saturday",
]


def partition(account_id) -> str:
    return "memory_index_" + account_id.hex


async def seed_same_words(db, *people) -> dict:
    return {p: {await say(db, p, T0 + timedelta(hours=n), body) for n, body in enumerate(SAME_WORDS)} for p in people}


async def assert_each_sees_only_theirs(db, search, ids: dict, queries) -> None:
    for person, own in ids.items():
        for query in queries:
            hits = await search.search(db, person, query, limit=20)
            assert hits, query
            assert {h.source_id for h in hits} <= own, query
            # The same words were said by the other person: only this person's copy comes back.
            assert len(hits) <= len(own)


async def test_same_words_two_people_each_sees_only_theirs_also_after_a_reindex(db, ada, bob) -> None:
    embedders = Embedders()
    embedders.use(LocalEmbedder())
    ids = await seed_same_words(db, ada.id, bob.id)
    await index_pending(db, embedders=embedders, now=NOW)
    # Each person's rows sit in their own partition, and nowhere else.
    placed = await db.fetch("SELECT tableoid::regclass::text AS part, account_id FROM memory_index")
    assert len(placed) == 6 and all(r["part"] == partition(r["account_id"]) for r in placed)
    search = BuiltinMemorySearch(embedders)
    await assert_each_sees_only_theirs(db, search, ids, ["dentist", "cabin wifi", '"Italian place"'])

    async with OpenAIPeer(embedding_dims=16) as peer:
        remote = OpenAIEmbedder(api_key="k", base_url=peer.base_url, model="text-embedding-3-small", dimensions=16)
        embedders.use(remote)
        await set_target(db, remote, now=NOW)
        done = await index_pending(db, embedders=embedders, now=NOW)
        assert done.finished
        # The new model's graph exists in both partitions; the old model's rows and index are gone.
        indexes = {r["indexname"] for r in await db.fetch("SELECT indexname FROM pg_indexes")}
        assert hnsw_index_name(remote.model_id) in indexes
        assert hnsw_index_name(LocalEmbedder.model_id) not in indexes
        for person in ids:
            own = await db.fetchval(
                "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%hnsw%'", partition(person)
            )
            assert own == 1
        # The fake model puts identical texts at distance 0: both copies are equally near, and
        # still each person gets only their own.
        await assert_each_sees_only_theirs(db, search, ids, SAME_WORDS)
        await remote.aclose()


async def test_a_new_accounts_messages_are_searchable_on_its_own_graph(db, ada) -> None:
    await seed_same_words(db, ada.id)
    await index_pending(db, now=NOW)
    cleo = await create_account(db, "Cleo", timezone="UTC")  # after the index and its graphs exist
    assert await db.fetchval("SELECT to_regclass($1) IS NOT NULL", partition(cleo.id))
    mine = await say(db, cleo.id, T0, "The spare key to the garage is under the flowerpot")
    await index_pending(db, now=NOW)
    hits = await BuiltinMemorySearch().search(db, cleo.id, "where is the garage key", limit=5)
    assert [h.source_id for h in hits] == [mine]
    cast, where = vector_sql(LocalEmbedder.model_id, 384)
    async with db.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            f"EXPLAIN SELECT id FROM memory_index WHERE {where} AND {person_filter(cleo.id)} AND account_id = $1"
            f" ORDER BY {cast} <=> $2::real[]::vector LIMIT 5", cleo.id, [0.1] * 384,
        ))  # fmt: skip
    assert partition(cleo.id) in plan and partition(ada.id) not in plan  # her partition alone, by index
    # Deleting an account takes its rows and its partition; the others stay searchable.
    await db.execute("DELETE FROM accounts WHERE id = $1", cleo.id)
    assert not await db.fetchval("SELECT to_regclass($1) IS NOT NULL", partition(cleo.id))
    assert await db.fetchval("SELECT count(*) FROM memory_index") == 3
    assert await BuiltinMemorySearch().search(db, ada.id, "dentist", limit=1)


async def test_the_migration_moves_what_was_indexed_into_partitions(db_factory) -> None:
    dsn = await db_factory.create_empty()
    migrations = load_migrations()
    db = await Database.open(dsn, migrations=[m for m in migrations if m.version < 96], max_size=4)
    try:
        ada = await create_account(db, "Ada", timezone="UTC")
        bob = await create_account(db, "Bob", timezone="UTC")
        ids = await seed_same_words(db, ada.id, bob.id)
        await index_pending(db, now=NOW)  # into the old, unpartitioned table
        before = await db.fetch("SELECT id, account_id, message_id, embedding::text AS e FROM memory_index ORDER BY id")
        assert len(before) == 6
        async with db.pool.acquire() as c:
            assert await apply_migrations(c, migrations) == [m.version for m in migrations if m.version >= 96]
        after = await db.fetch(
            "SELECT id, account_id, message_id, embedding::text AS e, tableoid::regclass::text AS part"
            " FROM memory_index ORDER BY id"
        )
        assert [tuple(r)[:4] for r in after] == [tuple(r) for r in before]
        assert all(r["part"] == partition(r["account_id"]) for r in after)
        assert await db.fetchval("SELECT to_regclass($1) IS NOT NULL", hnsw_index_name(LocalEmbedder.model_id))
        await assert_each_sees_only_theirs(db, BuiltinMemorySearch(), ids, ["dentist"])
        # New rows carry on after the old ids, in the new layout.
        late = await say(db, ada.id, T0 + timedelta(days=1), "Passport renewal form is in the drawer")
        await index_pending(db, now=NOW)
        row = await db.fetchrow(
            "SELECT id, tableoid::regclass::text AS part FROM memory_index WHERE message_id = $1", late
        )
        assert row["id"] > before[-1]["id"] and row["part"] == partition(ada.id)
        # The cascades and checks came along: a deleted message takes its chunks with it.
        await db.execute("DELETE FROM messages WHERE id = $1", late)
        assert await db.fetchval("SELECT count(*) FROM memory_index WHERE message_id = $1", late) == 0
        with pytest.raises(asyncpg.CheckViolationError):
            await db.execute(
                "INSERT INTO memory_index (account_id, model_id, chunk_end, created_at, embedding)"
                " VALUES ($1, 'm', 1, now(), '[1]')",
                ada.id,
            )
    finally:
        await db.close()
        await db_factory.drop(dsn)
