"""What the web chat reads and records beyond messages: the signed-in name, reply acknowledgements."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries

_OWN_WEB_REPLY = """
    m.id = $1 AND m.conversation_id = c.id AND c.account_id = $2 AND m.direction = 'outbound'
    AND m.channel = 'web'
"""


async def account_name(db: Queries, account_id: UUID) -> str | None:
    return await db.fetchval("SELECT name FROM accounts WHERE id = $1", account_id)


async def mark_reply_read(db: Queries, message_id: int, account_id: UUID) -> Any:
    """Mark the account's web reply read; its ``turn_id``, or None when it was read already or is
    not the account's web reply. Conditional on not yet read, so two acknowledgements racing
    deliver the turn once."""
    return await db.fetchrow(
        f"""
        UPDATE messages m SET delivery_status = 'read' FROM conversations c
        WHERE {_OWN_WEB_REPLY} AND m.delivery_status IS DISTINCT FROM 'read'
        RETURNING m.turn_id
        """,
        message_id,
        account_id,
    )


async def is_own_reply(db: Queries, message_id: int, account_id: UUID) -> bool:
    found = await db.fetchval(
        f"SELECT 1 FROM messages m, conversations c WHERE {_OWN_WEB_REPLY}", message_id, account_id
    )
    return bool(found)
