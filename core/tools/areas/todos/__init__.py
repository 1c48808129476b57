"""Feature area: the person's todos.

Completing a todo is staged: the reply tells the person which one was closed, so it closes only
once they have seen that reply.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome


async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    title = args["title"].strip()
    if not title:
        return ToolOutcome.failed("the todo has no title")
    return ToolOutcome.planned({"title": title}, "todo added")


async def _apply_add(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO todos (account_id, title) VALUES ($1, $2)", account_id, payload["title"])


async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    include_done = args.get("include_done", False)
    rows = await ctx.db.fetch(
        """
        SELECT id, title, done_at FROM todos
        WHERE account_id = $1 AND ($2 OR done_at IS NULL) ORDER BY created_at, id LIMIT 100
        """,
        ctx.session.account_id,
        include_done,
    )
    if not rows:
        return ToolOutcome.empty("there are no todos" if include_done else "there are no open todos")
    return ToolOutcome.ok("\n".join(f"- #{r['id']} {r['title']}{' (done)' if r['done_at'] else ''}" for r in rows))


async def _plan_complete(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    row = await ctx.db.fetchrow(
        "SELECT id, title, done_at FROM todos WHERE id = $1 AND account_id = $2",
        args["id"],
        ctx.session.account_id,
    )
    if row is None:
        return ToolOutcome.failed(f"there is no todo #{args['id']}")
    if row["done_at"] is not None:
        return ToolOutcome.ok(f"todo #{row['id']} was already done")
    return ToolOutcome.planned({"id": row["id"]}, f"todo #{row['id']} marked done")


async def _apply_complete(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        "UPDATE todos SET done_at = coalesce(done_at, now()) WHERE id = $1 AND account_id = $2",
        payload["id"],
        account_id,
    )


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="add_todo",
        description="Add a todo for the person.",
        parameters={
            "type": "object",
            "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 500}},
            "required": ["title"],
            "additionalProperties": False,
        },
        handler=_plan_add,
        apply=_apply_add,
        area="todos",
        writes=True,
    ),
    Tool(
        name="list_todos",
        description="List the person's open todos with their ids (done ones too if asked).",
        parameters={
            "type": "object",
            "properties": {"include_done": {"type": "boolean"}},
            "additionalProperties": False,
        },
        handler=_list,
        area="todos",
    ),
    Tool(
        name="complete_todo",
        description="Mark one todo done, by its id from list_todos.",
        parameters={
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1}},
            "required": ["id"],
            "additionalProperties": False,
        },
        handler=_plan_complete,
        apply=_apply_complete,
        area="todos",
        writes=True,
        staged=True,
    ),
)
