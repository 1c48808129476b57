"""The email inbox's records: webhook tokens already seen (replays), and where a reply is copied."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def claim_webhook_token(db: Queries, token: str, *, keep_seconds: int) -> bool:
    """Remember a webhook token; False when it was seen before (a replay). Prunes the ones older
    than ``keep_seconds``."""
    await db.execute("DELETE FROM email_webhook_tokens WHERE seen_at < now() - make_interval(secs => $1)", keep_seconds)
    claimed = await db.fetchval(
        "INSERT INTO email_webhook_tokens (token) VALUES ($1) ON CONFLICT DO NOTHING RETURNING true", token
    )
    return bool(claimed)


async def owner_address(db: Queries, account_id: UUID) -> str | None:
    """The account's own address for CC: its first verified email handle."""
    return await db.fetchval(
        "SELECT value FROM handles WHERE account_id = $1 AND kind = 'email' AND verified_at IS NOT NULL"
        " ORDER BY verified_at, created_at LIMIT 1",
        account_id,
    )


# --- Pepper's own inbox as a mailbox to read ----------------------------------------------------
#
# Mail that reached Pepper's address is stored as inbound ``email`` messages (``gateway.email_channel``
# keeps its headers in ``meta``); the mail-reading tools search it beside Gmail and IMAP.


async def own_mail(
    db: Queries, account_id: UUID, *, senders: tuple[str, ...] = (), recipients: tuple[str, ...] = (),
    subjects: tuple[str, ...] = (), words: tuple[str, ...] = (), since: Any = None, before: Any = None,
    limit: int = 20,
) -> tuple[list[Any], int]:  # fmt: skip
    """The newest mail that reached Pepper's address for the account, matching every filter (each a
    case-insensitive substring), and how many matched: rows of ``id``, ``meta``, ``created_at``."""

    def like(values: tuple[str, ...]) -> list[str]:
        return ["%" + v.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for v in values]

    rows = await db.fetch(
        """
        SELECT m.id, m.meta, m.created_at, count(*) OVER () AS matched
        FROM messages m JOIN conversations c ON c.id = m.conversation_id
        WHERE c.account_id = $1 AND m.channel = 'email' AND m.direction = 'inbound'
          AND (SELECT bool_and(concat_ws(' ', m.meta->>'sender', m.meta->>'sender_name') ILIKE p)
               FROM unnest($2::text[]) p) IS NOT FALSE
          AND (SELECT bool_and(coalesce(m.meta->>'recipient', '') ILIKE p) FROM unnest($3::text[]) p) IS NOT FALSE
          AND (SELECT bool_and(coalesce(m.meta->>'subject', '') ILIKE p) FROM unnest($4::text[]) p) IS NOT FALSE
          AND (SELECT bool_and(m.body ILIKE p) FROM unnest($5::text[]) p) IS NOT FALSE
          AND ($6::timestamptz IS NULL OR m.created_at >= $6)
          AND ($7::timestamptz IS NULL OR m.created_at < $7)
        ORDER BY m.created_at DESC, m.id DESC LIMIT $8
        """,
        account_id, like(senders), like(recipients), like(subjects), like(words), since, before, limit,
    )  # fmt: skip
    return list(rows), (rows[0]["matched"] if rows else 0)


async def own_thread(db: Queries, account_id: UUID, message_id: int) -> list[Any]:
    """The conversation of one mail in Pepper's inbox, oldest first: the mails that share its
    thread root (its first References entry, else its own Message-Id)."""
    return list(
        await db.fetch(
            """
            WITH one AS (
                SELECT coalesce(m.meta->'references'->>0, m.meta->>'in_reply_to', m.meta->>'message_id') AS root
                FROM messages m JOIN conversations c ON c.id = m.conversation_id
                WHERE m.id = $2 AND c.account_id = $1 AND m.channel = 'email' AND m.direction = 'inbound'
            )
            SELECT m.id, m.meta, m.created_at FROM messages m JOIN conversations c ON c.id = m.conversation_id, one
            WHERE c.account_id = $1 AND m.channel = 'email' AND m.direction = 'inbound'
              AND (m.id = $2 OR m.meta->>'message_id' = one.root OR m.meta->>'in_reply_to' = one.root
                   OR m.meta->'references' ? one.root)
            ORDER BY m.created_at, m.id LIMIT 50
            """,
            account_id,
            message_id,
        )
    )
