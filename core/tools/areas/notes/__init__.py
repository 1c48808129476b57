"""Feature area: the person's notes."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.tools.registry import Tool, ToolContext, ToolOutcome


async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    body = args["text"].strip()
    if not body:
        return ToolOutcome.failed("the note is empty")
    return ToolOutcome.planned({"text": body}, "note saved")


async def _apply_add(conn: Any, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, $2)", account_id, payload["text"])


async def _search(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    query = (args.get("query") or "").strip()
    limit = args.get("limit", 10)
    rows = await ctx.db.fetch(
        """
        SELECT body, created_at FROM notes
        WHERE account_id = $1 AND ($2 = '' OR body ILIKE '%' || $2 || '%')
        ORDER BY created_at DESC, id DESC LIMIT $3
        """,
        ctx.session.account_id,
        query,
        limit,
    )
    if not rows:
        return ToolOutcome.empty(f"no notes match {query!r}" if query else "there are no notes")
    return ToolOutcome.ok("\n".join(f"- ({r['created_at']:%Y-%m-%d}) {r['body']}" for r in rows))


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="add_note",
        description="Save a note for the person, in their words.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 4000}},
            "required": ["text"],
            "additionalProperties": False,
        },
        handler=_plan_add,
        apply=_apply_add,
        area="notes",
        writes=True,
    ),
    Tool(
        name="search_notes",
        description="Find the person's notes containing some text (all notes, newest first, when no query).",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "additionalProperties": False,
        },
        handler=_search,
        area="notes",
    ),
)
