"""The meaning-search index: messages and documents as embedded chunks, per embedding model.

Vectors of different models never mix: every row names its ``model_id``, and each model has a
partial HNSW index (cosine) on ``embedding::vector(N)``. The table is partitioned by person (one
partition per account, made with the account), so each person's rows have graphs of their own
and a search scoped to them walks nobody else's. ``memory_index_state`` names the
*active* model (searches use it) and the *target* model (indexing writes for it). Normally they
are the same and indexing only picks up new messages. A re-index (a new embedding model) sets a
new target: the same indexer then works through every message again, searches keep using the old
model meanwhile, and when nothing is left the target becomes active and the old rows go.

Scheduled runs are left out (their summaries record them). One indexer runs at a time across
every process (an advisory lock); others return at once.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.memory.config import MemoryConfig
from core.models.embeddings import Embedder, LocalEmbedder
from core.store.pool import connection, transaction
from core.store.queries import Queries

log = logging.getLogger(__name__)

INDEX_LOCK = 0x7065_7070_6D69  # "peppmi": one indexer at a time
# Ids that may commit after a larger id was indexed are caught by re-checking this many behind.
CURSOR_LAG = 1_000
_MODEL_ID = re.compile(r"^[A-Za-z0-9:._/+-]{1,100}$")


class Embedders:
    """The embedders this process can use, by model id. The configured one is the indexing target;
    the local default is always available, so a search can keep using it during a re-index."""

    def __init__(self) -> None:
        self._configured: Embedder | None = None
        self._by_id: dict[str, Embedder] = {}
        self._warned: set[str] = set()

    def warn_once(self, key: str) -> bool:
        """True the first time ``key`` is seen (so a tick every minute logs a problem once)."""
        if key in self._warned:
            return False
        self._warned.add(key)
        return True

    def use(self, embedder: Embedder) -> None:
        check_model_id(embedder.model_id)
        self._configured = embedder
        self._by_id[embedder.model_id] = embedder

    def configured(self) -> Embedder:
        if self._configured is None:
            self.use(self.get(LocalEmbedder.model_id) or LocalEmbedder())
        assert self._configured is not None
        return self._configured

    def get(self, model_id: str | None) -> Embedder | None:
        if model_id is None:
            return None
        found = self._by_id.get(model_id)
        if found is None and model_id == LocalEmbedder.model_id:
            found = self._by_id[model_id] = LocalEmbedder()
        return found


# The process's embedders; ``gateway.server.build_app`` sets the configured one from settings.
EMBEDDERS = Embedders()


def check_model_id(model_id: str) -> str:
    if not _MODEL_ID.match(model_id):
        raise InvalidInput(f"unusable embedding model id {model_id!r}")
    return model_id


def vector_sql(model_id: str, dimensions: int) -> tuple[str, str]:
    """The sized cast and the model filter, as SQL text matching the model's partial index."""
    check_model_id(model_id)
    return f"embedding::vector({int(dimensions)})", f"model_id = '{model_id}'"


def hnsw_index_name(model_id: str) -> str:
    """The model's HNSW index (a partitioned index: one graph per person's partition). The
    migration that made the table partitioned names them the same way, in SQL."""
    return "memory_index_hnsw_" + hashlib.md5(model_id.encode(), usedforsecurity=False).hexdigest()[:12]


def person_filter(account_id: UUID) -> str:
    """The person filter as SQL text, so the planner keeps only the person's partition when it
    plans (with a parameter it would plan every partition and prune at run time)."""
    return f"account_id = '{UUID(str(account_id))}'"


async def drop_model_indexes(db: Queries, model_id: str) -> None:
    """Drop the model's HNSW index (with it, every person's graph for the model)."""
    await db.execute(f"DROP INDEX IF EXISTS {hnsw_index_name(model_id)}")


async def ensure_model_index(db: Queries, model_id: str, dimensions: int) -> None:
    """Create the model's partial HNSW index if it is missing (cosine distance). On the
    partitioned table this makes one graph in every person's partition, and every partition made
    later (a new account) gets its own at once."""
    if await db.fetchval("SELECT to_regclass($1) IS NOT NULL", hnsw_index_name(model_id)):
        return  # checked first: CREATE INDEX IF NOT EXISTS would wait for a lock even then
    cast, where = vector_sql(model_id, dimensions)
    await db.execute(
        f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(model_id)} ON memory_index"
        f" USING hnsw (({cast}) vector_cosine_ops) WHERE {where}"
    )


@dataclass(frozen=True)
class IndexState:
    active_model: str | None
    target_model: str | None
    target_dimensions: int | None
    message_cursor: int
    document_cursor: int
    reindex_started_at: datetime | None

    @property
    def reindexing(self) -> bool:
        return self.target_model is not None and self.target_model != self.active_model


async def index_state(db: Queries) -> IndexState:
    row = await db.fetchrow("SELECT * FROM memory_index_state")
    return IndexState(
        row["active_model"],
        row["target_model"],
        row["target_dimensions"],
        row["message_cursor"],
        row["document_cursor"],
        row["reindex_started_at"],
    )


async def set_target(db: Queries, embedder: Embedder, *, now: datetime, force: bool = False) -> IndexState:
    """Make ``embedder`` the indexing target. A new model starts a re-index; ``force`` rebuilds
    the same model from scratch (its rows are dropped first, searches keep working on what
    remains until the rebuild reaches them). Returns the new state."""
    model_id = check_model_id(embedder.model_id)
    state = await index_state(db)
    if state.target_model == model_id and not force:
        return state
    await ensure_model_index(db, model_id, embedder.dimensions)
    async with transaction(db) as conn:
        if force:
            await conn.execute("DELETE FROM memory_index WHERE model_id = $1", model_id)
        await conn.execute(
            "UPDATE memory_index_state SET target_model = $1, target_dimensions = $2, message_cursor = 0,"
            " document_cursor = 0, reindex_started_at = $3, updated_at = $3,"
            " active_model = CASE WHEN $4 THEN active_model ELSE COALESCE(active_model, $1) END",
            model_id,
            embedder.dimensions,
            now,
            force,
        )
    log.info("memory index target set: model=%s force=%s", model_id, force)
    return await index_state(db)


def chunks(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of ``text`` of at most ``size``, overlapping by ``overlap``,
    cut at whitespace where possible. Empty text has no chunks."""
    n = len(text)
    if not text.strip():
        return []
    if n <= size:
        return [(0, n)]
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end = min(n, start + size)
        if end < n:
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        spans.append((start, end))
        if end >= n:
            break
        start = max(end - overlap, start + 1)
        space = text.find(" ", start, end)
        start = space + 1 if 0 <= space < end else start
    return spans


@dataclass(frozen=True)
class IndexProgress:
    model_id: str | None
    indexed: int  # sources (messages and documents) with rows for the target
    total: int  # sources that should be indexed
    added: int  # rows written by this pass
    finished: bool  # nothing is left for the target
    ran: bool  # False when another indexer held the lock

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else min(100.0, 100.0 * self.indexed / self.total)


async def progress(db: Queries, model_id: str | None = None) -> IndexProgress:
    state = await index_state(db)
    model_id = model_id or state.target_model
    total = await db.fetchval(
        "SELECT (SELECT count(*) FROM messages m LEFT JOIN turns t ON t.id = m.turn_id"
        "        WHERE t.kind IS DISTINCT FROM 'scheduled' AND m.body ~ '\\S')"
        "     + (SELECT count(*) FROM memory_documents WHERE (title || body) ~ '\\S')"
    )
    indexed = await db.fetchval(
        "SELECT count(*) FROM memory_index WHERE model_id = $1 AND chunk = 0", model_id
    ) if model_id else 0  # fmt: skip
    return IndexProgress(model_id, indexed, total, 0, indexed >= total, True)


ProgressFn = Callable[[IndexProgress], None]


async def index_pending(
    db: Queries,
    *,
    embedders: Embedders = EMBEDDERS,
    config: MemoryConfig | None = None,
    now: datetime,
    max_batches: int | None = None,
    on_progress: ProgressFn | None = None,
    count: bool = True,
) -> IndexProgress:
    """Index what the target model lacks, in batches; switch the active model when a re-index ends.

    Returns at once (``ran=False``) when another process is indexing. ``max_batches`` bounds one
    call (a background tick); the cursors keep the place for the next call. ``count=False`` skips
    counting everything for the returned progress (``indexed`` and ``total`` are then 0, and
    ``finished`` says whether this call reached the end).
    """
    config = config or MemoryConfig()
    state = await index_state(db)
    if state.target_model is None:
        state = await set_target(db, embedders.configured(), now=now)
    embedder = embedders.get(state.target_model)
    configured = embedders.configured().model_id
    if configured != state.target_model and embedders.warn_once(f"differs:{configured}:{state.target_model}"):
        log.warning(
            "the configured embedding model is not the index's; run `pepper memory reindex`: configured=%s index=%s",
            configured,
            state.target_model,
        )
    if embedder is None:
        if embedders.warn_once(f"missing:{state.target_model}"):
            log.warning("no embedder for the index target; indexing waits: model=%s", state.target_model)
        return IndexProgress(state.target_model, 0, 0, 0, False, False)
    added, more = 0, True
    await ensure_model_index(db, embedder.model_id, embedder.dimensions)
    async with connection(db) as conn:
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", INDEX_LOCK):
            return IndexProgress(state.target_model, 0, 0, 0, False, False)
        try:
            batches = 0
            while max_batches is None or batches < max_batches:
                wrote, more = await _index_batch(conn, embedder, state, config)
                added += wrote
                batches += 1
                state = await index_state(conn)
                if on_progress is not None:
                    on_progress(await progress(conn, embedder.model_id))
                if not more:
                    await _finish_if_done(conn, state, now)
                    break
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", INDEX_LOCK)
    if not count:
        return IndexProgress(embedder.model_id, 0, 0, added, not more, True)
    result = await progress(db, embedder.model_id)
    return IndexProgress(result.model_id, result.indexed, result.total, added, result.finished, True)


async def _index_batch(conn: Queries, embedder: Embedder, state: IndexState, config: MemoryConfig) -> tuple[int, bool]:
    """One batch of messages, then documents. Returns (rows written, whether more may remain)."""
    model_id = embedder.model_id
    messages = await conn.fetch(
        """
        SELECT m.id, c.account_id, m.body, m.created_at FROM messages m
        JOIN conversations c ON c.id = m.conversation_id
        LEFT JOIN turns t ON t.id = m.turn_id
        WHERE m.id > $2 AND t.kind IS DISTINCT FROM 'scheduled' AND m.body ~ '\\S'
          AND NOT EXISTS (SELECT 1 FROM memory_index i
                          WHERE i.account_id = c.account_id AND i.model_id = $1 AND i.message_id = m.id)
        ORDER BY m.id LIMIT $3
        """,
        model_id,
        max(0, state.message_cursor - CURSOR_LAG),
        config.index_batch,
    )
    sources: list[tuple[str, Any, str]] = [("message", r, r["body"]) for r in messages]
    if len(messages) < config.index_batch:
        documents = await conn.fetch(
            """
            SELECT d.id, d.account_id, d.title, d.body, d.created_at FROM memory_documents d
            WHERE d.id > $2 AND (d.title || d.body) ~ '\\S'
              AND NOT EXISTS (SELECT 1 FROM memory_index i
                              WHERE i.account_id = d.account_id AND i.model_id = $1 AND i.document_id = d.id)
            ORDER BY d.id LIMIT $3
            """,
            model_id,
            max(0, state.document_cursor - CURSOR_LAG),
            config.index_batch - len(messages),
        )
        sources += [("document", r, f"{r['title']}\n{r['body']}") for r in documents]
    if not sources:
        return 0, False
    pieces: list[tuple[str, Any, int, int, int, str]] = []
    for kind, row, text in sources:
        for n, (start, end) in enumerate(chunks(text, config.index_chunk_chars, config.index_chunk_overlap)):
            pieces.append((kind, row, n, start, end, text[start:end]))
    vectors = await embedder.embed([p[5] for p in pieces]) if pieces else []
    records = [
        (
            row["account_id"],
            model_id,
            row["id"] if kind == "message" else None,
            row["id"] if kind == "document" else None,
            n,
            start,
            end,
            row["created_at"],
            vector,
        )
        for (kind, row, n, start, end, _), vector in zip(pieces, vectors, strict=True)
    ]
    before = (state.message_cursor, state.document_cursor)
    async with conn.transaction():
        if records:
            await conn.executemany(
                "INSERT INTO memory_index (account_id, model_id, message_id, document_id, chunk, chunk_start,"
                " chunk_end, created_at, embedding) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::real[]::vector)"
                " ON CONFLICT DO NOTHING",
                records,
            )
        message_ids = [r["id"] for k, r, _ in sources if k == "message"]
        document_ids = [r["id"] for k, r, _ in sources if k == "document"]
        await conn.execute(
            "UPDATE memory_index_state SET message_cursor = GREATEST(message_cursor, $1),"
            " document_cursor = GREATEST(document_cursor, $2), updated_at = now()",
            max(message_ids, default=0),
            max(document_ids, default=0),
        )
    after = (max(message_ids, default=before[0]), max(document_ids, default=before[1]))
    # Only sources behind the cursor (inside the lag) and nothing written: nothing new is left.
    return len(records), bool(records) or after[0] > before[0] or after[1] > before[1]


async def _finish_if_done(conn: Queries, state: IndexState, now: datetime) -> None:
    if not state.reindexing:
        return
    old = state.active_model
    async with conn.transaction():
        await conn.execute(
            "UPDATE memory_index_state SET active_model = target_model, reindex_started_at = NULL, updated_at = $1",
            now,
        )
        if old is not None:
            await conn.execute("DELETE FROM memory_index WHERE model_id = $1", old)
    if old is not None:
        await drop_model_indexes(conn, old)
    log.info("memory re-index finished: model=%s replaced=%s", state.target_model, old)


async def add_document(db: Queries, account_id: UUID, kind: str, title: str, body: str) -> int:
    """Record a document Pepper made (a brief, a draft, a report) so search can find it.

    It is embedded by the next indexing pass.
    """
    if not body.strip():
        raise InvalidInput("the document is empty")
    return await db.fetchval(
        "INSERT INTO memory_documents (account_id, kind, title, body) VALUES ($1, $2, $3, $4) RETURNING id",
        account_id,
        kind,
        title.strip(),
        body,
    )


def embedding_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.6g}" for x in vector) + "]"
