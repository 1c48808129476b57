"""Feature area: files: the documents Pepper made for the person: what runs produced (briefs,
reports: ``memory_documents``, opened here by number) and the titled documents of the notes area
(listed here too, opened with its ``read_document``). A folder the person lends from the CLI
(``pepper chat --folder``) adds its own read-only tools to this area for that session
(``core.tools.folder``)."""

from __future__ import annotations

from typing import Any

from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "files"
MAX_CHARS = 6000


async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    words = "%" + str(args.get("search", "")).replace("%", "") + "%"
    rows = await ctx.db.fetch(
        "SELECT id, kind, title, created_at FROM memory_documents WHERE account_id = $1"
        " AND (title ILIKE $2 OR body ILIKE $2) ORDER BY id DESC LIMIT 20",
        ctx.session.account_id, words,
    )  # fmt: skip
    titled = await ctx.db.fetch(
        "SELECT title, updated_at FROM notes WHERE account_id = $1 AND title IS NOT NULL"
        " AND (title ILIKE $2 OR body ILIKE $2) ORDER BY updated_at DESC LIMIT 20",
        ctx.session.account_id, words,
    )  # fmt: skip
    if not rows and not titled:
        return ToolOutcome.empty("no documents" + (f" matching {args['search']!r}" if args.get("search") else ""))
    lines = [f"- #{r['id']} {r['kind']}: {r['title']} ({r['created_at']:%d %b %Y})" for r in rows]
    lines += [f"- {r['title']!r} (document; read_document)" for r in titled]
    return ToolOutcome.ok("\n".join(lines))


async def _read(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    row = await ctx.db.fetchrow(
        "SELECT title, body FROM memory_documents WHERE id = $1 AND account_id = $2", args["id"], ctx.session.account_id
    )
    if row is None:
        return ToolOutcome.failed(f"there is no document #{args['id']}")
    body = row["body"] if len(row["body"]) <= MAX_CHARS else row["body"][:MAX_CHARS] + "\n[cut]"
    return ToolOutcome.ok(f"{row['title']}\n\n{body}")


TOOLS: tuple[Tool, ...] = (
    Tool("list_files", "Documents Pepper made for the person, newest first.",
         {"type": "object", "properties": {"search": {"type": "string", "maxLength": 80}},
          "additionalProperties": False}, _list, AREA),
    Tool("open_file", "Open a numbered document from list_files.",
         {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"],
          "additionalProperties": False}, _read, AREA),
)  # fmt: skip
