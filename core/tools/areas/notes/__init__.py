"""Feature area: the person's notes and documents.

A document is a note with a title (unique per person, case-insensitive): Pepper writes reports,
lists and drafts there, and writing the same title again replaces the text. Notes and documents
are left for the memory search index to pick up (``notes.updated_at``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries
from core.tools.registry import Narrowing, Tool, ToolContext, ToolOutcome


async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    body = args["text"].strip()
    if not body:
        return ToolOutcome.failed("the note is empty")
    return ToolOutcome.planned({"text": body}, "note saved")


async def _apply_add(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO notes (account_id, body) VALUES ($1, $2)", account_id, payload["text"])


async def _search(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    query = (args.get("query") or "").strip()
    limit = args.get("limit", 10)
    rows = await ctx.db.fetch(
        """
        SELECT title, body, created_at FROM notes
        WHERE account_id = $1 AND ($2 = '' OR body ILIKE '%' || $2 || '%' OR title ILIKE '%' || $2 || '%')
        ORDER BY created_at DESC, id DESC LIMIT $3
        """,
        ctx.session.account_id,
        query,
        limit,
    )
    if not rows:
        return ToolOutcome.empty(f"no notes match {query!r}" if query else "there are no notes")
    return ToolOutcome.ok("\n".join(_note_line(r) for r in rows))


def _note_line(row: Any) -> str:
    if row["title"]:
        body = row["body"] if len(row["body"]) <= 200 else row["body"][:200] + "..."
        return f"- ({row['created_at']:%Y-%m-%d}) document {row['title']!r}: {body}"
    return f"- ({row['created_at']:%Y-%m-%d}) {row['body']}"


async def _plan_document(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    title, body = " ".join(args["title"].split()), args["text"].strip()
    if not title or not body:
        return ToolOutcome.failed("a document needs a title and some text")
    exists = await ctx.db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM notes WHERE account_id = $1 AND lower(title) = lower($2))",
        ctx.session.account_id,
        title,
    )
    verb = "replaced" if exists else "saved"
    return ToolOutcome.planned({"title": title, "text": body}, f"document {title!r} {verb}")


async def _apply_document(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        """
        INSERT INTO notes (account_id, title, body) VALUES ($1, $2, $3)
        ON CONFLICT (account_id, lower(title)) WHERE title IS NOT NULL
        DO UPDATE SET body = EXCLUDED.body, title = EXCLUDED.title, updated_at = now()
        """,
        account_id,
        payload["title"],
        payload["text"],
    )


async def _read_document(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    row = await ctx.db.fetchrow(
        "SELECT title, body, updated_at FROM notes WHERE account_id = $1 AND lower(title) = lower($2)",
        ctx.session.account_id,
        " ".join(args["title"].split()),
    )
    if row is None:
        return ToolOutcome.empty(f"no document titled {args['title']!r}")
    return ToolOutcome.ok(f"Document {row['title']!r} (updated {row['updated_at']:%Y-%m-%d}):\n{row['body']}")


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
        narrowing=(("limit", Narrowing.lower()),),
    ),
    Tool(
        name="write_document",
        description="Save a titled document for the person (a report, a list, a draft); same title replaces it.",
        parameters={
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 200},
                "text": {"type": "string", "minLength": 1, "maxLength": 100000},
            },
            "required": ["title", "text"],
            "additionalProperties": False,
        },
        handler=_plan_document,
        apply=_apply_document,
        area="notes",
        writes=True,
    ),
    Tool(
        name="read_document",
        description="Read a document by its title.",
        parameters={
            "type": "object",
            "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["title"],
            "additionalProperties": False,
        },
        handler=_read_document,
        area="notes",
    ),
)
