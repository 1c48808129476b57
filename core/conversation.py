"""The one conversation per account, its messages, and the record of each turn.

Inbound messages are recorded before any expensive work, keyed by the provider's id (unique per
channel), so a retried webhook delivery finds its message and starts no second turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, NotFound
from core.store.database import NO_FLUSH
from core.store.queries import Queries

MESSAGE_CHANNELS: tuple[str, ...] = ("sms", "whatsapp", "voice", "web", "email", "cli", "answering", "plugin")
TURN_KINDS: tuple[str, ...] = ("live", "scheduled", "room", "call", "replay")
# The JSON parts of a turn record that later features fill in.
TURN_RECORD_PARTS: tuple[str, ...] = (
    "prompt", "rounds", "tool_calls", "gate_decisions", "staged_writes",
    "committed_writes", "usage", "timings", "delivery", "session",
    "skills",
)  # fmt: skip


# An inbound message's ``author`` when it is not the conversation's person (migration 0107): a
# caller on the owner's line before they proved who they are. Their words are never shown as the
# person's (``core.memory.exchanges``, search).
UNVERIFIED_CALLER = "unverified_caller"


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: UUID
    channel: str
    direction: str
    body: str
    provider_message_id: str | None
    turn_id: UUID | None
    created_at: datetime
    author: str | None = None  # None: the person (inbound) or Pepper (outbound); else UNVERIFIED_CALLER


def _message(row: Any) -> Message:
    return Message(
        row["id"], row["conversation_id"], row["channel"], row["direction"], row["body"],
        row["provider_message_id"], row["turn_id"], row["created_at"], row.get("author"),
    )  # fmt: skip


async def conversation_for(db: Queries, account_id: UUID) -> UUID:
    conversation_id = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account_id)
    if conversation_id is None:
        raise NotFound(f"no conversation for account {account_id}")
    return conversation_id


async def record_inbound(
    db: Queries,
    account_id: UUID,
    channel: str,
    body: str,
    *,
    provider_message_id: str | None = None,
    handle_id: UUID | None = None,
    handling: str | None = None,
    meta: dict[str, Any] | None = None,
    author: str | None = None,
) -> tuple[Message, bool]:
    """Record a message from the person; return it and whether this call created it.

    A second delivery with the same ``(channel, provider_message_id)`` returns the first
    message and ``False``: the caller must not start another turn for it. ``handling`` is
    ``queued`` for a message that needs a turn (see :func:`claim_turn`), ``skipped`` for one
    that does not; ``meta`` keeps channel details a reply needs. ``author``: ``UNVERIFIED_CALLER``
    for words of a caller who has not proved they are the person.
    """
    if channel not in MESSAGE_CHANNELS:
        raise InvalidInput(f"unknown channel {channel!r}")
    if author not in (None, UNVERIFIED_CALLER):
        raise InvalidInput(f"unknown message author {author!r}")
    # One statement, one round trip, for a new message and for a delivery again of one recorded
    # before (Twilio's retries: in a burst of retries, most deliveries): this is on the path of
    # every webhook's acknowledgement.
    row = await db.fetchrow(
        """
        WITH inserted AS (
            INSERT INTO messages
                (conversation_id, handle_id, channel, direction, provider_message_id, body, handling, meta, author)
            SELECT c.id, $2, $3, 'inbound', $4, $5, $6, $7::jsonb, $8 FROM conversations c WHERE c.account_id = $1
            ON CONFLICT (channel, provider_message_id) DO NOTHING
            RETURNING *, true AS created
        )
        SELECT * FROM inserted
        UNION ALL
        SELECT m.*, false FROM messages m
        WHERE $4::text IS NOT NULL AND m.channel = $3 AND m.provider_message_id = $4
          AND NOT EXISTS (SELECT 1 FROM inserted)
        """,
        account_id,
        handle_id,
        channel,
        provider_message_id,
        body,
        handling,
        json.dumps(meta or {}),
        author,
    )
    if row is not None:
        return _message(row), bool(row["created"])
    existing = None
    if provider_message_id is not None:
        # The first delivery committed while this statement ran (its snapshot predates it).
        existing = await db.fetchrow(
            "SELECT * FROM messages WHERE channel = $1 AND provider_message_id = $2", channel, provider_message_id
        )
    if existing is None:
        raise NotFound(f"no conversation for account {account_id}")
    return _message(existing), False


# Sessions with this setting record messages without announcing them in the same transaction; the
# caller announces them right after with :func:`announce_message`. Why: NOTIFY takes a global lock
# held through the commit's flush to disk, so durable commits that notify queue up one behind the
# other; an announcement alone writes nothing to flush, and holds the lock for microseconds.
ANNOUNCE_LATER = {"pepper.announce": "later"}


async def announce_message(db: Queries, message: Message, *, queued: bool = False) -> None:
    """The announcements the message triggers skip in ``ANNOUNCE_LATER`` sessions (and for replies,
    :func:`record_outbound`): to open chats (``pepper_messages``) and, for a queued one, to the turn
    workers (``pepper_turns``)."""
    await db.execute(
        """
        SELECT pg_notify('pepper_messages', json_build_object('conversation_id', $1::uuid, 'id', $2::bigint)::text),
               CASE WHEN $3 THEN pg_notify('pepper_turns', $2::text) END
        """,
        message.conversation_id,
        message.id,
        queued,
    )


# The most texts of one burst a single turn answers: a bound on that turn's prompt.
BURST_LIMIT = 20


async def claim_turn(db: Queries, worker: int, *, burst: int = BURST_LIMIT) -> list[Any]:
    """Take the next turn's messages for answering: none when there is nothing to answer.

    The oldest queued inbound message of a conversation that no turn is answering, with the texts
    of the same burst queued after it (migration 0102, ``pepper_claim_turn``): one person's
    messages are answered one turn at a time, and texts that arrived meanwhile by one turn.
    ``worker`` is the backend pid of the claiming worker's own long-lived connection (see
    :func:`release_orphans`). ``SKIP LOCKED`` lets several workers claim at once, each a
    different conversation: a message is claimed exactly once. The rows, oldest first, carry what
    a reply needs, and ``turn_id``, set when a turn already started for them (an earlier worker
    died mid-turn).

    The claim commits without waiting for the disk: lost in a crash, the messages are simply
    queued again, and the reply's durable record flushes it before anything is sent.
    """
    rows = await db.fetch(
        f"""
        SELECT m.id, m.channel, m.body, m.handle_id, m.meta, m.provider_message_id, m.turn_id, c.account_id,
            {NO_FLUSH}
        FROM pepper_claim_turn($1, $2) m JOIN conversations c ON c.id = m.conversation_id
        ORDER BY m.id
        """,
        worker,
        burst,
    )
    return list(rows)


async def hold_for_scheduled_turn(db: Queries, conversation_id: UUID, *, lease: timedelta) -> bool:
    """Take the conversation for a scheduled turn, as a claim takes it for a message turn: False
    while a message turn (or another scheduled turn) is answering it. Until :func:`release_hold`,
    or until ``lease`` passes without :func:`extend_hold`, its messages wait (migration 0103)."""
    return bool(await db.fetchval("SELECT pepper_hold_conversation($1, $2::interval)", conversation_id, lease))


async def extend_hold(db: Queries, conversation_id: UUID, *, lease: timedelta) -> None:
    await db.execute(
        "UPDATE conversations SET held_until = now() + $2::interval WHERE id = $1 AND held_until IS NOT NULL",
        conversation_id,
        lease,
    )


async def release_hold(db: Queries, conversation_id: UUID) -> None:
    """End the hold; turn workers are woken if messages waited for it."""
    await db.execute(
        """
        WITH freed AS (UPDATE conversations SET held_until = NULL WHERE id = $1 RETURNING id)
        SELECT pg_notify('pepper_turns', '') FROM freed
        WHERE EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = freed.id
                      AND m.handling = 'queued' AND m.direction = 'inbound')
        """,
        conversation_id,
    )


async def release_orphans(
    db: Queries, *, stale: timedelta, expire_after: timedelta, claimers: Collection[int] | None = None
) -> None:
    """Queue again the messages whose worker died mid-turn; expire those too old to answer.

    A claim names the worker's session; a session that no longer exists means its worker is
    gone. Claims from before workers named themselves fall back to ``stale``. ``claimers``: only
    the claims of these sessions (gone for a while, :func:`gone_claimers`) are handed back, as a
    session that ended may be that of a worker still running its turns: after a restart of the
    database, or a cut connection, it listens again and carries its claims over
    (:func:`carry_claims`). None: every gone session's.
    """
    await db.execute(
        """
        UPDATE messages SET handling = 'expired'
        WHERE handling IN ('queued', 'running') AND created_at < now() - $1::interval
        """,
        expire_after,
    )
    await db.execute(
        """
        UPDATE messages SET handling = 'queued', claimed_by = NULL
        WHERE handling = 'running' AND CASE
            WHEN claimed_by IS NULL THEN created_at < now() - $1::interval
            ELSE claimed_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
                 AND ($2::integer[] IS NULL OR claimed_by = ANY($2::integer[])) END
        """,
        stale,
        None if claimers is None else list(claimers),
    )


async def gone_claimers(db: Queries) -> set[int]:
    """The sessions messages are claimed under (``handling = 'running'``) that no longer exist."""
    rows = await db.fetch(
        """
        SELECT DISTINCT claimed_by FROM messages
        WHERE handling = 'running' AND claimed_by IS NOT NULL
          AND claimed_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        """
    )
    return {r["claimed_by"] for r in rows}


async def carry_claims(db: Queries, message_ids: Sequence[int], old: Collection[int], new: int) -> set[int]:
    """A worker whose session ended (a restart of the database, a cut connection) while it was
    answering these messages claims them again under its new session ``new``: those still claimed
    under one of its ``old`` sessions, or queued again by a sweep and not yet claimed by another
    worker. Return the ids carried over; one missing is being answered by another worker."""
    rows = await db.fetch(
        """
        UPDATE messages SET claimed_by = $3, handling = 'running'
        WHERE id = ANY($1::bigint[])
          AND ((handling = 'running' AND claimed_by = ANY($2::integer[])) OR handling = 'queued')
        RETURNING id
        """,
        list(message_ids),
        list(old),
        new,
    )
    return {r["id"] for r in rows}


async def release_claims(db: Queries, message_ids: Sequence[int], claimed_by: Collection[int]) -> None:
    """Queue again messages a worker claimed (under one of its sessions ``claimed_by``) whose turn
    ended in an error before marking them: answered again as a dead worker's would be."""
    await db.execute(
        "UPDATE messages SET handling = 'queued', claimed_by = NULL"
        " WHERE id = ANY($1::bigint[]) AND handling = 'running' AND claimed_by = ANY($2::integer[])",
        list(message_ids),
        list(claimed_by),
    )


async def finish_handling(
    db: Queries, message_ids: Sequence[int], *, handling: str = "done", durable: bool = False
) -> None:
    """Claimed messages are answered (``done``) or needed no turn after all (``skipped``).

    The mark commits without waiting for the disk unless ``durable``. Lost in a crash, the
    messages come back as a dead worker's, with their turn (``turn_id``) already settled, and are
    marked done without another answer (``gateway.channels.Pipeline``): the link and the
    settled turn were flushed before this mark by the reply's own durable record (or the durable
    delivery report of a reply that could not go out), as the log is written in order. A message
    that needed no turn has none, and its second look finds the same reason to skip it. Only an
    answer sent with no turn (an apology for a turn that never opened) needs ``durable``: nothing
    else would tell that it went out. Otherwise a flush here would only make the acknowledgements
    queue for the disk behind the turn workers.
    """
    returning = "" if durable else f"RETURNING {NO_FLUSH}"
    await db.execute(
        f"UPDATE messages SET handling = $2 WHERE id = ANY($1::bigint[]) {returning}", list(message_ids), handling
    )


async def record_outbound(
    db: Queries,
    conversation_id: UUID,
    channel: str,
    body: str,
    *,
    turn_id: UUID | None = None,
    provider_message_id: str | None = None,
    delivery_status: str | None = None,
) -> Message:
    if channel not in MESSAGE_CHANNELS:
        raise InvalidInput(f"unknown channel {channel!r}")
    # Recorded, then announced in a statement of its own (migration 0101): on a pool these are two
    # transactions, and only the second notifies; in a caller's transaction, it announces at commit.
    row = await db.fetchrow(
        "SELECT * FROM pepper_record_outbound($1, $2, $3, $4, $5, $6)",
        conversation_id,
        channel,
        provider_message_id,
        body,
        turn_id,
        delivery_status,
    )
    message = _message(row)
    await announce_message(db, message)
    return message


async def record_sent_once(
    db: Queries,
    conversation_id: UUID,
    channel: str,
    body: str,
    *,
    provider_message_id: str,
    delivery_status: str,
    handle_id: UUID | None = None,
    turn_id: UUID | None = None,
) -> bool:
    """Record a message Pepper sent outside a reply's delivery (a scheduled run's result), once:
    a second record with the same ``(channel, provider_message_id)`` changes nothing. Return
    whether this call recorded it. Announced to open chats by the insert trigger."""
    if channel not in MESSAGE_CHANNELS:
        raise InvalidInput(f"unknown channel {channel!r}")
    recorded = await db.fetchval(
        """
        INSERT INTO messages (conversation_id, handle_id, channel, direction, provider_message_id, body, turn_id,
                              delivery_status)
        VALUES ($1, $2, $3, 'outbound', $4, $5, $6, $7)
        ON CONFLICT (channel, provider_message_id) DO NOTHING
        RETURNING true
        """,
        conversation_id,
        handle_id,
        channel,
        provider_message_id,
        body,
        turn_id,
        delivery_status,
    )
    return bool(recorded)


# The delivery status of a part recorded before it goes out: the parts of one reply are all
# recorded first, so a receipt for part 1 cannot settle a turn whose later parts are unsent.
UNSENT = "sending"


async def record_unsent_parts(
    db: Queries,
    conversation_id: UUID,
    channel: str,
    parts: list[str],
    *,
    handle_id: UUID | None = None,
    turn_id: UUID | None = None,
) -> list[int]:
    """Record every part of a message in parts as not yet sent, in order, before the first goes out:
    a receipt for part 1 then sees the rest unsent and settles nothing. Return their ids."""
    if channel not in MESSAGE_CHANNELS:
        raise InvalidInput(f"unknown channel {channel!r}")
    ids = await db.fetchval(
        """
        WITH parts AS (
            INSERT INTO messages (conversation_id, handle_id, channel, direction, body, turn_id, delivery_status)
            SELECT $1, $2, $3, 'outbound', part, $4, $6 FROM unnest($5::text[]) WITH ORDINALITY AS p(part, n)
            ORDER BY n
            RETURNING id
        )
        SELECT array_agg(id ORDER BY id) FROM parts
        """,
        conversation_id,
        handle_id,
        channel,
        turn_id,
        parts,
        UNSENT,
    )
    return list(ids or [])


async def mark_part_sent(db: Queries, message_id: int, provider_message_id: str, status: str = "queued") -> None:
    """A part recorded by :func:`record_unsent_parts` (or as ``sending``) went out with this provider
    id (``status``: what the provider says of it, when it was found after a crash).

    Commits without waiting for the disk: the ``sending`` row was durable before the send, and a
    mark a crash loses leaves it ``sending``, which the next worker looks up at the provider
    (``gateway.messaging.TwilioChannel.resume_unsent``) rather than sending it again. So a reply
    still costs one flush, as when it was recorded only once sent."""
    await db.execute(
        f"UPDATE messages SET provider_message_id = $2, delivery_status = $3 WHERE id = $1 RETURNING {NO_FLUSH}",
        message_id,
        provider_message_id,
        status,
    )


# A part recorded as ``sending`` whose fate a crash hid and the provider could not tell: never
# sent again (that could be a second copy), and its turn's writes are dropped.
SENT_UNKNOWN = "sent-unknown"


async def unsent_parts(db: Queries, turn_id: UUID) -> list[Any]:
    """The parts of the turn's reply still recorded as ``sending`` with no provider id (``id``,
    ``body``, ``created_at``), in order: their worker died between recording them and hearing
    back from the provider, so each may or may not have gone out."""
    return list(
        await db.fetch(
            "SELECT id, body, created_at FROM messages WHERE turn_id = $1 AND direction = 'outbound'"
            " AND delivery_status = $2 AND provider_message_id IS NULL ORDER BY id",
            turn_id,
            UNSENT,
        )
    )


async def known_provider_ids(db: Queries, channel: str, provider_message_ids: list[str]) -> set[str]:
    """Those of ``provider_message_ids`` already recorded on a message of ``channel``."""
    rows = await db.fetch(
        "SELECT provider_message_id FROM messages WHERE channel = $1 AND provider_message_id = ANY($2::text[])",
        channel,
        provider_message_ids,
    )
    return {r["provider_message_id"] for r in rows}


async def mark_parts_unknown(db: Queries, message_ids: list[int]) -> None:
    """Parts recorded as ``sending`` whose fate nobody can tell (:data:`SENT_UNKNOWN`)."""
    await db.execute("UPDATE messages SET delivery_status = $2 WHERE id = ANY($1::bigint[])", message_ids, SENT_UNKNOWN)


async def mark_parts_failed(db: Queries, message_ids: list[int]) -> None:
    """Parts that never went out (the send of one of them failed)."""
    await db.execute("UPDATE messages SET delivery_status = 'failed' WHERE id = ANY($1::bigint[])", message_ids)


async def was_sent(db: Queries, channel: str, provider_message_id: str) -> bool:
    """Whether the message with this provider id went out (a re-run after a crash must not resend)."""
    sent = await db.fetchval(
        "SELECT true FROM messages WHERE channel = $1 AND provider_message_id = $2 AND delivery_status = 'sent'",
        channel,
        provider_message_id,
    )
    return bool(sent)


async def recent_messages(db: Queries, conversation_id: UUID, limit: int = 50) -> list[Message]:
    rows = await db.fetch(
        """
        SELECT * FROM (
            SELECT * FROM messages WHERE conversation_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2
        ) recent ORDER BY created_at, id
        """,
        conversation_id,
        limit,
    )
    return [_message(r) for r in rows]


async def last_inbound_channel(db: Queries, account_id: UUID) -> str | None:
    """The channel of the person's latest message to Pepper, on any channel; None before any."""
    return await db.fetchval(
        """
        SELECT m.channel FROM messages m JOIN conversations c ON c.id = m.conversation_id
        WHERE c.account_id = $1 AND m.direction = 'inbound' ORDER BY m.created_at DESC, m.id DESC LIMIT 1
        """,
        account_id,
    )


async def start_turn(db: Queries, conversation_id: UUID, *, channel: str, kind: str = "live") -> UUID:
    if kind not in TURN_KINDS:
        raise InvalidInput(f"unknown turn kind {kind!r}")
    return await db.fetchval(
        "INSERT INTO turns (conversation_id, channel, kind) VALUES ($1, $2, $3) RETURNING id",
        conversation_id,
        channel,
        kind,
    )


async def turn_record(db: Queries, turn_id: UUID) -> Any:
    """The turn's row, with its prompt whole (``whole_prompt``: the stored prompt parts put back, or
    an older row's inline prompt); None for an unknown turn."""
    return await db.fetchrow("SELECT t.*, turn_prompt(t) AS whole_prompt FROM turns t WHERE id = $1", turn_id)


async def turn_tool_calls(db: Queries, turn_id: UUID) -> Any:
    """The turn's recorded tool calls (JSON), None when it has none."""
    return await db.fetchval("SELECT tool_calls FROM turns WHERE id = $1", turn_id)


@dataclass(frozen=True)
class OpenedTurn:
    turn_id: UUID
    conversation_id: UUID
    timezone: str
    extra: tuple[Any, ...] = ()  # the values of ``open_turn``'s ``extra`` expressions, in order


async def open_turn(
    db: Queries,
    account_id: UUID,
    *,
    channel: str,
    kind: str = "live",
    inbound_message_ids: Sequence[int] = (),
    extra: Sequence[str] = (),
) -> OpenedTurn:
    """Start a turn for the account's conversation and link its inbound messages, in one statement.

    The row is bookkeeping, not a promise to anyone: it commits without waiting for the disk. Any
    later durable commit (the turn's writes, the finished record, a message) flushes it too, as the
    log is written in order. Raises ``NotFound`` for an unknown account.

    ``extra``: scalar SQL expressions over the account id ``$1`` (the reads a turn needs before its
    first model call, such as ``core.tools.connectors.connections_select``), evaluated in the same
    statement, each a round trip saved; their values come back in ``OpenedTurn.extra``.
    """
    if kind not in TURN_KINDS:
        raise InvalidInput(f"unknown turn kind {kind!r}")
    also = "".join(f", {expression} AS extra_{i}" for i, expression in enumerate(extra))
    row = await db.fetchrow(
        f"""
        WITH turn AS (
            INSERT INTO turns (conversation_id, channel, kind)
            SELECT c.id, $2, $3 FROM conversations c WHERE c.account_id = $1
            RETURNING id, conversation_id
        ), linked AS (
            UPDATE messages SET turn_id = (SELECT id FROM turn) WHERE id = ANY($4::bigint[]) AND turn_id IS NULL
        )
        SELECT turn.id, turn.conversation_id, a.timezone, {NO_FLUSH}{also}
        FROM turn JOIN accounts a ON a.id = $1
        """,
        account_id,
        channel,
        kind,
        list(inbound_message_ids),
    )
    if row is None:
        raise NotFound(f"no account {account_id}")
    values = tuple(row[f"extra_{i}"] for i in range(len(extra)))
    return OpenedTurn(row["id"], row["conversation_id"], row["timezone"], values)


class JSONText(str):
    """A turn-record part already encoded as JSON, which ``update_turn`` stores as it is: a part
    assembled from pieces encoded once (the tool schemas of every prompt) is not encoded again."""

    __slots__ = ()


@dataclass(frozen=True)
class PromptPart:
    """A byte-stable piece of prompts (the system prefix, the list of tool schemas) as JSON,
    stored once in ``prompt_parts`` under ``hash``, the SHA-256 of ``body``."""

    hash: bytes
    body: str

    @classmethod
    def of(cls, body: str) -> PromptPart:
        return cls(hashlib.sha256(body.encode()).digest(), body)


@dataclass(frozen=True)
class PromptRecord:
    """A turn record's prompt as stored: its byte-stable parts by reference, the rest inline
    (``rest``: a JSON object; ``turn_prompt(t)`` in SQL merges the parts back into it)."""

    prefix: PromptPart  # ``system_stable``, a JSON string
    tools: PromptPart  # ``tools``, a JSON list
    rest: JSONText

    @property
    def parts(self) -> tuple[PromptPart, PromptPart]:
        return (self.prefix, self.tools)


async def update_turn(
    db: Queries,
    turn_id: UUID,
    *,
    wait_for_disk: bool = True,
    store_parts: Collection[PromptPart] = (),
    **parts: Any,
) -> None:
    """Set parts of a turn record. JSON parts are given as Python values (or ``JSONText``, or for
    ``prompt`` a ``PromptRecord``); others as columns.

    ``wait_for_disk=False``: the transaction this statement runs in (its own, or the caller's)
    commits without waiting for the disk. ``store_parts``: prompt parts to store in the same
    statement (each kept once: one already stored is left as it is), those of a ``PromptRecord``
    the caller does not know to be stored yet.
    """
    columns = {
        "status", "model", "tier", "error", "finished_at", "delivered_at", "trust", "reply", "replay_of",
        *TURN_RECORD_PARTS,
    }  # fmt: skip
    unknown = set(parts) - columns
    if unknown:
        raise InvalidInput(f"not parts of a turn record: {sorted(unknown)}")
    prompt = parts.get("prompt")
    if isinstance(prompt, PromptRecord):
        parts = {**parts, "prompt": prompt.rest, "prompt_prefix": prompt.prefix.hash, "prompt_tools": prompt.tools.hash}
    assignments, values = [], []
    for index, (name, value) in enumerate(parts.items(), start=2):
        if name in TURN_RECORD_PARTS:
            assignments.append(f"{name} = ${index}::jsonb")
            values.append(value if isinstance(value, JSONText) else json.dumps(value, default=str))
        else:
            assignments.append(f"{name} = ${index}")
            values.append(value)
    store = ""
    if store_parts:
        # In the turn's own statement, at no round trip of its own (a part may outlive the record
        # if the turn is gone, never the other way round).
        first = len(values) + 2
        store = (
            "WITH stored AS (INSERT INTO prompt_parts (hash, body) "
            f"SELECT hash, body::jsonb FROM unnest(${first}::bytea[], ${first + 1}::text[]) AS p (hash, body) "
            "ON CONFLICT (hash) DO NOTHING) "
        )
        values += [[p.hash for p in store_parts], [p.body for p in store_parts]]
    # A part is named by later records without being sent again once this one is stored, so a
    # statement that stores parts always waits for the disk.
    returning = "" if wait_for_disk or store_parts else f" RETURNING {NO_FLUSH}"
    status = await db.execute(
        f"{store}UPDATE turns SET {', '.join(assignments)} WHERE id = $1{returning}", turn_id, *values
    )
    if status.endswith(" 0"):
        raise NotFound(f"no turn {turn_id}")
