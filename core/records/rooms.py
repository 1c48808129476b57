"""What Pepper keeps of its rooms: the rooms and their members, every room message once, Pepper's
posts (recorded before they are sent), the room's shared notes, each member's calendar sharing
levels, Matrix link codes and where ``/sync`` stands."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from core.errors import InvalidInput, NotFound
from core.store.queries import Queries

SHARE_LEVELS: tuple[str, ...] = ("nothing", "free_busy", "titles", "everything")


@dataclass(frozen=True)
class Room:
    id: UUID
    matrix_id: str
    name: str
    created_at: datetime | None = None  # when Pepper started following it


@dataclass(frozen=True)
class Member:
    account_id: UUID
    name: str
    matrix_id: str | None  # their verified Matrix ID, None until they link one


def _room(row: Any) -> Room:
    return Room(row["id"], row["matrix_id"], row["name"], row["created_at"])


async def create_room(db: Queries, matrix_id: str, name: str) -> Room:
    row = await db.fetchrow("INSERT INTO rooms (matrix_id, name) VALUES ($1, $2) RETURNING *", matrix_id, name.strip())
    return _room(row)


async def get_room(db: Queries, ref: str) -> Room:
    """A room by its id, its Matrix room id, or its name when that is unique."""
    try:
        row = await db.fetchrow("SELECT * FROM rooms WHERE id = $1", UUID(ref))
    except ValueError:
        rows = await db.fetch("SELECT * FROM rooms WHERE matrix_id = $1 OR name = $1", ref)
        if len(rows) > 1:
            raise InvalidInput(f"{len(rows)} rooms are named {ref!r}; use the room id") from None
        row = rows[0] if rows else None
    if row is None:
        raise NotFound(f"no room {ref}")
    return _room(row)


async def room_by_matrix_id(db: Queries, matrix_id: str) -> Room | None:
    row = await db.fetchrow("SELECT * FROM rooms WHERE matrix_id = $1", matrix_id)
    return _room(row) if row else None


async def followed_rooms(db: Queries) -> dict[str, Room]:
    return {r["matrix_id"]: _room(r) for r in await db.fetch("SELECT * FROM rooms")}


async def list_rooms(db: Queries) -> list[tuple[Room, list[str]]]:
    rows = await db.fetch(
        """
        SELECT r.*, coalesce(array_agg(a.name ORDER BY a.name) FILTER (WHERE a.id IS NOT NULL), '{}') AS names
        FROM rooms r LEFT JOIN room_members m ON m.room_id = r.id LEFT JOIN accounts a ON a.id = m.account_id
        GROUP BY r.id ORDER BY r.created_at
        """
    )
    return [(_room(r), list(r["names"])) for r in rows]


async def add_member(db: Queries, room_id: UUID, account_id: UUID) -> bool:
    """Add a member; False when they already were one."""
    done = await db.fetchval(
        "INSERT INTO room_members (room_id, account_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
        room_id,
        account_id,
    )
    return bool(done)


async def member_rooms(db: Queries, account_id: UUID) -> list[Room]:
    """The rooms the account is a member of, by name."""
    rows = await db.fetch(
        "SELECT r.* FROM rooms r JOIN room_members m ON m.room_id = r.id WHERE m.account_id = $1 ORDER BY r.name, r.id",
        account_id,
    )
    return [_room(r) for r in rows]


async def is_member(db: Queries, room_id: UUID, account_id: UUID) -> bool:
    found = await db.fetchval("SELECT 1 FROM room_members WHERE room_id = $1 AND account_id = $2", room_id, account_id)
    return bool(found)


_MATRIX_OF = """
    (SELECT h.value FROM handles h WHERE h.account_id = a.id AND h.kind = 'matrix' AND h.verified_at IS NOT NULL
     ORDER BY h.verified_at LIMIT 1)
"""


async def members(db: Queries, room_id: UUID) -> list[Member]:
    rows = await db.fetch(
        f"""
        SELECT a.id, a.name, {_MATRIX_OF} AS matrix_id FROM room_members m JOIN accounts a ON a.id = m.account_id
        WHERE m.room_id = $1 ORDER BY a.name, a.id
        """,
        room_id,
    )
    return [Member(r["id"], r["name"], r["matrix_id"]) for r in rows]


async def verified_matrix_id(db: Queries, account_id: UUID) -> str | None:
    return await db.fetchval(f"SELECT {_MATRIX_OF} FROM accounts a WHERE a.id = $1", account_id)


async def account_for_matrix_id(db: Queries, matrix_id: str) -> UUID | None:
    """The account whose verified Matrix ID is ``matrix_id``, in any room or none."""
    return await db.fetchval(
        "SELECT account_id FROM handles WHERE kind = 'matrix' AND value = lower($1) AND verified_at IS NOT NULL"
        " ORDER BY verified_at LIMIT 1",
        matrix_id,
    )


async def follow_invited(db: Queries, matrix_id: str, name: str, inviter: UUID) -> Room:
    """Record a room Pepper was invited to by a linked member (the inviter becomes its member);
    the existing record when it was recorded before. A name another room has gets the room's id."""
    found = await room_by_matrix_id(db, matrix_id)
    if found is not None:
        await add_member(db, found.id, inviter)
        return found
    name = name.strip() or f"room {matrix_id[1:9]}"
    if await db.fetchval("SELECT 1 FROM rooms WHERE name = $1", name):
        name = f"{name} ({matrix_id})"
    room = await create_room(db, matrix_id, name)
    await add_member(db, room.id, inviter)
    return room


async def member_for_sender(db: Queries, room_id: UUID, sender: str) -> UUID | None:
    """The member whose verified Matrix ID is ``sender`` (the homeserver's sender field), or None."""
    return await db.fetchval(
        """
        SELECT h.account_id FROM handles h JOIN room_members m ON m.account_id = h.account_id AND m.room_id = $1
        WHERE h.kind = 'matrix' AND h.value = lower($2) AND h.verified_at IS NOT NULL
        """,
        room_id,
        sender,
    )


# --- /sync position and the events it brings -------------------------------------------------


async def next_batch(db: Queries, user_id: str) -> str | None:
    return await db.fetchval("SELECT next_batch FROM matrix_sync WHERE user_id = $1", user_id)


async def save_next_batch(db: Queries, user_id: str, token: str) -> None:
    await db.execute(
        """
        INSERT INTO matrix_sync (user_id, next_batch) VALUES ($1, $2)
        ON CONFLICT (user_id) DO UPDATE SET next_batch = excluded.next_batch, updated_at = now()
        """,
        user_id,
        token,
    )


@dataclass(frozen=True)
class StoredEvent:
    id: int
    room_id: UUID
    event_id: str
    sender: str
    account_id: UUID | None
    body: str
    sent_at: datetime
    reply_to: str | None
    handling: str
    reason: str | None


def _event(row: Any) -> StoredEvent:
    return StoredEvent(row["id"], row["room_id"], row["event_id"], row["sender"], row["account_id"], row["body"],
                       row["sent_at"], row["reply_to"], row["handling"], row["reason"])  # fmt: skip


async def record_event(
    db: Queries, room_id: UUID, event_id: str, sender: str, account_id: UUID | None, body: str, sent_at: datetime,
    *, from_pepper: bool, reply_to: str | None, handling: str, reason: str | None,
) -> StoredEvent | None:  # fmt: skip
    """Store a room message; None when it was stored before (the same event id)."""
    row = await db.fetchrow(
        """
        INSERT INTO room_events (room_id, event_id, sender, account_id, body, sent_at, from_pepper, reply_to, handling,
                                 reason)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (event_id) DO NOTHING RETURNING *
        """,
        room_id, event_id, sender, account_id, body, sent_at, from_pepper, reply_to, handling, reason,
    )  # fmt: skip
    return _event(row) if row else None


async def known_event(db: Queries, event_id: str) -> bool:
    return bool(await db.fetchval("SELECT 1 FROM room_events WHERE event_id = $1", event_id))


async def is_pepper_event(db: Queries, event_id: str) -> bool:
    found = await db.fetchval(
        "SELECT 1 FROM room_posts WHERE event_id = $1 UNION ALL "
        "SELECT 1 FROM room_events WHERE event_id = $1 AND from_pepper LIMIT 1",
        event_id,
    )
    return bool(found)


async def last_answered(db: Queries, room_id: UUID, account_id: UUID) -> datetime | None:
    """When Pepper last posted an answer to this member in this room."""
    return await db.fetchval(
        "SELECT max(posted_at) FROM room_posts WHERE room_id = $1 AND to_account = $2", room_id, account_id
    )


async def agent_answers_since_member(db: Queries, room_id: UUID) -> int:
    """Pepper's answers to non-members since a member last wrote in the room (the agent-loop count)."""
    return await db.fetchval(
        """
        SELECT count(*) FROM room_posts p WHERE p.room_id = $1 AND p.to_agent
        AND p.created_at > coalesce((SELECT max(created_at) FROM room_events
                                     WHERE room_id = $1 AND account_id IS NOT NULL), '-infinity')
        """,
        room_id,
    )


async def queued_events(db: Queries, limit: int = 50) -> list[StoredEvent]:
    rows = await db.fetch("SELECT * FROM room_events WHERE handling = 'queued' ORDER BY id LIMIT $1", limit)
    return [_event(r) for r in rows]


async def finish_event(db: Queries, event_id: int, *, turn_id: UUID | None, reason: str | None = None) -> None:
    await db.execute(
        "UPDATE room_events SET handling = 'answered', turn_id = coalesce($2, turn_id), reason = coalesce($3, reason)"
        " WHERE id = $1",
        event_id,
        turn_id,
        reason,
    )


async def recent_messages(db: Queries, room_id: UUID, limit: int = 30) -> list[dict[str, Any]]:
    """The room's last messages, oldest first, with the member's name where the sender is one."""
    rows = await db.fetch(
        """
        SELECT e.event_id, e.sender, a.name, e.body, e.sent_at, e.from_pepper FROM room_events e
        LEFT JOIN accounts a ON a.id = e.account_id WHERE e.room_id = $1 ORDER BY e.id DESC LIMIT $2
        """,
        room_id,
        limit,
    )
    return [dict(r) for r in reversed(rows)]


# --- Pepper's posts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    txn_id: str
    room_matrix_id: str
    body: str
    event_id: str | None
    turn_id: UUID | None
    reply_to: str | None  # the event it answers


async def record_post(
    db: Queries, txn_id: str, room_id: UUID, body: str, *, turn_id: UUID | None, answers: int | None,
    to_account: UUID | None, to_agent: bool,
) -> bool:  # fmt: skip
    """Record a post before it is sent; False when that transaction id was recorded before."""
    done = await db.fetchval(
        """
        INSERT INTO room_posts (txn_id, room_id, turn_id, answers, to_account, to_agent, body)
        VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (txn_id) DO NOTHING RETURNING 1
        """,
        txn_id, room_id, turn_id, answers, to_account, to_agent, body,
    )  # fmt: skip
    return bool(done)


async def mark_posted(db: Queries, txn_id: str, event_id: str) -> None:
    await db.execute(
        "UPDATE room_posts SET event_id = $2, posted_at = coalesce(posted_at, now()) WHERE txn_id = $1",
        txn_id,
        event_id,
    )


async def mark_post_failed(db: Queries, txn_id: str, errcode: str) -> None:
    await db.execute("UPDATE room_posts SET failed = $2 WHERE txn_id = $1", txn_id, errcode)


async def post_failed(db: Queries, txn_id: str) -> bool:
    return bool(await db.fetchval("SELECT failed IS NOT NULL FROM room_posts WHERE txn_id = $1", txn_id))


_POSTS = """
    SELECT p.txn_id, r.matrix_id, p.body, p.event_id, p.turn_id, e.event_id AS reply_to
    FROM room_posts p JOIN rooms r ON r.id = p.room_id LEFT JOIN room_events e ON e.id = p.answers
"""


def _post(row: Any) -> Post:
    return Post(row["txn_id"], row["matrix_id"], row["body"], row["event_id"], row["turn_id"], row["reply_to"])


async def unsent_posts(db: Queries) -> list[Post]:
    rows = await db.fetch(f"{_POSTS} WHERE p.event_id IS NULL AND p.failed IS NULL ORDER BY p.created_at, p.txn_id")
    return [_post(r) for r in rows]


async def post(db: Queries, txn_id: str) -> Post | None:
    row = await db.fetchrow(f"{_POSTS} WHERE p.txn_id = $1", txn_id)
    return _post(row) if row else None


async def room_by_id(db: Queries, room_id: UUID) -> Room:
    row = await db.fetchrow("SELECT * FROM rooms WHERE id = $1", room_id)
    if row is None:
        raise NotFound(f"no room {room_id}")
    return _room(row)


# --- Shared notes and to-dos ---------------------------------------------------------------------


async def add_note(db: Queries, room_id: UUID, kind: str, body: str) -> int:
    return await db.fetchval(
        "INSERT INTO room_notes (room_id, kind, body) VALUES ($1, $2, $3) RETURNING id", room_id, kind, body
    )


async def notes(db: Queries, room_id: UUID, limit: int = 50) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT id, kind, body, done FROM room_notes WHERE room_id = $1 ORDER BY id DESC LIMIT $2", room_id, limit
    )
    return [dict(r) for r in reversed(rows)]


async def complete_todo(db: Queries, room_id: UUID, note_id: int) -> bool:
    done = await db.fetchval(
        "UPDATE room_notes SET done = true WHERE id = $1 AND room_id = $2 AND kind = 'todo' RETURNING 1",
        note_id,
        room_id,
    )
    return bool(done)


# --- Calendar sharing levels ---------------------------------------------------------------------


async def set_share(db: Queries, room_id: UUID, account_id: UUID, calendar_id: UUID, level: str) -> None:
    """Set what a member shares of one of their calendars with a room (their own calendar only)."""
    if level not in SHARE_LEVELS:
        raise InvalidInput(f"unknown sharing level {level!r}; use one of {', '.join(SHARE_LEVELS)}")
    owner = await db.fetchval("SELECT account_id FROM calendars WHERE id = $1", calendar_id)
    if owner != account_id:
        raise InvalidInput("that calendar is not this member's")
    try:
        await db.execute(
            """
            INSERT INTO room_calendar_shares (room_id, account_id, calendar_id, level) VALUES ($1, $2, $3, $4)
            ON CONFLICT (room_id, account_id, calendar_id) DO UPDATE SET level = excluded.level, changed_at = now()
            """,
            room_id,
            account_id,
            calendar_id,
            level,
        )
    except asyncpg.ForeignKeyViolationError:
        raise InvalidInput("only a member of the room can share with it") from None


async def shares(db: Queries, room_id: UUID) -> dict[tuple[UUID, UUID], str]:
    """(account, calendar) -> level, for every level set in the room."""
    rows = await db.fetch("SELECT account_id, calendar_id, level FROM room_calendar_shares WHERE room_id = $1", room_id)
    return {(r["account_id"], r["calendar_id"]): r["level"] for r in rows}


# --- Linking a Matrix ID -------------------------------------------------------------------------


async def set_link_code(db: Queries, handle_id: UUID, code_hash: str, dm_room: str, expires_at: datetime) -> None:
    await db.execute(
        """
        INSERT INTO matrix_link_codes (handle_id, code_hash, dm_room, expires_at) VALUES ($1, $2, $3, $4)
        ON CONFLICT (handle_id) DO UPDATE SET code_hash = excluded.code_hash, dm_room = excluded.dm_room,
            expires_at = excluded.expires_at, attempts = 0, created_at = now()
        """,
        handle_id,
        code_hash,
        dm_room,
        expires_at,
    )


async def link_code(db: Queries, handle_id: UUID) -> Any:
    """The pending code's row (code_hash, attempts, expires_at), counting this attempt."""
    return await db.fetchrow(
        "UPDATE matrix_link_codes SET attempts = attempts + 1 WHERE handle_id = $1 RETURNING code_hash, attempts,"
        " expires_at",
        handle_id,
    )


async def drop_link_code(db: Queries, handle_id: UUID) -> None:
    await db.execute("DELETE FROM matrix_link_codes WHERE handle_id = $1", handle_id)


# --- Skills shared to a room ---------------------------------------------------------------------


async def share_skill(db: Queries, room_id: UUID, account_id: UUID, name: str) -> bool:
    """Share the member's own skill ``name`` with the room; False when it already was."""
    try:
        done = await db.fetchval(
            "INSERT INTO room_skills (room_id, account_id, name) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            room_id,
            account_id,
            name,
        )
    except asyncpg.ForeignKeyViolationError:
        raise InvalidInput("only a member can share a skill, and only one of their own") from None
    if not done:
        owner = await db.fetchval("SELECT account_id FROM room_skills WHERE room_id = $1 AND name = $2", room_id, name)
        if owner != account_id:
            raise InvalidInput(f"another member already shares a skill named {name!r} with this room")
    return bool(done)


async def unshare_skill(db: Queries, room_id: UUID, account_id: UUID, name: str) -> bool:
    done = await db.fetchval(
        "DELETE FROM room_skills WHERE room_id = $1 AND account_id = $2 AND name = $3 RETURNING 1",
        room_id,
        account_id,
        name,
    )
    return bool(done)


async def room_skill_sources(db: Queries, room_id: UUID) -> list[tuple[str, str]]:
    """``(name, text)`` of the skills shared with the room, as their owners' current text."""
    rows = await db.fetch(
        "SELECT s.name, s.source FROM room_skills r"
        " JOIN user_skills s ON s.account_id = r.account_id AND s.name = r.name WHERE r.room_id = $1 ORDER BY s.name",
        room_id,
    )
    return [(r["name"], r["source"]) for r in rows]
