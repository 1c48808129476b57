"""Turn records as the text channels read them: whether a turn's delivery is settled."""

from __future__ import annotations

from uuid import UUID

from core.store.queries import Queries

# A turn's statuses once its reply's delivery was reported: a later receipt or acknowledgement
# changes nothing.
SETTLED = frozenset({"delivered", "failed"})
SETTLED_SQL = ", ".join(f"'{status}'" for status in sorted(SETTLED))


async def turn_status(db: Queries, turn_id: UUID) -> str | None:
    return await db.fetchval("SELECT status FROM turns WHERE id = $1", turn_id)
