"""Feature area: lists (shopping, packing...), the person's own or shared with a room.

In a person's own turns the tools reach their lists; in a room's turns, only the lists shared with
that room (any member's). A list is named by its name; ``share_list`` shares one of the person's
own lists with a room they are a member of. Ticking items off is staged (the reply says which).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.errors import PepperError
from core.records import rooms
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "lists"
MAX_ITEMS = 50


def _name(args: dict[str, Any]) -> str:
    return " ".join(str(args.get("list", "shopping")).split())[:80] or "shopping"


async def _find(ctx: ToolContext, name: str) -> Any:
    """The list of that name this session may reach, or None."""
    if ctx.session.room_id is not None:
        return await ctx.db.fetchrow(
            "SELECT id, name, room_id FROM lists WHERE room_id = $1 AND lower(name) = lower($2) ORDER BY id LIMIT 1",
            ctx.session.room_id,
            name,
        )
    return await ctx.db.fetchrow(
        "SELECT id, name, room_id FROM lists WHERE account_id = $1 AND lower(name) = lower($2)",
        ctx.session.account_id,
        name,
    )


def _items(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for raw in args.get("items", []):
        text = " ".join(str(raw).split())[:300]
        if text and text.lower() not in (o.lower() for o in out):
            out.append(text)
    return out


async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    items, name = _items(args), _name(args)
    if not items:
        return ToolOutcome.failed("no items to add")
    found = await _find(ctx, name)
    if found is None and ctx.session.room_id is not None:
        return ToolOutcome.failed(f"no list {name!r} is shared with this room")
    payload = {"list": name, "items": items, "list_id": found["id"] if found else None}
    return ToolOutcome.planned(payload, f"added {', '.join(items)} to the {name} list")


async def _apply_add(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    list_id = payload.get("list_id")
    if list_id is None:
        list_id = await conn.fetchval(
            """
            INSERT INTO lists (account_id, name) VALUES ($1, $2)
            ON CONFLICT (account_id, lower(name)) DO UPDATE SET name = lists.name RETURNING id
            """,
            account_id,
            payload["list"],
        )
    await conn.execute(
        """
        INSERT INTO list_items (list_id, text) SELECT $1, t FROM unnest($2::text[]) AS t
        ON CONFLICT (list_id, lower(text)) WHERE done_at IS NULL DO NOTHING
        """,
        list_id,
        payload["items"],
    )


async def _show(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    name = _name(args)
    found = await _find(ctx, name)
    others = await _others(ctx, found["id"] if found else None)
    if found is None:
        return ToolOutcome.empty(f"there is no {name} list" + others)
    rows = await ctx.db.fetch(
        "SELECT id, text FROM list_items WHERE list_id = $1 AND done_at IS NULL ORDER BY id LIMIT 200", found["id"]
    )
    if not rows:
        return ToolOutcome.empty(f"the {found['name']} list is empty" + others)
    shared = " (shared with a room)" if found["room_id"] else ""
    items = "\n".join(f"- #{r['id']} {r['text']}" for r in rows)
    return ToolOutcome.ok(f"{found['name']}{shared}:\n{items}{others}")


async def _others(ctx: ToolContext, shown: int | None) -> str:
    """The session's other lists with their open counts, as a line to add (empty when none)."""
    room = ctx.session.room_id
    rows = await ctx.db.fetch(
        """
        SELECT l.name, (SELECT count(*) FROM list_items i WHERE i.list_id = l.id AND i.done_at IS NULL) AS open
        FROM lists l WHERE (CASE WHEN $1::uuid IS NULL THEN l.account_id = $2 ELSE l.room_id = $1 END)
          AND l.id IS DISTINCT FROM $3
        ORDER BY lower(l.name)
        """,
        room, ctx.session.account_id, shown,
    )  # fmt: skip
    return "\nOther lists: " + ", ".join(f"{r['name']} ({r['open']} open)" for r in rows) if rows else ""


async def _plan_tick(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    found = await _find(ctx, _name(args))
    if found is None:
        return ToolOutcome.failed(f"there is no {_name(args)} list")
    ids = sorted({int(i) for i in args["ids"]})
    rows = await ctx.db.fetch(
        "SELECT id, text FROM list_items WHERE list_id = $1 AND id = ANY($2::bigint[]) AND done_at IS NULL",
        found["id"],
        ids,
    )
    if len(rows) != len(ids):
        missing = sorted(set(ids) - {r["id"] for r in rows})
        return ToolOutcome.failed(f"the {found['name']} list has no open item #{missing[0]}; nothing was ticked off")
    return ToolOutcome.planned({"list_id": found["id"], "ids": ids}, f"ticked off {', '.join(r['text'] for r in rows)}")


async def _apply_tick(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        "UPDATE list_items SET done_at = now() WHERE list_id = $1 AND id = ANY($2::bigint[]) AND done_at IS NULL",
        payload["list_id"],
        payload["ids"],
    )


async def _plan_share(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    if ctx.session.room_id is not None:
        return ToolOutcome.failed("a list is shared by its owner in their own chat, not from a room")
    name = _name(args)
    found = await _find(ctx, name)
    if found is None:
        return ToolOutcome.failed(f"there is no {name} list")
    try:
        room = await rooms.get_room(ctx.db, str(args["room"]))
    except PepperError:
        return ToolOutcome.failed(f"there is no room {args['room']!r}")
    if not await rooms.is_member(ctx.db, room.id, ctx.session.account_id):
        return ToolOutcome.failed(f"the person is not a member of the room {room.name!r}")
    return ToolOutcome.planned(
        {"list_id": found["id"], "room_id": str(room.id)}, f"the {found['name']} list is shared with {room.name}"
    )


async def _apply_share(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        "UPDATE lists SET room_id = $3 WHERE id = $1 AND account_id = $2", payload["list_id"], account_id,
        UUID(payload["room_id"]),
    )  # fmt: skip


_LIST = {"type": "string", "maxLength": 80}  # a missing or empty name: the shopping list
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": MAX_ITEMS}
_ITEMS = {"type": "array", "items": {"type": "string", "maxLength": 300}, "minItems": 1, "maxItems": MAX_ITEMS}


def _schema(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"list": _LIST, **properties}, "additionalProperties": False}
    return {**schema, "required": list(required)} if required else schema


TOOLS: tuple[Tool, ...] = (
    Tool("add_to_list", "Add items to a list (default shopping).", _schema(("items",), items=_ITEMS), _plan_add,
         AREA, writes=True, apply=_apply_add),
    Tool("show_list", "A list's open items with ids, and the other lists.", _schema(), _show, AREA),
    Tool("tick_off_list", "Tick items off a list by id.", _schema(("ids",), ids=_IDS), _plan_tick, AREA,
         writes=True, apply=_apply_tick, staged=True),
    Tool("share_list", "Share a list with a room the person is in.", _schema(("room",), room={"type": "string"}),
         _plan_share, AREA, writes=True, apply=_apply_share),
)  # fmt: skip
