"""Messages as the channels read them and as delivery receipts update them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from core.records.turns import SETTLED_SQL
from core.store.database import NO_FLUSH
from core.store.queries import Queries

# One statement for the common receipt: ``delivered`` after ``sent``, for a turn already settled.
# Such a receipt (or one for no turn) changes nothing but the reply's shown status, so its commit
# does not wait for the disk: a crash may lose that status, never a write or a turn's settling.
# Every other receipt commits durably, as it may be the one that settles its turn.
RECORD_STATUS = f"""
    WITH updated AS (
        UPDATE messages SET delivery_status = $2
        WHERE provider_message_id = $1 AND direction = 'outbound'
        RETURNING turn_id
    )
    SELECT u.turn_id, t.status AS turn_status,
        CASE WHEN u.turn_id IS NULL OR t.status IN ({SETTLED_SQL}) THEN {NO_FLUSH} END
    FROM updated u LEFT JOIN turns t ON t.id = u.turn_id
"""


async def record_receipt(db: Queries, provider_message_id: str, status: str) -> Any:
    """Set the delivery status of the reply the provider knows by this id: its ``turn_id`` and
    ``turn_status``, or None when no reply has that id."""
    return await db.fetchrow(RECORD_STATUS, provider_message_id, status)


async def reply_statuses(db: Queries, turn_id: UUID) -> list[str]:
    """The delivery status of every message of the turn's reply (one per part)."""
    statuses = await db.fetchval(
        "SELECT array_agg(delivery_status) FROM messages WHERE turn_id = $1 AND direction = 'outbound'", turn_id
    )
    return list(statuses or [])


async def resolve_stuck_sending(db: Queries, *, older_than: timedelta) -> list[UUID]:
    """Replies left ``sending`` with no provider id for longer than ``older_than`` whose texts no
    worker will take again (a crash from before replies were looked up at the provider, or a
    scheduled run's): marked ``sent-unknown`` (``core.conversation.SENT_UNKNOWN``), never sent
    again. Return their turns not settled yet, for the caller to settle as not delivered."""
    rows = await db.fetch(
        f"""
        WITH stuck AS (
            UPDATE messages m SET delivery_status = 'sent-unknown'
            WHERE m.direction = 'outbound' AND m.delivery_status = 'sending' AND m.provider_message_id IS NULL
              AND m.created_at < now() - $1::interval
              AND NOT EXISTS (SELECT 1 FROM messages i WHERE i.turn_id = m.turn_id AND i.direction = 'inbound'
                              AND i.handling IN ('queued', 'running'))
            RETURNING m.turn_id
        )
        SELECT DISTINCT s.turn_id FROM stuck s JOIN turns t ON t.id = s.turn_id
        WHERE t.status NOT IN ({SETTLED_SQL})
        """,
        older_than,
    )
    return [r["turn_id"] for r in rows]


async def latest(db: Queries, conversation_id: UUID, limit: int) -> list[Any]:
    """The conversation's last ``limit`` messages, oldest first."""
    return await db.fetch(
        """
        SELECT * FROM (SELECT * FROM messages WHERE conversation_id = $1 ORDER BY id DESC LIMIT $2) recent
        ORDER BY id
        """,
        conversation_id,
        limit,
    )


async def after(db: Queries, conversation_id: UUID, message_id: int) -> list[Any]:
    """The conversation's messages recorded after ``message_id``, oldest first."""
    return await db.fetch(
        "SELECT * FROM messages WHERE conversation_id = $1 AND id > $2 ORDER BY id", conversation_id, message_id
    )


async def message(db: Queries, message_id: int) -> Any:
    return await db.fetchrow("SELECT * FROM messages WHERE id = $1", message_id)
