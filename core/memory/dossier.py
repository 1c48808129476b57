"""The dossier: a short document about the person, in two halves, both in every owner prompt.

The person writes one half (the CLI, later a web page). The model writes the other: during a
turn it can only add notes (``add_dossier_note``, staged until the reply is delivered); a weekly
job rewrites the half from the dossier and the recent summaries, folding the notes in.

Every change keeps a revision (``dossier_revisions``); notes are rows that are never deleted, so
the model's half at any moment is its last accepted rewrite plus the notes after it. A rewrite is
rejected, and recorded with its reason, if it is empty, much shorter than the half it replaces,
or too long.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, NotFound, PepperError
from core.memory.block import summary_heading
from core.memory.config import MemoryConfig
from core.models.types import ChatMessage, ModelService, Prompt
from core.store.pool import transaction
from core.store.queries import Queries
from core.untrusted import neutralise_labels

log = logging.getLogger(__name__)

MAX_NOTES_IN_PROMPT = 50


class DossierChanged(PepperError):
    """The model's half changed while a rewrite was being written; the job tries again later."""

    code = "dossier-changed"
    retryable = True


@dataclass(frozen=True)
class DossierHalves:
    owner_text: str
    model_text: str
    notes: tuple[tuple[int, str], ...]  # (id, body) added after the last rewrite, oldest first
    notes_through: int

    @property
    def model_half(self) -> str:
        """The model's half as shown: the last rewrite, then the notes since."""
        parts = [self.model_text.strip()] if self.model_text.strip() else []
        parts += [f"- {body}" for _, body in self.notes]
        return "\n".join(parts)


def dossier_select(notes_limit: int | None = None) -> str:
    """A scalar SQL expression over the account id ``$1``: both halves as JSON, for
    :func:`dossier_halves`. ``load_dossier`` runs it as a statement of its own; a text turn folds
    it into its first statement (``core.conversation.open_turn``), one round trip fewer."""
    limit = "ALL" if notes_limit is None else str(int(notes_limit))
    return f"""(
        SELECT json_build_object(
            'owner_text', d.owner_text, 'model_text', d.model_text,
            'through', coalesce(d.model_notes_through, 0), 'notes', n.notes)
        FROM (SELECT $1::uuid AS account_id) a
        LEFT JOIN dossiers d ON d.account_id = a.account_id
        CROSS JOIN LATERAL (
            SELECT coalesce(json_agg(json_build_array(id, body) ORDER BY id), '[]') AS notes
            FROM (
                SELECT id, body FROM dossier_notes
                WHERE account_id = $1 AND id > coalesce(d.model_notes_through, 0)
                ORDER BY id DESC LIMIT {limit}
            ) newest
        ) n
    )"""


def dossier_halves(selected: str) -> DossierHalves:
    """The halves from the JSON :func:`dossier_select` gives."""
    data = json.loads(selected)
    notes = tuple((int(i), str(body)) for i, body in data["notes"])
    return DossierHalves(data["owner_text"] or "", data["model_text"] or "", notes, data["through"])


async def load_dossier(db: Queries, account_id: UUID, *, notes_limit: int | None = None) -> DossierHalves:
    # One round trip: every turn of a verified owner reads this before its first model call.
    return dossier_halves(await db.fetchval(f"SELECT {dossier_select(notes_limit)}", account_id))


def prompt_text(halves: DossierHalves) -> str:
    """Both halves as prompt text; empty when there is nothing yet. Byte-stable between turns:
    it changes only when a half changes."""
    parts = []
    if halves.owner_text.strip():
        parts.append("Written by the person:\n" + halves.owner_text.strip())
    if halves.model_half:
        parts.append("Noted by Pepper:\n" + halves.model_half)
    return neutralise_labels("\n\n".join(parts))


async def dossier_text(db: Queries, account_id: UUID) -> str:
    """Both halves as prompt text (:func:`prompt_text`)."""
    return prompt_text(await load_dossier(db, account_id, notes_limit=MAX_NOTES_IN_PROMPT))


async def set_owner_text(
    db: Queries, account_id: UUID, text: str, *, source: str = "cli", config: MemoryConfig | None = None
) -> bool:
    """Replace the person's half; keeps a revision. Returns False when the text did not change."""
    config = config or MemoryConfig()
    text = text.strip()
    if len(text) > config.dossier_owner_max_chars:
        raise InvalidInput(f"the dossier text is {len(text)} characters; the limit is {config.dossier_owner_max_chars}")
    async with transaction(db) as conn:
        if await conn.fetchval("SELECT 1 FROM accounts WHERE id = $1", account_id) is None:
            raise NotFound(f"no account {account_id}")
        current = await conn.fetchval("SELECT owner_text FROM dossiers WHERE account_id = $1 FOR UPDATE", account_id)
        if (current or "") == text:
            return False
        await conn.execute(
            "INSERT INTO dossiers (account_id, owner_text) VALUES ($1, $2)"
            " ON CONFLICT (account_id) DO UPDATE SET owner_text = EXCLUDED.owner_text, updated_at = now()",
            account_id,
            text,
        )
        await conn.execute(
            "INSERT INTO dossier_revisions (account_id, half, body, source) VALUES ($1, 'owner', $2, $3)",
            account_id,
            text,
            source,
        )
    return True


def check_rewrite(before: str, after: str, config: MemoryConfig) -> str | None:
    """Why a rewrite of the model's half must be rejected, or None to accept it."""
    after = after.strip()
    if not after:
        return "empty"
    if len(after) > config.dossier_max_chars:
        return f"too long ({len(after)} characters, limit {config.dossier_max_chars})"
    if len(after) < config.dossier_min_ratio * len(before.strip()):
        return f"much shorter than before ({len(after)} characters, was {len(before.strip())})"
    return None


REWRITE_INSTRUCTIONS = """You keep the dossier of a personal assistant called Pepper: a short document
about one person that Pepper reads before every conversation. Rewrite Pepper's half of it.
Keep every lasting fact and preference (from the current half, the new notes and the recent
summaries), merge duplicates, drop what is clearly no longer true, and add lasting facts the
summaries show. Do not copy the person's own half; it is shown for context only. Plain lines, one
fact per line, no headings, at most {limit} characters. Never invent anything."""


@dataclass(frozen=True)
class RewriteResult:
    outcome: str  # accepted, rejected, nothing (no notes and no new summaries)
    reason: str | None = None
    revision_id: int | None = None


async def rewrite_model_half(
    db: Queries, models: ModelService, account_id: UUID, now: datetime, *, config: MemoryConfig
) -> RewriteResult:
    """The weekly rewrite of the model's half. Model errors raise (the job retries)."""
    halves = await load_dossier(db, account_id)
    last = await db.fetchval(
        "SELECT max(created_at) FROM dossier_revisions WHERE account_id = $1 AND half = 'model'", account_id
    )
    summaries = await db.fetch(
        """
        SELECT period, starts_on, body, created_at, callers FROM memory_summaries
        WHERE account_id = $1 AND period IN ('week', 'day') AND covers_until <= $2
          AND covers_from >= $2 - make_interval(days => 7 * $3)
        ORDER BY covers_from, period DESC
        """,
        account_id,
        now,
        config.dossier_recent_weeks,
    )
    fresh = [s for s in summaries if last is None or s["created_at"] > last]
    if not halves.notes and not fresh:
        return RewriteResult("nothing")
    weeks = [s for s in summaries if s["period"] == "week"]
    last_week_end = max((s["starts_on"] for s in weeks), default=None)
    shown = [s for s in summaries if s["period"] == "week" or last_week_end is None or s["starts_on"] > last_week_end]
    before = halves.model_half
    parts = [
        "The person's half (context only):\n" + (halves.owner_text.strip() or "(empty)"),
        "Pepper's current half:\n" + (halves.model_text.strip() or "(empty)"),
        "New notes since the last rewrite:\n" + ("\n".join(f"- {b}" for _, b in halves.notes) or "(none)"),
        "Recent summaries:\n" + ("\n\n".join(
            f"{summary_heading(s['period'], s['starts_on'], s['callers'])}\n{s['body']}" for s in shown
        ) or "(none)"),
    ]  # fmt: skip
    parts = [neutralise_labels(p) for p in parts]
    conversation_key = str(await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account_id))
    prompt = Prompt(
        REWRITE_INSTRUCTIONS.format(limit=config.dossier_max_chars),
        (ChatMessage("user", "\n\n".join(parts)),),
        max_output_tokens=1_500,
        temperature=0.2,
    )
    generation = await models.generate(
        prompt, conversation_key=conversation_key, tier=config.dossier_tier, background=True
    )
    after = generation.text.strip()
    reason = check_rewrite(before, after, config)
    through = halves.notes[-1][0] if halves.notes else halves.notes_through
    async with transaction(db) as conn:
        if reason is not None:
            revision = await conn.fetchval(
                "INSERT INTO dossier_revisions (account_id, half, body, source, accepted, reason, notes_through, model)"
                " VALUES ($1, 'model', $2, 'rewrite', false, $3, $4, $5) RETURNING id",
                account_id,
                after,
                reason,
                through,
                generation.model,
            )
            log.warning("dossier rewrite rejected: reason=%s", reason.split(" (")[0])
            return RewriteResult("rejected", reason, revision)
        await conn.execute(
            "INSERT INTO dossiers (account_id) VALUES ($1) ON CONFLICT (account_id) DO NOTHING", account_id
        )
        status = await conn.execute(
            "UPDATE dossiers SET model_text = $2, model_notes_through = $3, model_updated_at = $4"
            " WHERE account_id = $1 AND model_notes_through = $5 AND model_text = $6",
            account_id,
            after,
            through,
            now,
            halves.notes_through,
            halves.model_text,
        )
        if status.endswith(" 0"):
            raise DossierChanged("the model's half changed during the rewrite")
        revision = await conn.fetchval(
            "INSERT INTO dossier_revisions (account_id, half, body, source, notes_through, model)"
            " VALUES ($1, 'model', $2, 'rewrite', $3, $4) RETURNING id",
            account_id,
            after,
            through,
            generation.model,
        )
    log.info("dossier rewrite accepted: notes=%s", len(halves.notes))
    return RewriteResult("accepted", None, revision)


async def revisions(db: Queries, account_id: UUID, limit: int = 20) -> list[Any]:
    return await db.fetch(
        "SELECT id, half, body, source, accepted, reason, created_at FROM dossier_revisions"
        " WHERE account_id = $1 ORDER BY id DESC LIMIT $2",
        account_id,
        limit,
    )
