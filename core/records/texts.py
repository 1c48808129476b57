"""Texts Pepper sends for a person (``outbound_texts``) and numbers that said STOP to a line
without being anyone's handle (``text_opt_outs``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def set_opt_out(db: Queries, number: str, *, stopped: bool) -> None:
    """STOP (``stopped``) or START from a number that is no one's handle."""
    if stopped:
        await db.execute("INSERT INTO text_opt_outs (number) VALUES ($1) ON CONFLICT DO NOTHING", number)
    else:
        await db.execute("DELETE FROM text_opt_outs WHERE number = $1", number)


async def opted_out(db: Queries, number: str, channel: str) -> bool:
    """Whether the number said STOP: as a handle (any account's consent for the channel) or not."""
    return bool(
        await db.fetchval(
            """
            SELECT EXISTS (SELECT 1 FROM text_opt_outs WHERE number = $1)
                OR EXISTS (SELECT 1 FROM handles h JOIN handle_consents c ON c.handle_id = h.id
                           WHERE h.kind = 'phone' AND h.value = $1 AND c.channel = $2 AND c.opted_out)
            """,
            number,
            channel,
        )
    )


async def texts_of(db: Queries, account_id: UUID, *, limit: int = 20) -> list[Any]:
    return await db.fetch(
        "SELECT id, channel, to_number, contact, body, status, error, created_at FROM outbound_texts"
        " WHERE account_id = $1 ORDER BY id DESC LIMIT $2",
        account_id,
        limit,
    )


async def record_receipt(db: Queries, sid: str, status: str) -> bool:
    """Twilio's delivery receipt for a text Pepper sent for someone; False when no text has that id.
    A receipt never moves a text back (a late "sent" after "delivered" changes nothing)."""
    settled = {"delivered": "delivered", "read": "delivered", "failed": "failed", "undelivered": "failed"}
    new = settled.get(status)
    found = await db.fetchval("SELECT status FROM outbound_texts WHERE sid = $1", sid)
    if found is None:
        return False
    if new is not None:
        await db.execute(
            "UPDATE outbound_texts SET status = $2, error = CASE WHEN $2 = 'failed' THEN $3 ELSE error END"
            " WHERE sid = $1 AND status = 'sent'",
            sid, new, f"Twilio reported {status}",
        )  # fmt: skip
    return True


async def drafts_of(db: Queries, account_id: UUID) -> list[Any]:
    """Unsent text drafts (a scheduled run held them back), oldest first."""
    return await db.fetch(
        "SELECT id, channel, to_number, from_number, contact, body FROM outbound_texts"
        " WHERE account_id = $1 AND status = 'draft' ORDER BY id",
        account_id,
    )


async def edit_draft(db: Queries, account_id: UUID, draft_id: int, body: str) -> bool:
    """The person's new text for an unsent draft; False when there is no such draft."""
    found = await db.fetchval(
        "UPDATE outbound_texts SET body = $3 WHERE id = $1 AND account_id = $2 AND status = 'draft' RETURNING id",
        draft_id, account_id, body,
    )  # fmt: skip
    return found is not None


async def discard_draft(db: Queries, account_id: UUID, draft_id: int) -> bool:
    found = await db.fetchval(
        "UPDATE outbound_texts SET status = 'discarded' WHERE id = $1 AND account_id = $2 AND status = 'draft'"
        " RETURNING id",
        draft_id, account_id,
    )  # fmt: skip
    return found is not None
