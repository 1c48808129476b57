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
    if found is None:
        return ToolOutcome.empty(f"there is no {name} list")
    rows = await ctx.db.fetch(
        "SELECT id, text FROM list_items WHERE list_id = $1 AND done_at IS NULL ORDER BY id LIMIT 200", found["id"]
    )
    if not rows:
        return ToolOutcome.empty(f"the {found['name']} list is empty")
    shared = " (shared with a room)" if found["room_id"] else ""
    return ToolOutcome.ok(f"{found['name']}{shared}:\n" + "\n".join(f"- #{r['id']} {r['text']}" for r in rows))


async def _all(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    where, key = (
        ("l.room_id = $1", ctx.session.room_id)
        if ctx.session.room_id
        else ("l.account_id = $1", ctx.session.account_id)
    )
    rows = await ctx.db.fetch(
        f"""
        SELECT l.name, l.room_id IS NOT NULL AS shared,
               (SELECT count(*) FROM list_items i WHERE i.list_id = l.id AND i.done_at IS NULL) AS open
        FROM lists l WHERE {where} ORDER BY lower(l.name)
        """,
        key,
    )
    if not rows:
        return ToolOutcome.empty("there are no lists")
    return ToolOutcome.ok(
        "\n".join(f"- {r['name']}: {r['open']} open{' (shared)' if r['shared'] else ''}" for r in rows)
    )


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


_LIST = {"type": "string", "minLength": 1, "maxLength": 80, "description": "list name; default shopping"}
_ITEMS = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": 300},
    "minItems": 1,
    "maxItems": MAX_ITEMS,
}


def _schema(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"list": _LIST, **properties}, "required": list(required),
            "additionalProperties": False}  # fmt: skip


TOOLS: tuple[Tool, ...] = (
    Tool(
        "add_to_list",
        "Add items to a list (made if new).",
        _schema(("items",), items=_ITEMS),
        _plan_add,
        AREA,
        writes=True,
        apply=_apply_add,
    ),
    Tool("show_list", "Open items of one list, with ids.", _schema(), _show, AREA),
    Tool(
        "list_lists",
        "The lists and how many open items each has.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        _all,
        AREA,
    ),
    Tool(
        "tick_off_list",
        "Tick items off a list by id.",
        _schema(
            ("ids",),
            ids={"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": MAX_ITEMS},
        ),
        _plan_tick,
        AREA,
        writes=True,
        apply=_apply_tick,
        staged=True,
    ),
    Tool(
        "share_list",
        "Share one of the person's lists with a room they are in.",
        _schema(("room",), room={"type": "string", "minLength": 1, "maxLength": 200}),
        _plan_share,
        AREA,
        writes=True,
        apply=_apply_share,
    ),
)
