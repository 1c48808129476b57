"""Feature area: contacts. A contact's addresses are what email and invitations may go to.

So every contact write is staged: it commits when the reply that reports it is delivered, and an
address it names is not verifiable for mail in the turn that wrote it (``core.tools.mail``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.identity import normalize_email, normalize_phone
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "contacts"


def _clean(args: dict[str, Any]) -> tuple[list[str], list[str]]:
    emails = []
    for raw in args.get("emails", ()):
        try:
            value = normalize_email(raw)
        except InvalidInput as exc:
            raise InvalidInput(f"{raw!r} is not an email address") from exc
        if value not in emails:
            emails.append(value)
    phones = []
    for raw in args.get("phones", ()):
        value = normalize_phone(raw)
        if value not in phones:
            phones.append(value)
    return emails, phones


def _line(row: Any) -> str:
    bits = [f"#{row['id']} {row['name']}"]
    if row["emails"]:
        bits.append(", ".join(row["emails"]))
    if row["phones"]:
        bits.append(", ".join(row["phones"]))
    if row["notes"]:
        bits.append(f"({row['notes']})")
    return "- " + " | ".join(bits)


async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    name = " ".join(args["name"].split())
    if not name:
        return ToolOutcome.failed("a contact needs a name")
    try:
        emails, phones = _clean(args)
    except InvalidInput as exc:
        return ToolOutcome.failed(exc.message)
    if emails:
        taken = await ctx.db.fetchval(
            "SELECT name FROM contacts WHERE account_id = $1 AND emails && $2::text[] LIMIT 1",
            ctx.session.account_id,
            emails,
        )
        if taken is not None:
            return ToolOutcome.failed(f"that address already belongs to the contact {taken!r}; update it instead")
    payload = {"name": name, "emails": emails, "phones": phones, "notes": args.get("notes", "").strip()}
    return ToolOutcome.planned(payload, f"contact {name!r} saved")


async def _apply_add(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
    await conn.execute(
        "INSERT INTO contacts (account_id, name, emails, phones, notes) VALUES ($1, $2, $3, $4, $5)",
        account_id,
        p["name"],
        p["emails"],
        p["phones"],
        p["notes"],
    )


async def _find(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    query = (args.get("query") or "").strip().lower()
    rows = await ctx.db.fetch(
        """
        SELECT id, name, emails, phones, notes FROM contacts
        WHERE account_id = $1 AND ($2 = '' OR lower(name) LIKE '%' || $2 || '%'
              OR EXISTS (SELECT 1 FROM unnest(emails || phones) v WHERE lower(v) LIKE '%' || $2 || '%'))
        ORDER BY lower(name), id LIMIT 50
        """,
        ctx.session.account_id,
        query,
    )
    if not rows:
        return ToolOutcome.empty(f"no contacts match {query!r}" if query else "there are no contacts")
    return ToolOutcome.ok("\n".join(_line(r) for r in rows))


async def _plan_update(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    row = await ctx.db.fetchrow(
        "SELECT id, name FROM contacts WHERE id = $1 AND account_id = $2", args["id"], ctx.session.account_id
    )
    if row is None:
        return ToolOutcome.failed(f"there is no contact #{args['id']}")
    try:
        emails, phones = _clean(args)
    except InvalidInput as exc:
        return ToolOutcome.failed(exc.message)
    payload = {
        "id": row["id"],
        "name": " ".join(args["name"].split()) if args.get("name") else None,
        "emails": emails,
        "phones": phones,
        "notes": args.get("notes"),
    }
    return ToolOutcome.planned(payload, f"contact {payload['name'] or row['name']!r} updated")


async def _apply_update(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
    await conn.execute(
        """
        UPDATE contacts SET name = coalesce($3, name),
            emails = ARRAY(SELECT DISTINCT unnest(emails || $4::text[])),
            phones = ARRAY(SELECT DISTINCT unnest(phones || $5::text[])),
            notes = coalesce($6, notes), updated_at = now()
        WHERE id = $1 AND account_id = $2
        """,
        p["id"],
        account_id,
        p["name"],
        p["emails"],
        p["phones"],
        p["notes"],
    )


async def _plan_remove(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    name = await ctx.db.fetchval(
        "SELECT name FROM contacts WHERE id = $1 AND account_id = $2", args["id"], ctx.session.account_id
    )
    if name is None:
        return ToolOutcome.failed(f"there is no contact #{args['id']}")
    return ToolOutcome.planned({"id": args["id"]}, f"contact {name!r} removed")


async def _apply_remove(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
    await conn.execute("DELETE FROM contacts WHERE id = $1 AND account_id = $2", p["id"], account_id)


_strings = {"type": "array", "items": {"type": "string"}}
TOOLS: tuple[Tool, ...] = (
    Tool(
        name="add_contact",
        description="Save a contact: a name with email addresses and phone numbers the person gave.",
        parameters={
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "emails": _strings,
                "phones": _strings,
                "notes": {"type": "string", "maxLength": 1000},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        handler=_plan_add,
        apply=_apply_add,
        area=AREA,
        writes=True,
        staged=True,
    ),
    Tool(
        name="find_contacts",
        description="Find contacts by part of a name, address or number (all contacts when no query).",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "additionalProperties": False},
        handler=_find,
        area=AREA,
    ),
    Tool(
        name="update_contact",
        description="Rename a contact, add addresses or numbers, or replace its notes, by its id.",
        parameters={
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "name": {"type": "string", "maxLength": 200},
                "emails": _strings,
                "phones": _strings,
                "notes": {"type": "string", "maxLength": 1000},
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        handler=_plan_update,
        apply=_apply_update,
        area=AREA,
        writes=True,
        staged=True,
    ),
    Tool(
        name="remove_contact",
        description="Delete a contact by its id.",
        parameters={
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1}},
            "required": ["id"],
            "additionalProperties": False,
        },
        handler=_plan_remove,
        apply=_apply_remove,
        area=AREA,
        writes=True,
        staged=True,
    ),
)
