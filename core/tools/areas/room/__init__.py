"""Feature area: a room's shared notes and to-dos, for Pepper's turns in that room.

Only a ``room`` session sees these tools (the gate's ``room-scope`` policy), and each reaches only
the session's own room. There is no tool for calendar sharing levels: a member sets their own
(``pepper rooms share``), never Pepper's model.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.records import rooms
from core.store.queries import Queries
from core.tools.registry import Handler, Tool, ToolContext, ToolOutcome


def _room(ctx: ToolContext) -> UUID:
    assert ctx.session.room_id is not None  # the gate shows these tools only in a room
    return ctx.session.room_id


async def _read(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    found = await rooms.notes(ctx.db, _room(ctx))
    if not found:
        return ToolOutcome.empty("the room has no shared notes or to-dos yet")
    lines = [
        f"- #{n['id']} {'to-do' if n['kind'] == 'todo' else 'note'}{' (done)' if n['done'] else ''}: {n['body']}"
        for n in found
    ]
    return ToolOutcome.ok("\n".join(lines))


def _planner(kind: str) -> Handler:
    async def plan(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        body = " ".join(str(args.get("text", "")).split())
        if not body:
            return ToolOutcome.failed(f"the {kind} is empty")
        return ToolOutcome.planned({"room_id": str(_room(ctx)), "kind": kind, "text": body[:2000]},
                                   f"{'to-do' if kind == 'todo' else 'note'} added to the room")  # fmt: skip

    return plan


async def _apply_add(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await rooms.add_note(conn, UUID(payload["room_id"]), payload["kind"], payload["text"])


async def _plan_done(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome.planned({"room_id": str(_room(ctx)), "id": int(args["id"])}, "to-do marked done")


async def _apply_done(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await rooms.complete_todo(conn, UUID(payload["room_id"]), payload["id"])


_TEXT = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}}, "required": ["text"],
         "additionalProperties": False}  # fmt: skip

TOOLS: tuple[Tool, ...] = (
    Tool(name="room_notes", description="The room's shared notes and to-dos (every member sees them).",
         parameters={"type": "object", "properties": {}, "additionalProperties": False}, handler=_read, area="room"),
    Tool(name="add_room_note", description="Add a note to the room's shared notes.", parameters=_TEXT,
         handler=_planner("note"), area="room", writes=True, apply=_apply_add),
    Tool(name="add_room_todo", description="Add a to-do to the room's shared list.", parameters=_TEXT,
         handler=_planner("todo"), area="room", writes=True, apply=_apply_add),
    Tool(name="complete_room_todo", description="Mark one of the room's to-dos done, by its #id.",
         parameters={"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                     "additionalProperties": False},
         handler=_plan_done, area="room", writes=True, apply=_apply_done),
)  # fmt: skip
