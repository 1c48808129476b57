"""Turn records as the text channels and ``pepper turns`` read them: whether a turn's delivery is
settled, and turns found by account, time, channel, kind and flags."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.store.queries import Queries

# A turn's statuses once its reply's delivery was reported: a later receipt or acknowledgement
# changes nothing.
SETTLED = frozenset({"delivered", "failed"})
SETTLED_SQL = ", ".join(f"'{status}'" for status in sorted(SETTLED))


async def turn_status(db: Queries, turn_id: UUID) -> str | None:
    return await db.fetchval("SELECT status FROM turns WHERE id = $1", turn_id)


async def unsent_reply(db: Queries, turn_id: UUID) -> str | None:
    """The reply of a turn that finished with no reply message recorded: its worker died between
    the turn and sending the reply (a single-part reply is recorded once Twilio took it)."""
    return await db.fetchval(
        "SELECT t.reply FROM turns t WHERE t.id = $1 AND t.status = 'replied' AND coalesce(t.reply, '') <> ''"
        " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id AND m.direction = 'outbound')",
        turn_id,
    )


# What a turn record says went wrong or out of the ordinary, as one flag each, computed where the
# record is (``pepper turns list --flagged`` filters on it before LIMIT). Each flag and its source:
#   failed            the turn raised (``error`` names the exception), or a call ended failed
#                     (its model failed, or its process died): status failed, not for delivery
#   <error code>      the model did not answer: no-model, model-error, empty-reply (``error``)
#   undelivered       the channel reported the reply was not delivered (``delivery.ok`` false)
#   abandoned         the turn was abandoned before it replied
#   running           the turn has not finished (still running, or its worker died)
#   capped            a round or time cap ended the loop (a round with ``cap``)
#   recovered         an empty reply was rescued by the plain-text retry (a ``recovery`` round)
#   repaired          the channel's repair pass changed the reply (a ``repair`` round, changed)
#   denied            the gate refused a tool call
#   writes-dropped    a staged write was dropped, not committed
#   write-failed      a staged write's apply step failed
#   skipped-required-step / required-step-failed   the skill detector's flags (``skills.flags``)
#   judged-failing    the nightly judge failed the turn on a point (``quality_grades``)
#   detector:<name>   a quality detector fired on the turn, in shadow or applied (``detector_firings``;
#                     not required-step, whose firing is the skill's flag above)
TURN_FLAGS_SQL = """
    array_remove(ARRAY[
        CASE WHEN t.status = 'failed' AND t.delivery->>'ok' IS DISTINCT FROM 'false' THEN 'failed' END,
        CASE WHEN t.error IS NOT NULL AND (t.status <> 'failed' OR t.delivery->>'ok' = 'false') THEN t.error END,
        CASE WHEN t.delivery->>'ok' = 'false' THEN 'undelivered' END,
        CASE WHEN t.status IN ('abandoned', 'running') THEN t.status END,
        CASE WHEN jsonb_path_exists(t.rounds, '$[*] ? (exists (@.cap))') THEN 'capped' END,
        CASE WHEN t.error IS NULL AND t.rounds @> '[{"purpose": "recovery"}]' THEN 'recovered' END,
        CASE WHEN t.rounds @> '[{"purpose": "repair", "changed": true}]' THEN 'repaired' END,
        CASE WHEN t.tool_calls @> '[{"status": "denied"}]' THEN 'denied' END,
        CASE WHEN EXISTS (SELECT 1 FROM staged_writes w WHERE w.turn_id = t.id AND w.status = 'dropped')
             THEN 'writes-dropped' END,
        CASE WHEN EXISTS (SELECT 1 FROM staged_writes w WHERE w.turn_id = t.id AND w.status = 'failed')
             THEN 'write-failed' END,
        CASE WHEN EXISTS (SELECT 1 FROM quality_grades g WHERE g.turn_id = t.id AND g.grade = 'fail')
             THEN 'judged-failing' END
    ]::text[], NULL) || ARRAY(
        SELECT DISTINCT f->>'flag' FROM jsonb_array_elements(coalesce(t.skills->'flags', '[]')) f
        WHERE f->>'flag' IS NOT NULL ORDER BY 1
    ) || ARRAY(
        SELECT 'detector:' || d.detector FROM detector_firings d
        WHERE d.turn_id = t.id AND d.detector <> 'required-step' ORDER BY 1  -- its flags are the skill's, above
    )
"""


# Model calls: the turn's rounds and its skill workers' rounds (the token totals cover both). A
# call's ``rounds`` are its transcript, not model calls: NULL.
TURN_ROUNDS_SQL = """
    CASE WHEN NOT coalesce(t.rounds->0 ? 'role', false) THEN jsonb_array_length(t.rounds) + coalesce((
        SELECT sum(jsonb_array_length(coalesce(w->'rounds', '[]')))::int
        FROM jsonb_array_elements(coalesce(t.skills->'workers', '[]')) w
    ), 0) END
"""


@dataclass(frozen=True)
class TurnFilter:
    account_id: UUID | None = None
    since: datetime | None = None
    channel: str | None = None
    kind: str | None = None
    flagged: bool = False
    limit: int = 50


async def list_turns(db: Queries, wanted: TurnFilter) -> list[Any]:
    """The newest turns matching ``wanted``, newest first: one row each with the account's name and
    time zone, the number of model rounds (None for a call), the token totals and the record's flags."""
    return await db.fetch(
        f"""
        SELECT * FROM (
            SELECT t.id, t.started_at, t.channel, t.kind, t.status, t.model, t.tier, t.replay_of,
                   a.id AS account_id, a.name AS account_name, a.timezone,
                   {TURN_ROUNDS_SQL} AS rounds,
                   (t.usage->>'input_tokens')::bigint AS input_tokens,
                   (t.usage->>'output_tokens')::bigint AS output_tokens,
                   {TURN_FLAGS_SQL} AS flags
            FROM turns t
            JOIN conversations c ON c.id = t.conversation_id
            JOIN accounts a ON a.id = c.account_id
            WHERE ($1::uuid IS NULL OR c.account_id = $1)
              AND ($2::timestamptz IS NULL OR t.started_at >= $2)
              AND ($3::text IS NULL OR t.channel = $3)
              AND ($4::text IS NULL OR t.kind = $4)
        ) found
        WHERE NOT $5::boolean OR cardinality(flags) > 0
        ORDER BY started_at DESC, id
        LIMIT $6
        """,
        wanted.account_id,
        wanted.since,
        wanted.channel,
        wanted.kind,
        wanted.flagged,
        wanted.limit,
    )


async def turn_account(db: Queries, turn_id: UUID) -> Any:
    """The turn's account (id, name, time zone) and its flags (as ``list_turns``); None for an
    unknown turn."""
    return await db.fetchrow(
        f"""
        SELECT a.id, a.name, a.timezone, {TURN_FLAGS_SQL} AS flags
        FROM turns t
        JOIN conversations c ON c.id = t.conversation_id
        JOIN accounts a ON a.id = c.account_id
        WHERE t.id = $1
        """,
        turn_id,
    )
