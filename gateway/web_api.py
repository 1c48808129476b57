"""The web app's JSON API beyond the chat: draft cards, the approvals queue, a task's "run now",
the person's half of the dossier, a room's calendar shares and connecting an IMAP mailbox.

Every endpoint needs the signed-in session (or an API token) and, to change anything, the
session's CSRF token (``gateway.webchat._authenticate``); every id is looked up within the
signed-in account, so another account's id is simply not found.

Draft cards and approvals are registries of kinds: a new kind of draft is a :class:`DraftKind`
in ``DRAFT_KINDS``, a new kind of approval an :class:`ApprovalKind` in ``APPROVAL_KINDS``; the
chat's cards and the approvals page list whatever the registries hold. A draft is sent through
the same tool, gate and recipient rules as the model's call would be (:func:`run_owner_tool`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from uuid import UUID, uuid4

from quart import Blueprint, Response, current_app

from core.adapters.imap import ImapError, ImapLoginRefused
from core.conversation import conversation_for
from core.errors import InvalidInput, PepperError
from core.memory.dossier import set_owner_text
from core.models.types import ToolCall
from core.records import rooms, texts
from core.records.mcp import McpToolRow, pending_approvals
from core.records.mcp import decide as decide_tool
from core.records.rooms import SHARE_LEVELS
from core.scheduling.runs import run_now
from core.scheduling.tasks import account_timezone, is_active
from core.store.pool import connection
from core.suggestions import accept as accept_suggestion
from core.suggestions import cards as suggestion_cards
from core.suggestions import dismiss as dismiss_suggestion
from core.suggestions import parse_id as parse_suggestion_id
from core.tools.areas.email import discard_draft, edit_draft, is_draft, pending_drafts
from core.tools.areas.mail import connect_imap
from core.tools.areas.messages import MAX_TEXT
from core.tools.connectors import account_connections
from core.tools.context import SessionContext
from core.tools.mcp import definition_diff
from core.tools.registry import ToolContext
from core.tools.runner import CallOutcome, run_call
from gateway.services import Services
from gateway.webchat import _json_body, _json_error, _message_id, _storable, signed_in

blueprint = Blueprint("web_api", __name__)

MAX_RECIPIENTS = 50


def _services() -> Services:
    return current_app.extensions["pepper"]


def _ok(payload: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(payload, default=str), status=status, content_type="application/json")


@dataclass(frozen=True)
class Answer:
    """What became of a person's action: ``ok`` and a sentence to show them."""

    ok: bool
    message: str


async def owner_session(services: Services, account_id: UUID) -> SessionContext:
    """The signed-in person as their own live turn sees them: trusted as the verified owner, on
    the web channel."""
    db, harness = services.db, services.harness
    return SessionContext(
        "live", "owner_verified", "web", account_id, await conversation_for(db, account_id), None,
        await account_timezone(db, account_id), await account_connections(db, account_id, harness.connectors),
    )  # fmt: skip


async def run_owner_tool(services: Services, account_id: UUID, name: str, arguments: dict[str, Any]) -> CallOutcome:
    """Run one tool for the signed-in person, as their own live turn would: the harness's
    registry and gate and :func:`owner_session`."""
    db, harness = services.db, services.harness
    session = await owner_session(services, account_id)
    call = ToolCall(f"web-{uuid4().hex[:12]}", name, arguments)
    async with connection(db, stateless=True) as conn:
        ctx = ToolContext(session, conn, datetime.now(UTC))
        return await run_call(harness.registry, harness.gate, ctx, call)


# --- draft cards ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """One card: what would go out, to whom, and whether a scheduled run held it back."""

    kind: str
    id: str
    title: str
    sender: str
    to: list[str]
    cc: list[str]
    subject: str
    body: str
    held: bool = False

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["from"] = data.pop("sender")
        return data


class DraftKind(Protocol):
    name: str

    async def pending(self, services: Services, account_id: UUID) -> list[Draft]: ...

    async def edit(self, services: Services, account_id: UUID, draft_id: str, fields: dict[str, Any]) -> Draft | None:
        """The edited draft, or None when there is no such draft. Raises ``InvalidInput``."""
        ...

    async def send(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None: ...

    async def discard(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None: ...


def _email_draft(card: dict[str, Any], held: bool) -> Draft:
    title = "Email from Pepper" if card["sender"] == "pepper" else "Draft in your Gmail"
    if held:
        title += " (held by a scheduled run)"
    return Draft(
        "email", str(card["draft"]), title, card["from"], list(card["to"]), list(card["cc"]), card["subject"],
        card["body"], held,
    )  # fmt: skip


class EmailDrafts:
    """Mail drafts: Pepper's own, the person's Gmail drafts, and sends a scheduled run held back."""

    name = "email"

    async def pending(self, services: Services, account_id: UUID) -> list[Draft]:
        return [_email_draft(card, held) for card, held in await pending_drafts(services.db, account_id)]

    async def edit(self, services: Services, account_id: UUID, draft_id: str, fields: dict[str, Any]) -> Draft | None:
        number = _message_id(draft_id)
        if number is None:
            return None
        card = await edit_draft(
            services.db, services.harness.connectors, account_id, number, to=fields["to"], cc=fields["cc"],
            subject=fields["subject"], body=fields["body"],
        )  # fmt: skip
        if card is None:
            return None
        return next((d for d in await self.pending(services, account_id) if d.id == draft_id), None)

    async def send(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None:
        number = _message_id(draft_id)
        if number is None or not await is_draft(services.db, account_id, number):
            return None
        outcome = await run_owner_tool(services, account_id, "send_email_draft", {"draft": number})
        if outcome.status == "ok":
            return Answer(True, "Sent.")
        return Answer(False, outcome.content)

    async def discard(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None:
        number = _message_id(draft_id)
        if number is None or not await discard_draft(services.db, services.harness.connectors, account_id, number):
            return None
        return Answer(True, "Discarded; nothing was sent.")


class TextDrafts:
    """Texts to contacts a scheduled run held back (the messages area): edited (the text only),
    sent through ``send_text_draft`` (the recipient rules checked again), or discarded."""

    name = "text"

    async def pending(self, services: Services, account_id: UUID) -> list[Draft]:
        return [
            Draft("text", str(r["id"]), f"Text to {r['contact']} ({r['channel']}, held by a scheduled run)",
                  r["from_number"], [r["to_number"]], [], "", r["body"], True)
            for r in await texts.drafts_of(services.db, account_id)
        ]  # fmt: skip

    async def edit(self, services: Services, account_id: UUID, draft_id: str, fields: dict[str, Any]) -> Draft | None:
        number = _message_id(draft_id)
        body = fields["body"].strip()
        if not body or len(body) > MAX_TEXT:
            raise InvalidInput(f"a text is 1 to {MAX_TEXT} characters")
        if number is None or not await texts.edit_draft(services.db, account_id, number, body):
            return None
        return next((d for d in await self.pending(services, account_id) if d.id == draft_id), None)

    async def send(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None:
        number = _message_id(draft_id)
        if number is None or not any(d.id == draft_id for d in await self.pending(services, account_id)):
            return None
        outcome = await run_owner_tool(services, account_id, "send_text_draft", {"id": number})
        return Answer(True, "Sent.") if outcome.status == "ok" else Answer(False, outcome.content)

    async def discard(self, services: Services, account_id: UUID, draft_id: str) -> Answer | None:
        number = _message_id(draft_id)
        if number is None or not await texts.discard_draft(services.db, account_id, number):
            return None
        return Answer(True, "Discarded; nothing was sent.")


DRAFT_KINDS: dict[str, DraftKind] = {kind.name: kind for kind in (EmailDrafts(), TextDrafts())}


async def all_drafts(services: Services, account_id: UUID) -> list[Draft]:
    return [d for kind in DRAFT_KINDS.values() for d in await kind.pending(services, account_id)]


def _edit_fields(body: Any) -> dict[str, Any] | str:
    """The edit a card posts, checked; or what is wrong with it."""
    if not isinstance(body, dict):
        return 'send JSON {"to": [...], "cc": [...], "subject": "...", "body": "..."}'
    fields: dict[str, Any] = {}
    for name in ("to", "cc"):
        value = body.get(name, [])
        if not isinstance(value, list) or len(value) > MAX_RECIPIENTS or not all(isinstance(a, str) for a in value):
            return f"{name} is a list of at most {MAX_RECIPIENTS} addresses"
        fields[name] = value
    for name, most in (("subject", 300), ("body", 20000)):
        value = body.get(name)
        if not isinstance(value, str) or len(value) > most:
            return f"{name} is text of at most {most} characters"
        fields[name] = value
    if not all(_storable(v) for v in [*fields["to"], *fields["cc"], fields["subject"], fields["body"]]):
        return "the draft holds a character that cannot be stored (NUL or a lone surrogate)"
    return fields


def _usable(handler: object, action: str, actions: tuple[str, ...]) -> Response | None:
    """Why an action on a kind cannot be taken (404: no such kind or action; 503: this server
    runs no tools), or None."""
    if handler is None or action not in actions:
        return _json_error(404, "no-such-action", "no such kind or action")
    if _services().harness is None:
        return _json_error(503, "not-set-up", "no model is configured, so this cannot be done from here")
    return None


@blueprint.get("/api/drafts")
@signed_in(state_changing=False)
async def drafts(who: UUID) -> Response:
    return _ok({"drafts": [d.as_json() for d in await all_drafts(_services(), who)]})


@blueprint.post("/api/drafts/<kind>/<draft_id>/<action>")
@signed_in(state_changing=True)
async def draft_action(who: UUID, kind: str, draft_id: str, action: str) -> Response:
    handler = DRAFT_KINDS.get(kind)
    problem = _usable(handler, action, ("edit", "send", "discard"))
    if problem is not None or handler is None:
        return problem or _json_error(404, "no-such-action", "no such kind or action")
    services = _services()
    if action == "edit":
        fields = _edit_fields(await _json_body())
        if isinstance(fields, str):
            return _json_error(400, "bad-draft", fields)
        try:
            draft = await handler.edit(services, who, draft_id, fields)
        except InvalidInput as exc:
            return _json_error(400, "bad-draft", exc.message)
        except PepperError as exc:
            return _json_error(502, "not-saved", f"the draft was not changed: {exc.message}")
        if draft is None:
            return _json_error(404, "no-such-draft", "no unsent draft with that id")
        return _ok({"message": "Saved.", "draft": draft.as_json()})
    answer = await (handler.send if action == "send" else handler.discard)(services, who, draft_id)
    if answer is None:
        return _json_error(404, "no-such-draft", "no unsent draft with that id (already sent or discarded?)")
    return _ok({"message": answer.message}, 200 if answer.ok else 422)


# --- approvals -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Approval:
    """One item waiting for the person's yes or no."""

    kind: str
    id: str
    title: str
    detail: str
    approve_label: str = "Approve"
    reject_label: str = "Reject"


class ApprovalKind(Protocol):
    name: str
    title: str  # the heading its items are listed under

    async def pending(self, services: Services, account_id: UUID) -> list[Approval]: ...

    async def decide(self, services: Services, account_id: UUID, item_id: str, approve: bool) -> Answer | None:
        """Approve or reject; None when there is no such pending item (decided already)."""
        ...


class HeldMail:
    """Mail a scheduled run wanted to send: no one was present, so it waits for the person."""

    name = "held-mail"
    title = "Mail held by scheduled runs"

    async def pending(self, services: Services, account_id: UUID) -> list[Approval]:
        held = [d for d in await EmailDrafts().pending(services, account_id) if d.held]
        return [_held_approval(self.name, d) for d in held]

    async def decide(self, services: Services, account_id: UUID, item_id: str, approve: bool) -> Answer | None:
        if item_id not in {a.id for a in await self.pending(services, account_id)}:
            return None
        drafts = EmailDrafts()
        return await (drafts.send if approve else drafts.discard)(services, account_id, item_id)


def _held_approval(kind: str, d: Draft) -> Approval:
    copy = f", cc {', '.join(d.cc)}" if d.cc else ""
    title = f"{d.subject or '(no subject)'} — to {', '.join(d.to)}"
    return Approval(kind, d.id, title, f"From {d.sender}{copy}\n\n{d.body}", "Send", "Discard")


class McpTools:
    """Tools of the person's MCP servers that wait for a first approval, or are held because the
    server changed them since (docs/mcp.md). An item's id pins the definition shown: a server that
    changes it again before the click makes the click find nothing, never approve the new one."""

    name = "mcp-tool"
    title = "Tools of connected MCP servers"

    @staticmethod
    def _id(row: McpToolRow) -> str:
        return f"{row.connection_id}:{row.name}:{row.fingerprint[:16]}"

    async def pending(self, services: Services, account_id: UUID) -> list[Approval]:
        return [_mcp_approval(self.name, self._id(r), r) for r in await pending_approvals(services.db, account_id)]

    async def decide(self, services: Services, account_id: UUID, item_id: str, approve: bool) -> Answer | None:
        rows = await pending_approvals(services.db, account_id)
        row = next((r for r in rows if self._id(r) == item_id), None)
        if row is None:
            return None
        await decide_tool(services.db, row.connection_id, row.name, approve=approve)
        verb = "Approved" if approve else "Rejected"
        return Answer(True, f"{verb} {row.name} on {row.server}, as its definition was shown.")


def _mcp_approval(kind: str, item_id: str, row: McpToolRow) -> Approval:
    d = row.definition
    hints = d.get("annotations") or {}
    acts = "reads only (the server says so)" if hints.get("readOnlyHint") else "may write or act (counts as a write)"
    if row.state == "held":
        lines = ["The server changed this tool since you approved it:", *definition_diff(row.approved, d)]
    else:
        lines = [" ".join((d.get("description") or "").split()),
                 f"Input: {json.dumps(d.get('input_schema'), sort_keys=True)}"]  # fmt: skip
    title = f"{row.name} on {row.server} ({'changed' if row.state == 'held' else 'new'}; {acts})"
    return Approval(kind, item_id, title, "\n".join(lines))


class SuggestionCards:
    """The calendar's suggestions (``core.suggestions``): accepting runs the card's action through
    the harness's gate as the person's own call; dismissing closes it for good. Only promoted
    detectors' cards are here: a detector in shadow shows nothing."""

    name = "suggestion"
    title = "Suggestions from your calendar"

    async def pending(self, services: Services, account_id: UUID) -> list[Approval]:
        out = []
        for c in await suggestion_cards(services.db, account_id):
            detail = f"{c.detail}\n\nAccept: {c.does}." + (f"\nLast try: {c.result}" if c.result else "")
            out.append(Approval(self.name, str(c.id), c.title, detail, "Accept", "Dismiss"))
        return out

    async def decide(self, services: Services, account_id: UUID, item_id: str, approve: bool) -> Answer | None:
        card_id = parse_suggestion_id(item_id)
        if card_id is None:
            return None
        if not approve:
            done = await dismiss_suggestion(services.db, account_id, card_id)
        else:
            harness = services.harness
            done = await accept_suggestion(
                services.db, harness.registry, harness.gate, await owner_session(services, account_id), card_id,
                datetime.now(UTC),
            )  # fmt: skip
        return None if done is None else Answer(done.ok, done.message)


APPROVAL_KINDS: dict[str, ApprovalKind] = {kind.name: kind for kind in (HeldMail(), McpTools(), SuggestionCards())}


async def all_approvals(services: Services, account_id: UUID) -> list[tuple[ApprovalKind, list[Approval]]]:
    return [(kind, await kind.pending(services, account_id)) for kind in APPROVAL_KINDS.values()]


@blueprint.get("/api/approvals")
@signed_in(state_changing=False)
async def approvals(who: UUID) -> Response:
    listed = await all_approvals(_services(), who)
    return _ok({"approvals": [asdict(item) for _, items in listed for item in items]})


@blueprint.post("/api/approvals/<kind>/<item_id>/<decision>")
@signed_in(state_changing=True)
async def decide(who: UUID, kind: str, item_id: str, decision: str) -> Response:
    handler = APPROVAL_KINDS.get(kind)
    problem = _usable(handler, decision, ("approve", "reject"))
    if problem is not None or handler is None:
        return problem or _json_error(404, "no-such-action", "no such kind or action")
    answer = await handler.decide(_services(), who, item_id, decision == "approve")
    if answer is None:
        return _json_error(404, "no-such-approval", "nothing with that id waits for your approval (decided already?)")
    return _ok({"message": answer.message}, 200 if answer.ok else 422)


# --- tasks and the dossier -----------------------------------------------------------------------


@blueprint.post("/api/tasks/<raw_id>/run")
@signed_in(state_changing=True)
async def run_task_now(who: UUID, raw_id: str) -> Response:
    task_id = _message_id(raw_id)
    if task_id is None:
        return _json_error(400, "bad-id", "a task id is a whole number from the task list")
    db = _services().db
    run_id = await run_now(db, task_id, who, datetime.now(UTC))
    if run_id is not None:
        return _ok({"message": "It runs within a minute; its receipt appears below.", "run_id": run_id}, 202)
    if not await is_active(db, task_id, who):
        return _json_error(404, "no-such-task", "no active task with that id")
    return _ok({"message": "A run of it is already due; it was not added twice.", "duplicate": True})


@blueprint.post("/api/rooms/<raw_room>/shares")
@signed_in(state_changing=True)
async def set_room_share(who: UUID, raw_room: str) -> Response:
    """Set what the signed-in member shares of one of their own calendars with a room. The member
    is the session's account and nothing else: a body naming an account or member is refused."""
    body = await _json_body()
    if not isinstance(body, dict) or set(body) != {"calendar", "level"}:
        return _json_error(400, "bad-share", 'send JSON {"calendar": "<id>", "level": "..."}: your own levels only')
    room_id, calendar_id = _uuid(raw_room), _uuid(body["calendar"])
    if room_id is None or calendar_id is None:
        return _json_error(400, "bad-id", "a room or calendar id is the id from the rooms page")
    level = body["level"]
    if level not in SHARE_LEVELS:
        return _json_error(400, "bad-level", f"a level is one of {', '.join(SHARE_LEVELS)}")
    db = _services().db
    if not await rooms.is_member(db, room_id, who):
        return _json_error(404, "no-such-room", "you are not a member of that room")
    before = (await rooms.shares(db, room_id)).get((who, calendar_id), "nothing")
    try:
        await rooms.set_share(db, room_id, who, calendar_id, level)
    except InvalidInput:
        return _json_error(404, "no-such-calendar", "that is not one of your calendars")
    changed = before != level
    return _ok({"message": "Saved; the room's next turn sees it." if changed else "No change.", "changed": changed})


def _uuid(raw: Any) -> UUID | None:
    if not isinstance(raw, str) or len(raw) > 40:
        return None
    try:
        return UUID(raw)
    except ValueError:
        return None


@blueprint.post("/api/dossier")
@signed_in(state_changing=True)
async def save_dossier(who: UUID) -> Response:
    body = await _json_body()
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not _storable(body["text"]):
        return _json_error(400, "bad-dossier", 'send JSON {"text": "..."} (your half of the dossier)')
    try:
        changed = await set_owner_text(_services().db, who, body["text"], source="web")
    except InvalidInput as exc:
        return _json_error(400, "too-long", exc.message)
    return _ok({"message": "Saved; Pepper reads it from your next message." if changed else "No change.",
                "changed": changed})  # fmt: skip


IMAP_FIELDS = frozenset({"label", "host", "port", "username", "password", "security"})


@blueprint.post("/api/connections/imap")
@signed_in(state_changing=True)
async def connect_mailbox(who: UUID) -> Response:
    """Connect an IMAP mailbox from the settings page, as ``pepper connect imap`` does: Pepper signs
    in (INBOX read-only) and only then stores it, the password sealed. Connecting the same mailbox
    again updates it; a wrong password or an unreachable server stores nothing."""
    body = await _json_body()
    if not isinstance(body, dict) or not {"host", "username", "password"} <= set(body) <= IMAP_FIELDS:
        return _json_error(400, "bad-mailbox", 'send JSON {"host", "username", "password"} and optionally'
                                               ' "label", "port", "security"')  # fmt: skip
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in body.values()):
        return _json_error(400, "bad-mailbox", "every field is a string")
    fields = {k: str(v).strip() for k, v in body.items()}
    fields["password"] = str(body["password"])  # a password may start or end with a space
    port: int | None = None
    if fields.get("port"):
        if not fields["port"].isdigit() or len(fields["port"]) > 5:
            return _json_error(400, "bad-port", f"{fields['port']!r} is not a port")
        port = int(fields["port"])
    label = fields.get("label") or f"{fields['username']}@{fields['host']}"
    services = _services()
    try:
        _, created, count = await connect_imap(
            services.db, services.harness.connectors, who, label, host=fields["host"], port=port,
            username=fields["username"], password=fields["password"], security=fields.get("security") or "ssl",
        )  # fmt: skip
    except ImapLoginRefused as exc:
        return _json_error(400, "login-refused", exc.message)
    except ImapError as exc:
        return _json_error(502, "unreachable", exc.message)
    except PepperError as exc:  # InvalidInput (bad settings), ConfigError (no key to seal with)
        return _json_error(400, "bad-mailbox", exc.message)
    state = "Connected" if created else "Updated the already connected"
    return _ok({"message": f"{state} mailbox {label!r} (read-only; its INBOX holds {count} message(s)).",
                "created": created, "messages": count})  # fmt: skip
