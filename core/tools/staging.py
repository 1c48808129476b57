"""Staged writes: changes that wait until the person has seen the reply that describes them.

A staged write is a row in ``staged_writes`` tied to its turn, written while the turn runs. The
channel's delivery report resolves all of them at once, in one transaction:

* delivered: each write is applied (through its tool's ``apply``) and marked ``committed``;
* not delivered: each is marked ``dropped`` and nothing changes.

A write whose apply step fails is marked ``failed`` (inside its own savepoint) and the others
still commit. Resolution happens once: a second report for the same turn finds nothing staged.

Crash rule (``recover_unresolved``): after a restart, a staged write whose turn is older than the
grace period is committed only when the store shows the reply went out (the turn has
``delivered_at``, or an outbound message of the turn has a delivered/sent status); otherwise it is
dropped. Dropping fails toward what the person can see: a briefing's items come back and are
shown again, instead of being marked done behind a reply nobody received.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from core.store.database import NO_FLUSH
from core.store.pool import transaction
from core.store.queries import Queries
from core.tools.context import SessionContext
from core.tools.registry import PlannedWrite, Tool, ToolRegistry

log = logging.getLogger(__name__)

DELIVERED_STATUSES: tuple[str, ...] = ("delivered", "sent", "read")


@dataclass(frozen=True)
class ResolvedWrite:
    id: int
    tool: str
    summary: str
    status: str  # committed, dropped or failed

    def as_record(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "summary": self.summary, "status": self.status}


async def stage_write(
    db: Queries, session: SessionContext, tool: Tool, write: PlannedWrite, *, wait_for_disk: bool = True
) -> int:
    """Persist one planned write with its turn; returns its id.

    ``wait_for_disk=False`` when the caller commits durably before the reply goes out (see
    ``ToolContext.flushed_later``).
    """
    if session.turn_id is None:
        raise ValueError("a staged write needs a turn")
    flush = "" if wait_for_disk else f", {NO_FLUSH}"
    return await db.fetchval(
        f"""
        INSERT INTO staged_writes (turn_id, account_id, tool, area, payload, summary)
        VALUES ($1, $2, $3, $4, $5::jsonb, $6) RETURNING id{flush}
        """,
        session.turn_id,
        session.account_id,
        tool.name,
        tool.area,
        json.dumps(write.payload),
        write.summary,
    )


async def _resolve(
    db: Queries, registry: ToolRegistry, turn_ids: list[UUID], commit: bool, write_ids: list[int] | None = None
) -> list[ResolvedWrite]:
    resolved: list[ResolvedWrite] = []
    effects: list[tuple[str, UUID, str]] = []
    async with transaction(db) as conn:
        rows = await conn.fetch(
            """
            SELECT id, account_id, tool, payload, summary FROM staged_writes
            WHERE turn_id = ANY($1::uuid[]) AND status = 'staged' AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))
            ORDER BY id FOR UPDATE
            """,
            turn_ids,
            write_ids,
        )
        for row in rows:
            status = "dropped"
            if commit:
                tool = registry.get(row["tool"])
                status = "committed"
                try:
                    if tool is None or tool.apply is None:
                        raise LookupError("no such writing tool")
                    async with conn.transaction():
                        await tool.apply(conn, row["account_id"], json.loads(row["payload"]))
                except Exception:
                    log.exception("staged write failed to apply: id=%s tool=%s", row["id"], row["tool"])
                    status = "failed"
            await conn.execute(
                "UPDATE staged_writes SET status = $2, resolved_at = now() WHERE id = $1", row["id"], status
            )
            resolved.append(ResolvedWrite(row["id"], row["tool"], row["summary"], status))
            if status == "committed":
                effects.append((row["tool"], row["account_id"], row["payload"]))
    for name, account_id, payload in effects:  # outside effects, once their records committed
        tool = registry.get(name)
        if tool is not None and tool.after_commit is not None:
            try:
                await tool.after_commit(db, account_id, json.loads(payload))
            except Exception:
                log.exception("staged write's outside effect failed: tool=%s", name)
    return resolved


async def commit_turn_writes(db: Queries, registry: ToolRegistry, turn_id: UUID) -> list[ResolvedWrite]:
    """Apply every write the turn staged (the reply was delivered)."""
    return await _resolve(db, registry, [turn_id], commit=True)


async def drop_turn_writes(db: Queries, registry: ToolRegistry, turn_id: UUID) -> list[ResolvedWrite]:
    """Drop every write the turn staged (the reply was not delivered)."""
    return await _resolve(db, registry, [turn_id], commit=False)


async def commit_writes(
    db: Queries, registry: ToolRegistry, turn_id: UUID, write_ids: list[int]
) -> list[ResolvedWrite]:
    """Apply some of a turn's staged writes (a call: the sentence confirming them was heard)."""
    return await _resolve(db, registry, [turn_id], commit=True, write_ids=write_ids)


async def drop_writes(db: Queries, registry: ToolRegistry, turn_id: UUID, write_ids: list[int]) -> list[ResolvedWrite]:
    """Drop some of a turn's staged writes (a call: the caller never heard them confirmed)."""
    return await _resolve(db, registry, [turn_id], commit=False, write_ids=write_ids)


async def staged_for_turn(db: Queries, turn_id: UUID) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT id, tool, summary, status FROM staged_writes WHERE turn_id = $1 ORDER BY id", turn_id)
    return [dict(r) for r in rows]


async def recover_unresolved(
    db: Queries, registry: ToolRegistry, *, grace: timedelta = timedelta(minutes=10)
) -> dict[str, int]:
    """Resolve writes left staged by a crash (see the module docstring for the rule).

    Only turns started more than ``grace`` ago are touched, so a turn another process is still
    running keeps its writes. Returns how many writes were committed and dropped.
    """
    rows = await db.fetch(
        """
        SELECT t.id,
               (t.delivered_at IS NOT NULL OR (
                    EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id AND m.direction = 'outbound')
                    -- every part of the reply: a crash between the parts of a long SMS sent only some
                    AND NOT EXISTS (
                        SELECT 1 FROM messages m
                        WHERE m.turn_id = t.id AND m.direction = 'outbound'
                          AND (m.delivery_status IS NULL OR m.delivery_status <> ALL($2::text[])))
               )) AS delivered
        FROM turns t
        WHERE t.started_at < now() - $1::interval
          AND EXISTS (SELECT 1 FROM staged_writes s WHERE s.turn_id = t.id AND s.status = 'staged')
        """,
        grace,
        list(DELIVERED_STATUSES),
    )
    counts = {"committed": 0, "dropped": 0, "failed": 0}
    delivered = [r["id"] for r in rows if r["delivered"]]
    undelivered = [r["id"] for r in rows if not r["delivered"]]
    for turn_ids, commit in ((delivered, True), (undelivered, False)):
        if turn_ids:
            for write in await _resolve(db, registry, turn_ids, commit):
                counts[write.status] += 1
    if rows:
        log.info("recovered staged writes: committed=%s dropped=%s", counts["committed"], counts["dropped"])
    return counts
