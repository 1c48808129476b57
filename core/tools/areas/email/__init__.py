"""Feature area: email, the mail Pepper writes (reading is the ``mail`` area). Every tool names who sends:

* ``email_from_pepper``: Pepper, from its own address (SMTP); the person is always on CC;
* ``email_from_my_gmail``: the person, from their Gmail (compose scope); a draft unless asked to send.

A draft is stored with a card (``draft_cards``) that chat shows for review; ``send_email_draft``
sends a reviewed one. Every recipient of a real send must be an address Pepper can verify (the
person's own verified handles or a contact's addresses from before this turn, see
``core.tools.mail``), else the tool refuses. In a scheduled run the
gate turns a send into a draft, and the result says the mail was not sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, PepperError
from core.store.queries import Queries
from core.tools.connectors import GMAIL_COMPOSE, Connectors
from core.tools.google_api import GoogleClient, google_connection
from core.tools.mail import build_message, clean_addresses, owner_emails, send_smtp, unverifiable
from core.tools.registry import Narrowing, Tool, ToolContext, ToolOutcome

log = logging.getLogger(__name__)

AREA = "email"


async def draft_cards(db: Queries, account_id: UUID) -> list[dict[str, Any]]:
    """The cards of drafts waiting for review, oldest first (what chat shows)."""
    rows = await db.fetch(
        "SELECT card FROM email_messages WHERE account_id = $1 AND status = 'draft' ORDER BY id", account_id
    )
    return [json.loads(r["card"]) if isinstance(r["card"], str) else r["card"] for r in rows]


async def pending_drafts(db: Queries, account_id: UUID) -> list[tuple[dict[str, Any], bool]]:
    """Each draft's card with whether a scheduled run held it back (its send waits for the
    person), oldest first; drafts whose Gmail copy is not made yet have no card and are left out."""
    rows = await db.fetch(
        """
        SELECT e.card, t.kind = 'scheduled' AS held FROM email_messages e LEFT JOIN turns t ON t.id = e.turn_id
        WHERE e.account_id = $1 AND e.status = 'draft' AND e.card IS NOT NULL ORDER BY e.id
        """,
        account_id,
    )
    return [(json.loads(r["card"]) if isinstance(r["card"], str) else r["card"], bool(r["held"])) for r in rows]


async def is_draft(db: Queries, account_id: UUID, draft_id: int) -> bool:
    found = await db.fetchval(
        "SELECT 1 FROM email_messages WHERE id = $1 AND account_id = $2 AND status = 'draft'", draft_id, account_id
    )
    return bool(found)


def _card(row_id: int, sender: str, from_address: str, to: list[str], cc: list[str], subject: str, body: str) -> dict:
    return {
        "type": "email-draft",
        "draft": row_id,
        "sender": sender,
        "from": from_address,
        "to": to,
        "cc": cc,
        "subject": subject,
        "body": body,
        "actions": ["send", "discard"],
    }


def _payload(row: Any) -> dict[str, Any]:
    return {
        "sender": row["sender"], "from": row["from_address"], "to": list(row["to_addresses"]),
        "cc": list(row["cc_addresses"]), "subject": row["subject"], "body": row["body"], "remote_id": row["remote_id"],
    }  # fmt: skip


def _card_json(row_id: int, p: dict[str, Any]) -> str:
    return json.dumps(_card(row_id, p["sender"], p["from"], p["to"], p["cc"], p["subject"], p["body"]))


def _message(p: dict[str, Any]) -> Any:
    return build_message(
        from_address=p["from"], from_name="Pepper" if p["sender"] == "pepper" else "", to=p["to"], cc=p["cc"],
        subject=p["subject"], body=p["body"],
    )  # fmt: skip


def _raw(message: Any) -> str:
    return base64.urlsafe_b64encode(message.as_bytes()).decode()


def _who(sender: str, from_address: str) -> str:
    return f"Pepper ({from_address})" if sender == "pepper" else f"the person's Gmail ({from_address})"


async def _gmail_call(
    db: Queries, connectors: Connectors, account_id: UUID, method: str, path: str, body: dict[str, Any] | None
) -> dict[str, Any]:
    connection_id = await google_connection(db, account_id, GMAIL_COMPOSE)
    if connection_id is None:
        raise PepperError("Gmail is not connected")
    return await GoogleClient(db, connectors, connection_id).call(method, path, body=body)


async def edit_draft(
    db: Queries, connectors: Connectors, account_id: UUID, draft_id: int, *, to: list[str], cc: list[str],
    subject: str, body: str,
) -> dict[str, Any] | None:  # fmt: skip
    """The person's edit of an unsent draft (the web app's card); its new card, or None when there
    is no such draft. A Gmail draft is rewritten in Gmail first, so sending it sends the edited
    text. The recipients are checked when it is sent (``send_email_draft``), as for any send.
    Raises ``InvalidInput`` for bad addresses or an empty text, ``PepperError`` when Gmail refuses."""
    to, cc = clean_addresses(to), clean_addresses(cc)
    subject, body = subject.strip(), body.strip()
    if not to:
        raise InvalidInput("the mail needs at least one recipient")
    if not body:
        raise InvalidInput("the mail has no text")
    row = await db.fetchrow(
        "SELECT * FROM email_messages WHERE id = $1 AND account_id = $2 AND status = 'draft'", draft_id, account_id
    )
    if row is None:
        return None
    p = {**_payload(row), "to": to, "cc": [a for a in cc if a not in to], "subject": subject, "body": body}
    if p["sender"] == "gmail" and p["remote_id"]:
        await _gmail_call(
            db, connectors, account_id, "PUT", f"/gmail/v1/users/me/drafts/{p['remote_id']}",
            {"id": p["remote_id"], "message": {"raw": _raw(_message(p))}},
        )  # fmt: skip
    updated = await db.fetchval(
        "UPDATE email_messages SET to_addresses = $3, cc_addresses = $4, subject = $5, body = $6, card = $7::jsonb"
        " WHERE id = $1 AND account_id = $2 AND status = 'draft' RETURNING id",
        draft_id, account_id, p["to"], p["cc"], subject, body, _card_json(draft_id, p),
    )  # fmt: skip
    return _card(draft_id, p["sender"], p["from"], p["to"], p["cc"], subject, body) if updated else None


async def discard_draft(db: Queries, connectors: Connectors, account_id: UUID, draft_id: int) -> bool:
    """Discard an unsent draft (deleted from Gmail too); False when there is no such draft."""
    row = await db.fetchrow(
        "UPDATE email_messages SET status = 'discarded', card = NULL WHERE id = $1 AND account_id = $2"
        " AND status = 'draft' RETURNING sender, remote_id",
        draft_id, account_id,
    )  # fmt: skip
    if row is None:
        return False
    if row["sender"] == "gmail" and row["remote_id"]:
        try:
            await _gmail_call(
                db, connectors, account_id, "DELETE", f"/gmail/v1/users/me/drafts/{row['remote_id']}", None
            )
        except PepperError as exc:  # discarded here either way; the person can delete it in Gmail
            log.warning("gmail draft not deleted: %s", exc.code)
    return True


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _plan(ctx: ToolContext, args: dict[str, Any], sender: str) -> ToolOutcome:
        account_id = ctx.session.account_id
        try:
            to = clean_addresses(args["to"])
            cc = clean_addresses(args.get("cc", ()))
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message)
        if not to:
            return ToolOutcome.failed("the mail needs at least one recipient")
        subject, body = args["subject"].strip(), args["body"].strip()
        if not body:
            return ToolOutcome.failed("the mail has no text")
        own = await owner_emails(ctx.db, account_id)
        if not own:
            return ToolOutcome.failed("the person has no email address on file to send from or copy")
        default = "send" if sender == "pepper" else "draft"
        mode = args.get("mode", default)
        forced = ""
        if mode == "send" and ctx.session.kind == "scheduled":
            mode, forced = "draft", " (no one is present in a scheduled run, so it was NOT sent)"
        if sender == "pepper":
            from_address = connectors.smtp_from or ""
            cc = [a for a in cc if a not in to]
            if own[0] not in to and own[0] not in cc:
                cc.append(own[0])  # the person always sees what Pepper sends in their name
        else:
            from_address = own[0]
        if mode == "send":
            bad = await unverifiable(ctx.db, account_id, [*to, *cc], ctx.session.turn_id)
            if bad:
                return ToolOutcome.failed(
                    f"refused: {', '.join(bad)} is not an address Pepper can verify (not a contact from before "
                    "this conversation turn, or one of the person's own verified addresses). Nothing was sent. A "
                    "contact added or changed now counts only from the next turn: ask the person to confirm the "
                    "address, or save a draft instead"
                )
        key = hashlib.sha256(
            json.dumps([str(ctx.session.turn_id), sender, mode, to, cc, subject, body]).encode()
        ).hexdigest()
        payload = {
            "sender": sender, "mode": mode, "from": from_address, "to": to, "cc": cc, "subject": subject,
            "body": body, "key": key, "turn_id": str(ctx.session.turn_id) if ctx.session.turn_id else None,
        }  # fmt: skip
        who = _who(sender, from_address)
        copy = f", cc {', '.join(cc)}" if cc else ""
        if mode == "send":
            summary = f"mail sent from {who} to {', '.join(to)}{copy}"
        else:
            where = "in the person's Gmail drafts" if sender == "gmail" else "by Pepper"
            summary = (
                f"draft saved {where}, from {who} to {', '.join(to)}{copy}: NOT sent{forced}. It is shown in the "
                "chat as a card for the person to review and send"
            )
        return ToolOutcome.planned(payload, summary)

    async def _apply(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        """The outbox row, committed before anything leaves: a draft, or a send ``queued``."""
        draft = p["mode"] != "send"
        row_id = await conn.fetchval(
            """
            INSERT INTO email_messages (account_id, sender, from_address, to_addresses, cc_addresses, subject, body,
                                        status, dedupe_key, turn_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::uuid)
            ON CONFLICT (account_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
            RETURNING id
            """,
            account_id, p["sender"], p["from"], p["to"], p["cc"], p["subject"], p["body"],
            "draft" if draft else "queued", p["key"], p["turn_id"],
        )  # fmt: skip
        if row_id is not None and draft and p["sender"] == "pepper":
            await conn.execute(
                "UPDATE email_messages SET card = $2::jsonb WHERE id = $1", row_id, _card_json(row_id, p)
            )

    async def _after(db: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        """After the outbox row committed: make the Gmail draft, or send, then record the result."""
        row = await db.fetchrow(
            "SELECT * FROM email_messages WHERE account_id = $1 AND dedupe_key = $2", account_id, p["key"]
        )
        if row is None:
            return
        if row["status"] == "draft" and row["card"] is None:
            await _gmail_draft(db, account_id, row)
        elif row["status"] == "queued":
            await _send(db, account_id, row, back_to_draft=False)

    async def _gmail_draft(db: Queries, account_id: UUID, row: Any) -> None:
        p = _payload(row)
        try:
            made = await _gmail(db, account_id, "/gmail/v1/users/me/drafts", {"message": {"raw": _raw(_message(p))}})
        except PepperError:
            await db.execute("DELETE FROM email_messages WHERE id = $1 AND status = 'draft'", row["id"])
            raise
        await db.execute(
            "UPDATE email_messages SET remote_id = $2, card = $3::jsonb WHERE id = $1",
            row["id"], made.get("id"), _card_json(row["id"], p),
        )  # fmt: skip

    async def _send(db: Queries, account_id: UUID, row: Any, *, back_to_draft: bool) -> None:
        """Claim a queued mail, send it, record the result. A failed send that surely did not leave
        goes back to what it was (a draft to review, or nothing); one that may have left stays
        ``failed``, with its Message-ID, as the record of it."""
        p = _payload(row)
        message = _message(p)
        claimed = await db.fetchval(
            "UPDATE email_messages SET status = 'sending', message_id = $2 WHERE id = $1 AND status = 'queued'"
            " RETURNING id",
            row["id"], message["Message-ID"],
        )  # fmt: skip
        if claimed is None:
            return  # another call took it
        remote_id = None
        try:
            if p["sender"] == "gmail":
                if p.get("remote_id"):
                    made = await _gmail(db, account_id, "/gmail/v1/users/me/drafts/send", {"id": p["remote_id"]})
                else:
                    made = await _gmail(db, account_id, "/gmail/v1/users/me/messages/send", {"raw": _raw(message)})
                remote_id = made.get("id")
            else:
                await send_smtp(connectors, message)
        except Exception as exc:
            if getattr(exc, "maybe_sent", not isinstance(exc, PepperError)):
                await db.execute("UPDATE email_messages SET status = 'failed' WHERE id = $1", row["id"])
            elif back_to_draft:
                await db.execute(
                    "UPDATE email_messages SET status = 'draft', message_id = NULL, card = $2::jsonb WHERE id = $1",
                    row["id"], _card_json(row["id"], p),
                )  # fmt: skip
            else:
                await db.execute("DELETE FROM email_messages WHERE id = $1", row["id"])
            raise
        await db.execute(
            "UPDATE email_messages SET status = 'sent', sent_at = now(), remote_id = coalesce($2, remote_id)"
            " WHERE id = $1",
            row["id"], remote_id,
        )  # fmt: skip

    async def _gmail(db: Queries, account_id: UUID, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await _gmail_call(db, connectors, account_id, "POST", path, body)

    async def _plan_pepper(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if not connectors.smtp_configured:
            return ToolOutcome.failed("Pepper's own mail address is not set up on this server")
        return await _plan(ctx, args, "pepper")

    async def _plan_gmail(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return await _plan(ctx, args, "gmail")

    async def _plan_send_draft(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if ctx.session.kind == "scheduled":
            return ToolOutcome.failed("refused: a draft is sent only when the person is present to approve it")
        row = await ctx.db.fetchrow(
            "SELECT * FROM email_messages WHERE id = $1 AND account_id = $2", args["draft"], ctx.session.account_id
        )
        if row is None or row["status"] != "draft":
            return ToolOutcome.failed(f"there is no unsent draft #{args['draft']}")
        bad = await unverifiable(
            ctx.db, ctx.session.account_id, [*row["to_addresses"], *row["cc_addresses"]], ctx.session.turn_id
        )
        if bad:
            return ToolOutcome.failed(
                f"refused: {', '.join(bad)} is not an address Pepper can verify. Nothing was sent; add it as a "
                "contact first"
            )
        who = _who(row["sender"], row["from_address"])
        return ToolOutcome.planned({"draft": row["id"]}, f"draft #{row['id']} sent from {who}")

    async def _apply_send_draft(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        """Queue the reviewed draft (its card goes); ``_after_send_draft`` sends it."""
        await conn.execute(
            "UPDATE email_messages SET status = 'queued', card = NULL WHERE id = $1 AND account_id = $2"
            " AND status = 'draft'",
            p["draft"], account_id,
        )  # fmt: skip

    async def _after_send_draft(db: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        row = await db.fetchrow(
            "SELECT * FROM email_messages WHERE id = $1 AND account_id = $2 AND status = 'queued'",
            p["draft"],
            account_id,
        )
        if row is not None:  # else sent or discarded meanwhile
            await _send(db, account_id, row, back_to_draft=True)

    addresses = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    base = {
        "to": addresses,
        "cc": {"type": "array", "items": {"type": "string"}},
        "subject": {"type": "string", "maxLength": 300},
        "body": {"type": "string", "minLength": 1, "maxLength": 20000},
    }
    return (
        Tool(
            name="email_from_pepper",
            description=(
                "Send an email FROM PEPPER's own address (the person is always copied). Only to the person's own "
                "addresses or contacts. mode=draft saves it for review instead."
            ),
            parameters={
                "type": "object",
                "properties": {**base, "mode": {"type": "string", "enum": ["send", "draft"]}},
                "required": ["to", "subject", "body"],
                "additionalProperties": False,
            },
            handler=_plan_pepper,
            apply=_apply,
            after_commit=_after,
            area=AREA,
            writes=True,
            needs_connection="pepper_mail",
            scheduled=(("mode", "draft"),),
            narrowing=(("to", Narrowing.fewer()), ("cc", Narrowing.fewer())),
        ),
        Tool(
            name="email_from_my_gmail",
            description=(
                "Write an email FROM THE PERSON's own Gmail. Saves a draft (shown as a card to review) unless "
                "mode=send and the person asked to send now; only to their own addresses or contacts."
            ),
            parameters={
                "type": "object",
                "properties": {**base, "mode": {"type": "string", "enum": ["draft", "send"]}},
                "required": ["to", "subject", "body"],
                "additionalProperties": False,
            },
            handler=_plan_gmail,
            apply=_apply,
            after_commit=_after,
            area=AREA,
            writes=True,
            needs_connection="gmail",
            scheduled=(("mode", "draft"),),
            narrowing=(("to", Narrowing.fewer()), ("cc", Narrowing.fewer())),
        ),
        Tool(
            name="send_email_draft",
            description="Send a draft the person reviewed and approved, by its draft number.",
            parameters={
                "type": "object",
                "properties": {"draft": {"type": "integer", "minimum": 1}},
                "required": ["draft"],
                "additionalProperties": False,
            },
            handler=_plan_send_draft,
            apply=_apply_send_draft,
            after_commit=_after_send_draft,
            area=AREA,
            writes=True,
        ),
    )


TOOLS = make_tools(Connectors())

__all__ = [
    "TOOLS",
    "connect_imap",
    "discard_draft",
    "draft_cards",
    "edit_draft",
    "is_draft",
    "make_tools",
    "pending_drafts",
]
