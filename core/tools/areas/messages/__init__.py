"""Feature area: texts (SMS or WhatsApp) to the person's contacts, from the person's Pepper line.

Recipient rule, as for mail (``core.tools.mail``): a text goes only to a number on one of the
person's contacts as they stood before this turn, or to the person's own verified number; a
number a contact write of this turn names does not count. A number that said STOP is refused.

``text_contact`` is a staged write: the text is queued only once the reply that says so has been
delivered, and then sent once (``outbound_texts.key``: a repeated delivery report sends
nothing more). In a scheduled run the gate makes it a draft (``mode: draft``): a card in the web
app's chat (``gateway.web_api``), which the person edits, sends or discards, or sends in chat
with ``send_text_draft`` (an immediate write: the person asked for that send; the recipient
rules are checked again).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, PepperError
from core.identity import normalize_phone
from core.records import texts
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "messages"
CONNECTION = "texting"
CONTACT_WRITES = ("add_contact", "update_contact")
MAX_TEXT = 1000
log = logging.getLogger(__name__)


async def _line(db: Queries, account_id: UUID) -> str | None:
    return await db.fetchval(
        "SELECT number FROM phone_lines WHERE account_id = $1 AND kind = 'personal' ORDER BY created_at LIMIT 1",
        account_id,
    )


async def _recipient(ctx: ToolContext, to: str) -> tuple[str, str] | str:
    """(number, who) for ``to`` (a contact's name or a number), or why it cannot be texted."""
    account, turn = ctx.session.account_id, ctx.session.turn_id
    number = None
    if any(ch.isdigit() for ch in to) and not any(ch.isalpha() for ch in to.removeprefix("whatsapp:")):
        try:
            number = normalize_phone(to)
        except (InvalidInput, PepperError):
            return f"{to!r} is not a phone number"
        rows = await ctx.db.fetch(
            "SELECT name, phones FROM contacts WHERE account_id = $1 AND $2 = ANY(phones)", account, number
        )
        own = await ctx.db.fetchval(
            "SELECT 1 FROM handles WHERE account_id = $1 AND kind = 'phone' AND value = $2 AND verified_at IS NOT NULL",
            account, number,
        )  # fmt: skip
        if own:
            return number, "the person"
    else:
        rows = await ctx.db.fetch(
            "SELECT name, phones FROM contacts WHERE account_id = $1 AND lower(name) = lower($2)", account, to.strip()
        )
        if not rows:
            rows = await ctx.db.fetch(
                "SELECT name, phones FROM contacts WHERE account_id = $1 AND name ILIKE $2 || '%' LIMIT 5",
                account, to.strip().replace("%", ""),
            )  # fmt: skip
        if len(rows) > 1:
            return f"several contacts match {to!r} ({', '.join(r['name'] for r in rows)}); ask which"
        if rows and len(rows[0]["phones"]) != 1:
            return f"{rows[0]['name']} has {len(rows[0]['phones']) or 'no'} numbers; ask which number"
        number = rows[0]["phones"][0] if rows else None
    if not rows or number is None:
        return f"{to} is not on the person's contacts: texts go only to contacts (add them first, in another message)"
    fresh = await ctx.db.fetchval(
        "SELECT 1 FROM staged_writes WHERE turn_id = $1 AND tool = ANY($2::text[]) AND payload -> 'phones' ? $3",
        turn, list(CONTACT_WRITES), number,
    )  # fmt: skip
    if fresh:
        return f"{number} was added to a contact in this message; it can be texted from the next one"
    return number, rows[0]["name"]


def _key(turn_id: UUID | None, number: str, body: str) -> str:
    return f"{turn_id}:{number}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


async def _plan_text(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    body = args["text"].strip()
    channel, mode = args.get("channel", "sms"), args.get("mode", "send")
    if not body:
        return ToolOutcome.failed("the text is empty")
    found = await _recipient(ctx, args["to"])
    if isinstance(found, str):
        return ToolOutcome.failed(found + ". Nothing was sent.")
    number, who = found
    if await texts.opted_out(ctx.db, number, channel):
        return ToolOutcome.failed(f"{who} ({number}) has opted out of texts from Pepper (STOP). Nothing was sent.")
    line = await _line(ctx.db, ctx.session.account_id)
    if line is None:
        return ToolOutcome.failed("the person has no Pepper line to text from")
    payload = {
        "key": _key(ctx.session.turn_id, number, body), "channel": channel, "to": number, "from": line,
        "contact": who, "body": body, "status": "draft" if mode == "draft" else "queued",
        "turn_id": str(ctx.session.turn_id) if ctx.session.turn_id else None,
    }  # fmt: skip
    if mode == "draft":
        return ToolOutcome.planned(payload, f"draft text to {who} saved, NOT sent; the person can send it")
    return ToolOutcome.planned(payload, f"text to {who} ({channel}) sent once this reply is delivered")


async def _apply_text(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        """
        INSERT INTO outbound_texts (account_id, key, channel, to_number, from_number, contact, body, status, turn_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key) DO NOTHING
        """,
        account_id, payload["key"], payload["channel"], payload["to"], payload["from"], payload["contact"],
        payload["body"], payload["status"], UUID(payload["turn_id"]) if payload.get("turn_id") else None,
    )  # fmt: skip
    if payload.get("draft_id"):  # the draft it sends is done with
        await conn.execute(
            "UPDATE outbound_texts SET status = 'discarded' WHERE id = $1 AND account_id = $2 AND status = 'draft'",
            payload["draft_id"], account_id,
        )  # fmt: skip


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _send(db: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
        """Send a queued text once: the row is claimed (queued to sent) before the send."""
        row = await db.fetchrow(
            "UPDATE outbound_texts SET status = 'sent', sent_at = now() WHERE key = $1 AND account_id = $2"
            " AND status = 'queued' RETURNING id, channel, to_number, from_number, body",
            payload["key"], account_id,
        )  # fmt: skip
        if row is None:
            return  # a draft, or already sent
        if connectors.texter is None:
            await _failed(db, row["id"], "texting is not set up")
            return
        prefix = "whatsapp:" if row["channel"] == "whatsapp" else ""
        try:
            sid = await connectors.texter.send(
                to=prefix + row["to_number"], from_=prefix + row["from_number"], body=row["body"],
                status_callback=connectors.text_status_url,
            )  # fmt: skip
        except PepperError as exc:
            await _failed(db, row["id"], exc.message)
            raise
        await db.execute("UPDATE outbound_texts SET sid = $2 WHERE id = $1", row["id"], sid)

    async def _plan_draft(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        row = await ctx.db.fetchrow(
            "SELECT contact, to_number, channel, body FROM outbound_texts WHERE id = $1 AND account_id = $2"
            " AND status = 'draft'",
            args["id"], ctx.session.account_id,
        )  # fmt: skip
        if row is None:
            return ToolOutcome.failed(f"there is no unsent text draft #{args['id']}")
        if not ctx.session.person_present:
            return ToolOutcome.failed("a draft is sent only when the person asks, not in a scheduled run")
        planned = await _plan_text(ctx, {"to": row["to_number"], "text": row["body"], "channel": row["channel"]})
        if planned.write is None:
            return planned
        return ToolOutcome.planned({**planned.write.payload, "draft_id": args["id"]}, planned.write.summary)

    async def _drafts(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        rows = await texts.texts_of(ctx.db, ctx.session.account_id)
        if not rows:
            return ToolOutcome.empty("Pepper has sent no texts for the person")
        return ToolOutcome.ok(
            "\n".join(f"- #{r['id']} {r['status']} to {r['contact']} ({r['channel']}): {r['body'][:80]}" for r in rows)
        )

    to = {"type": "string", "maxLength": 80, "description": "contact name or number"}
    return (
        Tool(
            "text_contact",
            "Text a contact (SMS or WhatsApp) from the person's Pepper line.",
            {"type": "object", "properties": {
                "to": to, "text": {"type": "string", "maxLength": MAX_TEXT},
                "channel": {"type": "string", "enum": ["sms", "whatsapp"]},
                "mode": {"type": "string", "enum": ["send", "draft"]}},
             "required": ["to", "text"], "additionalProperties": False},
            _plan_text, AREA, writes=True, staged=True, apply=_apply_text, after_commit=_send,
            needs_connection=CONNECTION, scheduled=(("mode", "draft"),),
        ),
        Tool(
            "send_text_draft",
            "Send a text draft by id.",
            {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"],
             "additionalProperties": False},
            _plan_draft, AREA, writes=True, apply=_apply_text, after_commit=_send, needs_connection=CONNECTION,
        ),
        Tool(
            "list_texts",
            "Texts Pepper sent or drafted, newest first.",
            {"type": "object", "properties": {}, "additionalProperties": False},
            _drafts, AREA, needs_connection=CONNECTION,
        ),
    )  # fmt: skip


async def _failed(db: Queries, text_id: int, reason: str) -> None:
    await db.execute("UPDATE outbound_texts SET status = 'failed', error = $2 WHERE id = $1", text_id, reason[:300])
