"""Search on request: meaning search over the person's messages and documents, and keyword search
over messages for each quoted phrase. Every query is scoped to one person.

The built-in search occupies the ``memory`` slot (:data:`MEMORY_SEARCH`, ``core.slots``) unless a
plugin is named for it; a call on which the plugin fails falls back to the built-in.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from core.errors import PepperError
from core.memory.config import MemoryConfig
from core.memory.index import EMBEDDERS, Embedders, index_state, person_filter, vector_sql
from core.slots import MEMORY, SLOTS, SlotRegistry, SlotSpec, is_list_of
from core.store.pool import transaction
from core.store.queries import Queries

log = logging.getLogger(__name__)

_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”')
SNIPPET_CHARS = 320
MEMORY_TIMEOUT = 10.0  # seconds an occupant has for one search


class SearchUnavailable(PepperError):
    """The index was built with an embedding model this process cannot run."""

    code = "search-unavailable"


@dataclass(frozen=True)
class SearchHit:
    """One result. ``match`` is "words" (a quoted phrase found as written) or "meaning"."""

    source: str  # message or document
    source_id: int
    created_at: datetime
    channel: str | None  # a message's channel
    direction: str | None  # inbound (the person) or outbound (Pepper)
    title: str | None  # a document's title
    kind: str | None  # a document's kind
    snippet: str
    match: str
    distance: float | None = None
    author: str | None = None  # a message's when not the person's or Pepper's (``core.conversation.UNVERIFIED_CALLER``)


def quoted_phrases(query: str) -> list[str]:
    phrases = [(a or b).strip() for a, b in _QUOTED.findall(query)]
    return [p for p in phrases if p]


def _window(text: str, start: int, end: int, limit: int = SNIPPET_CHARS) -> str:
    """Up to ``limit`` characters of ``text`` around ``[start, end)``, marked where cut."""
    text_len = len(text)
    if text_len <= limit:
        return " ".join(text.split())
    middle = (start + end) // 2
    lo = max(0, min(middle - limit // 2, text_len - limit))
    hi = min(text_len, lo + limit)
    piece = " ".join(text[lo:hi].split())
    return ("…" if lo > 0 else "") + piece + ("…" if hi < text_len else "")


def _like_pattern(phrase: str) -> str:
    return "%" + phrase.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class MemorySearch(Protocol):
    """What occupies the memory-search slot."""

    async def search(self, db: Queries, account_id: UUID, query: str, *, limit: int) -> list[SearchHit]: ...


class BuiltinMemorySearch:
    """pgvector HNSW over the active model's rows, plus phrase search over messages."""

    def __init__(self, embedders: Embedders = EMBEDDERS, config: MemoryConfig | None = None):
        self.embedders = embedders
        self.config = config or MemoryConfig()

    async def search(self, db: Queries, account_id: UUID, query: str, *, limit: int) -> list[SearchHit]:
        """Best matches first: quoted phrases found as written, then meaning matches, no source
        twice. Raises when the embedder fails (the tool reports a failure, never "nothing")."""
        hits: list[SearchHit] = []
        for phrase in quoted_phrases(query):
            hits += await self.keyword(db, account_id, phrase, limit=limit)
        meaning = await self.meaning(db, account_id, query.replace('"', " "), limit=limit)
        seen: set[tuple[str, int]] = set()
        merged: list[SearchHit] = []
        for hit in [*hits, *meaning]:
            key = (hit.source, hit.source_id)
            if key not in seen:
                seen.add(key)
                merged.append(hit)
        return merged[: max(limit, len(hits))]

    async def keyword(self, db: Queries, account_id: UUID, phrase: str, *, limit: int) -> list[SearchHit]:
        """Messages (not from scheduled runs) that contain ``phrase`` as written, newest first."""
        rows = await db.fetch(
            r"""
            SELECT m.id, m.channel, m.direction, m.author, m.body, m.created_at FROM messages m
            JOIN conversations c ON c.id = m.conversation_id
            LEFT JOIN turns t ON t.id = m.turn_id
            WHERE c.account_id = $1
              AND (numnode(phraseto_tsquery('simple', $2)) = 0
                   OR to_tsvector('simple', m.body) @@ phraseto_tsquery('simple', $2))
              AND m.body ILIKE $3 ESCAPE '\'
              AND t.kind IS DISTINCT FROM 'scheduled'
            ORDER BY m.created_at DESC, m.id DESC LIMIT $4
            """,
            account_id,
            phrase,
            _like_pattern(phrase),
            limit,
        )
        out = []
        for r in rows:
            at = r["body"].lower().find(phrase.lower())
            at = max(at, 0)
            snippet = _window(r["body"], at, at + len(phrase))
            hit = SearchHit(
                "message", r["id"], r["created_at"], r["channel"], r["direction"], None, None, snippet, "words",
                author=r["author"],
            )  # fmt: skip
            out.append(hit)
        return out

    async def meaning(self, db: Queries, account_id: UUID, query: str, *, limit: int) -> list[SearchHit]:
        if not query.strip():
            return []
        state = await index_state(db)
        model_id = state.active_model or state.target_model
        if model_id is None:  # nothing was ever indexed
            return []
        embedder = self.embedders.get(model_id)
        if embedder is None:
            raise SearchUnavailable(f"no embedder for the indexed model {model_id} in this process")
        (vector,) = await embedder.embed([query])
        rows = await self.nearest(db, account_id, model_id, embedder.dimensions, vector, limit * 2)
        out: list[SearchHit] = []
        seen: set[tuple[str, int]] = set()
        for r in rows:
            source = "message" if r["message_id"] is not None else "document"
            source_id = r["message_id"] if source == "message" else r["document_id"]
            if (source, source_id) in seen or r["text"] is None:
                continue
            seen.add((source, source_id))
            snippet = _window(r["text"], r["chunk_start"], r["chunk_end"])
            hit = SearchHit(
                source, source_id, r["created_at"], r["channel"], r["direction"], r["title"], r["kind"],
                snippet, "meaning", float(r["distance"]), r["author"],
            )  # fmt: skip
            out.append(hit)
        return out[:limit]

    async def nearest(
        self, db: Queries, account_id: UUID, model_id: str, dimensions: int, vector: list[float], limit: int
    ) -> list[Any]:
        """The ``limit`` chunks of the person nearest to ``vector``, with their sources.

        The person filter is SQL text, so the planner keeps only the person's partition of the
        index and walks that partition's graph alone. The iterative scan stays on as a guard: a
        filter the graph does not cover would still fill the results instead of returning few.
        """
        cast, where = vector_sql(model_id, dimensions)
        async with transaction(db) as conn:
            await conn.execute(
                f"SET LOCAL hnsw.ef_search = {int(self.config.search_ef)};"
                " SET LOCAL hnsw.iterative_scan = 'relaxed_order'"
            )
            return await conn.fetch(
                f"""
                WITH nearest AS (
                    SELECT message_id, document_id, chunk_start, chunk_end, {cast} <=> $2::real[]::vector AS distance
                    FROM memory_index WHERE {where} AND {person_filter(account_id)} AND account_id = $1
                    ORDER BY {cast} <=> $2::real[]::vector LIMIT $3
                )
                SELECT n.*, m.channel, m.direction, m.author, coalesce(m.body, d.title || E'\n' || d.body) AS text,
                       coalesce(m.created_at, d.created_at) AS created_at, d.title, d.kind
                FROM nearest n
                LEFT JOIN messages m ON m.id = n.message_id
                LEFT JOIN memory_documents d ON d.id = n.document_id
                ORDER BY n.distance
                """,
                account_id,
                vector,
                limit,
            )


class MemorySearchSlot:
    """The ``memory`` slot (``core.slots``): the occupant named for the account answers, the
    built-in when none is, and the built-in for any call on which the occupant fails."""

    def __init__(self, builtin: MemorySearch, registry: SlotRegistry = SLOTS):
        self.registry = registry
        self.spec = registry.register(
            SlotSpec(MEMORY, ("search",), builtin, is_list_of(SearchHit), MEMORY_TIMEOUT,
                     "search on request over the person's messages and documents")
        )  # fmt: skip

    async def search(self, db: Queries, account_id: UUID, query: str, *, limit: int) -> list[SearchHit]:
        hits = await self.registry.call(db, MEMORY, account_id, "search", db, account_id, query, limit=limit)
        return list(hits)


MEMORY_SEARCH = MemorySearchSlot(BuiltinMemorySearch())
