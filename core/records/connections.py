"""A person's connected accounts (``connections``: Google, CalDAV) and followed iCalendar feeds
(``calendars`` of kind ``ical``), as ``pepper connect`` lists and removes them.

Secrets are sealed and opened in ``core.tools.connectors``; a connection's calendars go with it
(the foreign key cascades).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries


async def connections_of(db: Queries, account_id: UUID) -> list[Any]:
    """The account's connections, oldest first: ``id``, ``provider``, ``label``, ``config``,
    ``scopes``, ``sealed`` and ``plain`` (a secret is still stored in plaintext)."""
    return await db.fetch(
        "SELECT id, provider, label, config, scopes, sealed, secret <> '{}' AS plain FROM connections"
        " WHERE account_id = $1 ORDER BY created_at",
        account_id,
    )


async def google_connections(db: Queries, account_id: UUID | None = None) -> list[UUID]:
    """The ids of Google connections, oldest first: the account's, or everyone's when None."""
    if account_id is None:
        rows = await db.fetch("SELECT id FROM connections WHERE provider = 'google' ORDER BY created_at")
    else:
        rows = await db.fetch("SELECT id FROM connections WHERE account_id = $1 AND provider = 'google'", account_id)
    return [r["id"] for r in rows]


async def connections_matching(db: Queries, account_id: UUID, prefix: str) -> list[UUID]:
    """The account's connections whose id (as hex without dashes) starts with ``prefix``."""
    rows = await db.fetch(
        "SELECT id FROM connections WHERE account_id = $1 AND replace(id::text, '-', '') LIKE $2 || '%'",
        account_id,
        prefix,
    )
    return [r["id"] for r in rows]


async def provider_of(db: Queries, connection_id: UUID) -> str | None:
    return await db.fetchval("SELECT provider FROM connections WHERE id = $1", connection_id)


async def remove_connection(db: Queries, connection_id: UUID) -> None:
    await db.execute("DELETE FROM connections WHERE id = $1", connection_id)


async def calendar_name(db: Queries, calendar_id: UUID) -> str | None:
    return await db.fetchval("SELECT name FROM calendars WHERE id = $1", calendar_id)


async def feeds_of(db: Queries, account_id: UUID) -> list[Any]:
    """The account's iCalendar feeds, oldest first: ``id``, ``name``, ``remote`` (the feed's URL)."""
    return await db.fetch(
        "SELECT id, name, remote FROM calendars WHERE account_id = $1 AND kind = 'ical' ORDER BY created_at",
        account_id,
    )


async def feeds_matching(db: Queries, account_id: UUID, prefix: str) -> list[UUID]:
    """The account's iCalendar feeds whose id (as hex without dashes) starts with ``prefix``."""
    rows = await db.fetch(
        "SELECT id FROM calendars WHERE account_id = $1 AND kind = 'ical'"
        " AND replace(id::text, '-', '') LIKE $2 || '%'",
        account_id,
        prefix,
    )
    return [r["id"] for r in rows]


async def remove_calendar(db: Queries, calendar_id: UUID) -> None:
    await db.execute("DELETE FROM calendars WHERE id = $1", calendar_id)


async def imap_connections(db: Queries, account_id: UUID | None = None) -> list[Any]:
    """The IMAP mailboxes, oldest first (the account's, or everyone's when None): ``id``,
    ``label``, ``config``, ``secret``, ``sealed``."""
    return await db.fetch(
        "SELECT id, label, config, secret, sealed FROM connections WHERE provider = 'imap'"
        " AND ($1::uuid IS NULL OR account_id = $1) ORDER BY created_at",
        account_id,
    )


async def store_imap(
    db: Queries, account_id: UUID, label: str, host: str, username: str, config: str, sealed: bytes | None
) -> tuple[UUID, bool]:
    """Store the IMAP mailbox: the same host and user name (or the same name) is the same mailbox,
    updated, not a second one. Its id and whether it is new."""
    existing = await db.fetchval(
        "SELECT id FROM connections WHERE account_id = $1 AND provider = 'imap'"
        " AND ((config->>'host' = $2 AND config->>'username' = $3) OR label = $4) ORDER BY created_at LIMIT 1",
        account_id,
        host,
        username,
        label,
    )
    if existing is not None:
        await db.execute(
            "UPDATE connections SET config = $2::jsonb, sealed = $3, secret = '{}', updated_at = now() WHERE id = $1",
            existing,
            config,
            sealed,
        )
        return existing, False
    row = await db.fetchrow(
        """
        INSERT INTO connections (account_id, provider, label, config, sealed) VALUES ($1, 'imap', $2, $3::jsonb, $4)
        ON CONFLICT (account_id, provider, label) DO UPDATE SET config = EXCLUDED.config, sealed = EXCLUDED.sealed,
            secret = '{}', updated_at = now()
        RETURNING id, xmax = 0 AS created
        """,
        account_id,
        label,
        config,
        sealed,
    )
    return row["id"], row["created"]
