"""Web chat and the chat API: the owner signs in, sees the one conversation, and talks to Pepper.

Browser requests authenticate with a session cookie (HttpOnly, SameSite=Strict, Secure behind
https) and send the session's CSRF token in ``X-CSRF-Token`` on every state-changing request; API
clients such as ``pepper chat`` send ``Authorization: Bearer <token>`` instead. Replies are pushed
over Server-Sent Events; the client acknowledges each reply it showed, and that acknowledgement is
the delivery that commits the turn's staged writes.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from quart import Blueprint, Response, current_app, make_response, redirect, request
from quart.typing import ResponseReturnValue

from core import access
from core.conversation import conversation_for, record_outbound
from core.errors import InvalidInput
from core.records import folders, messages, web
from core.records.turns import SETTLED, turn_status
from core.security import record_security_event
from core.tools.folder import check_declared
from gateway.channels import AWAITING_RECEIPT, Claimed, Delivery, Limits, receive, settle_delivery
from gateway.markdown import to_html
from gateway.services import Services

log = logging.getLogger(__name__)

blueprint = Blueprint("webchat", __name__)

COOKIE = "pepper_session"
# app.extensions key: callables given the token hash of a web session that signs out
SIGN_OUT_HOOKS = "pepper-sign-out"
MAX_MESSAGE_CHARS = 8000
STREAM_SECONDS = 300.0  # EventSource reconnects by itself; a bounded stream never pins shutdown
KEEPALIVE_SECONDS = 15.0
MAX_ID = 2**63 - 1  # message ids are Postgres bigints
MAX_FOLDER_RESULT = 20_000  # characters of one lent-folder tool's answer that reach the model


def _services() -> Services:
    return current_app.extensions["pepper"]


def _json_error(status: int, code: str, message: str) -> Response:
    return Response(json.dumps({"error": code, "message": message}), status=status, content_type="application/json")


async def _authenticate(*, state_changing: bool) -> UUID | Response:
    """The signed-in account, or the 401/403 response to return."""
    db = _services().db
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        account_id = await access.account_for_token(db, header.removeprefix("Bearer ").strip())
        return account_id if account_id else _json_error(401, "bad-token", "unknown or revoked API token")
    session = await access.session_for(db, request.cookies.get(COOKIE))
    if session is None:
        return _json_error(401, "signed-out", "sign in first")
    if state_changing and not hmac.compare_digest(request.headers.get("X-CSRF-Token", ""), session.csrf_token):
        return _json_error(403, "csrf", "missing or wrong CSRF token")
    return session.account_id


def signed_in(
    *, state_changing: bool
) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
    """An API endpoint for the signed-in only: the handler gets the account id first
    (``_authenticate`` answers 401/403 for it otherwise)."""

    def wrap(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        @functools.wraps(handler)
        async def view(*args: Any, **kwargs: Any) -> Response:
            who = await _authenticate(state_changing=state_changing)
            if isinstance(who, Response):
                return who
            return await handler(who, *args, **kwargs)

        return view

    return wrap


def _same_origin() -> bool:
    """A form post must come from our own page (login CSRF): its Origin, when sent, is ours."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    public = _services().settings.public_url
    own = {f"{request.scheme}://{request.host}"} | ({public} if public else set())
    return origin in own


def _message_id(raw: str | None) -> int | None:
    """A message id from a path or query: decimal digits within a bigint, else None."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        return None
    value = int(raw)
    return value if value <= MAX_ID else None


def plain_id(raw: str) -> bool:
    """A provider's id from a path (a call's sid): letters, digits, ``-`` and ``_``, at most 64."""
    return 0 < len(raw) <= 64 and raw.isascii() and raw.replace("-", "").replace("_", "").isalnum()


def _storable(text: str) -> bool:
    """Postgres text holds no NUL, and UTF-8 has no lone surrogates (JSON can spell both)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _json_body() -> Any:
    """The request's JSON, or None when it is not UTF-8 JSON (the app's body limit answers 413)."""
    raw = await request.get_data(as_text=False)
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _message_json(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "channel": row["channel"],
        "direction": row["direction"],
        "body": row["body"],
        "created_at": row["created_at"].isoformat(),
        "turn_id": str(row["turn_id"]) if row["turn_id"] else None,
        # Pepper's replies are Markdown: shown as sanitised HTML. The person's words stay text.
        "html": to_html(row["body"]) if row["direction"] == "outbound" else None,
    }


# --- the page ------------------------------------------------------------------------------------


@blueprint.post("/chat/login")
async def login() -> ResponseReturnValue:
    if not _same_origin():
        return _json_error(403, "cross-origin", "sign in from Pepper's own page")
    form = await request.form
    services = _services()
    login_name, password = form.get("login", ""), form.get("password", "")
    if not (_storable(login_name) and _storable(password)) or len(login_name) > 200 or len(password) > 1000:
        log.info("web sign-in refused")
        return redirect("/?error=1")
    with services.login_throttle.attempt(login_name, request.remote_addr or "") as attempt:
        if attempt.retry_after is not None:
            log.warning("web sign-in throttled: retry_after=%s", attempt.retry_after)
            await record_security_event(
                services.db, "web-sign-in-throttled", path=request.path, retry_after=str(attempt.retry_after)
            )
            response = _json_error(429, "throttled", "too many failed sign-ins; wait before trying again")
            response.headers["Retry-After"] = str(attempt.retry_after)
            return response
        account_id = await access.check_web_login(services.db, login_name, password)
        if account_id is not None:
            attempt.succeeded()
    if account_id is None:
        log.info("web sign-in refused")
        return redirect("/?error=1")
    token, _ = await access.create_session(services.db, account_id)
    response = redirect("/")
    secure = (services.settings.public_url or "").startswith("https://") or request.scheme == "https"
    response.set_cookie(
        COOKIE, token, max_age=int(access.SESSION_LIFETIME.total_seconds()), httponly=True, secure=secure,
        samesite="Strict", path="/",
    )  # fmt: skip
    return response


@blueprint.post("/chat/logout")
async def logout() -> Response:
    who = await _authenticate(state_changing=True)
    if isinstance(who, Response):
        return who
    token = request.cookies.get(COOKIE)
    await access.end_session(_services().db, token)
    if token is not None:
        # What else the session holds ends with it (a browser call: gateway.browser_calls).
        for on_sign_out in current_app.extensions.get(SIGN_OUT_HOOKS, ()):
            on_sign_out(access.token_hash(token))
    response = Response(json.dumps({"ok": True}), content_type="application/json")
    response.delete_cookie(COOKIE, path="/")
    return response


# --- the API -------------------------------------------------------------------------------------


@blueprint.get("/api/session")
async def session_info() -> Response:
    db = _services().db
    session = await access.session_for(db, request.cookies.get(COOKIE))
    if session is None:
        return _json_error(401, "signed-out", "sign in first")
    name = await web.account_name(db, session.account_id)
    return Response(json.dumps({"name": name, "csrf_token": session.csrf_token}), content_type="application/json")


@blueprint.get("/api/messages")
async def history() -> Response:
    who = await _authenticate(state_changing=False)
    if isinstance(who, Response):
        return who
    try:
        limit = min(max(int(request.args.get("limit", "100")), 1), 500)
    except ValueError:
        return _json_error(400, "bad-limit", "limit must be a number")
    db = _services().db
    conversation_id = await conversation_for(db, who)
    rows = await messages.latest(db, conversation_id, limit)
    return Response(json.dumps({"messages": [_message_json(r) for r in rows]}), content_type="application/json")


@blueprint.post("/api/messages")
async def post_message() -> Response:
    who = await _authenticate(state_changing=True)
    if isinstance(who, Response):
        return who
    body = await _json_body()
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not body["text"].strip():
        return _json_error(400, "bad-message", 'send JSON {"text": "...", "client_id": "..."}')
    text = body["text"].strip()
    if not _storable(text):
        return _json_error(
            400, "bad-text", "the text holds a character that cannot be stored (NUL or a lone surrogate)"
        )
    if len(text) > MAX_MESSAGE_CHARS:
        return _json_error(413, "too-long", f"a message has at most {MAX_MESSAGE_CHARS} characters")
    client_id = body.get("client_id")
    if client_id is not None and (
        not isinstance(client_id, str) or not 8 <= len(client_id) <= 100 or not _storable(client_id)
    ):
        return _json_error(400, "bad-client-id", "client_id is a string of 8 to 100 characters")
    services = _services()
    # A message from `pepper chat --folder` names the folder its session lends: only turns of
    # messages that name it see its tools (core/records/folders.py), not the person's other chats.
    meta = None
    if "folder_id" in body:
        folder = _uuid(body["folder_id"]) if isinstance(body["folder_id"], str) else None
        if folder is None or not await folders.is_active(services.db, who, folder):
            return _json_error(404, "no-folder", "no such lent folder of yours (ended or lapsed?)")
        meta = {"folder_id": str(folder)}
    # The client's id makes a retried POST record nothing new and start no second turn.
    message, created = await receive(
        services.db, "web", who, text, key=f"{who}:{client_id}" if client_id else None, meta=meta
    )
    payload = {"message_id": message.id, "duplicate": not created}
    return Response(json.dumps(payload), status=202 if created else 200, content_type="application/json")


# --- A folder lent by `pepper chat --folder` (core/tools/folder.py) ---------------------------------


def _uuid(raw: str) -> UUID | None:
    try:
        return UUID(raw)
    except ValueError:
        return None


async def _folder_caller(*ids: str, state_changing: bool) -> Response | tuple[UUID, list[UUID]]:
    """The signed-in account and the ids in the path, or the error response (a garbage id: 404,
    like one that does not exist)."""
    who = await _authenticate(state_changing=state_changing)
    if isinstance(who, Response):
        return who
    parsed = [_uuid(raw) for raw in ids]
    if any(p is None for p in parsed):
        return _json_error(404, "no-folder", "no such lent folder or call")
    return who, [p for p in parsed if p is not None]


@blueprint.post("/api/folder")
async def lend_folder() -> Response:
    """Lend a folder: the CLI declares its tools, every one read-only, or nothing is lent."""
    caller = await _folder_caller(state_changing=True)
    if isinstance(caller, Response):
        return caller
    body = await _json_body()
    try:
        tools = check_declared(body.get("tools") if isinstance(body, dict) else None)
    except InvalidInput as exc:
        return _json_error(400, "bad-folder-tools", exc.message)
    folder_id = await folders.lend(_services().db, caller[0], tools)
    return Response(json.dumps({"id": str(folder_id)}), status=201, content_type="application/json")


@blueprint.delete("/api/folder/<raw_id>")
async def end_folder(raw_id: str) -> Response:
    caller = await _folder_caller(raw_id, state_changing=True)
    if isinstance(caller, Response):
        return caller
    if not await folders.end(_services().db, caller[0], caller[1][0]):
        return _json_error(404, "no-folder", "no such lent folder")
    return Response(status=204)


@blueprint.get("/api/folder/<raw_id>/calls")
async def folder_calls(raw_id: str) -> Response:
    """The calls waiting for the CLI; asking keeps the lending alive."""
    caller = await _folder_caller(raw_id, state_changing=False)
    if isinstance(caller, Response):
        return caller
    calls = await folders.waiting_calls(_services().db, caller[0], caller[1][0])
    if calls is None:
        return _json_error(404, "no-folder", "no such lent folder, or it lapsed")
    return Response(json.dumps({"calls": calls}), content_type="application/json")


@blueprint.post("/api/folder/<raw_id>/calls/<raw_call>")
async def folder_call_result(raw_id: str, raw_call: str) -> Response:
    caller = await _folder_caller(raw_id, raw_call, state_changing=True)
    if isinstance(caller, Response):
        return caller
    body = await _json_body()
    content = body.get("content") if isinstance(body, dict) else None
    is_error = body.get("is_error", False) if isinstance(body, dict) else None
    if not isinstance(content, str) or not isinstance(is_error, bool) or not _storable(content):
        return _json_error(400, "bad-result", 'send JSON {"content": "...", "is_error": false}')
    who, (folder_id, call_id) = caller
    done = await folders.answer(_services().db, who, folder_id, call_id, content[:MAX_FOLDER_RESULT], is_error)
    if done == "unknown":
        return _json_error(404, "no-call", "no such call")
    if done == "duplicate":
        return _json_error(409, "answered", "this call was answered already")
    return Response(json.dumps({"ok": True}), content_type="application/json")


class WebChannel:
    """The web chat and the chat API (``gateway.channels.Channel``): a reply is recorded in the
    conversation, which announces it to every open chat, in whichever process serves it
    (``gateway.live``); the client's acknowledgement of it is the delivery (``acknowledge``)."""

    name = "web"
    limits = Limits(inbound_chars=MAX_MESSAGE_CHARS, streams=True)

    def can_reply(self, claimed: Claimed) -> bool:
        return True

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        conversation_id = await conversation_for(services.db, claimed.account_id)
        for part in parts:
            await record_outbound(services.db, conversation_id, "web", part, turn_id=turn_id)
        return AWAITING_RECEIPT


WEB_CHANNEL = WebChannel()


@blueprint.post("/api/messages/<raw_id>/ack")
async def acknowledge(raw_id: str) -> Response:
    """The client showed this web reply: deliver the turn (commit its staged writes). Idempotent:
    only the first acknowledgement marks the reply read and delivers; a repeat answers 200."""
    who = await _authenticate(state_changing=True)
    if isinstance(who, Response):
        return who
    message_id = _message_id(raw_id)
    if message_id is None:
        return _json_error(400, "bad-id", "a message id is a whole number from the message list")
    services = _services()
    row = await web.mark_reply_read(services.db, message_id, who)
    if row is None:
        if await web.is_own_reply(services.db, message_id, who):
            return Response(json.dumps({"ok": True, "duplicate": True}), content_type="application/json")
        return _json_error(404, "no-such-reply", "no web reply with that id in your conversation")
    turn_id = row["turn_id"]
    if turn_id is not None and services.harness is not None and await turn_status(services.db, turn_id) not in SETTLED:
        await settle_delivery(services, turn_id, ok=True, detail={"channel": "web", "ack": message_id})
    return Response(json.dumps({"ok": True}), content_type="application/json")


@blueprint.get("/api/events")
async def events() -> Response:
    """Server-Sent Events: every new message of the conversation, from ``after`` on; with
    ``progress=1`` also the turns' progress (``delta`` and ``working`` events, see
    ``_progress_event``), which clients that only read messages never see."""
    who = await _authenticate(state_changing=False)
    if isinstance(who, Response):
        return who
    services = _services()
    after = _message_id(request.args.get("after") or request.headers.get("Last-Event-ID") or "0")
    if after is None:
        return _json_error(400, "bad-after", "after must be a message id")
    conversation_id = await conversation_for(services.db, who)
    feed = services.live
    progress = request.args.get("progress") == "1"

    async def stream():  # type: ignore[no-untyped-def]
        async with feed.subscribe(conversation_id) as queue:
            yield b"retry: 1000\n\n"
            # Catch up on what was recorded before the subscription began.
            last = after
            for row in await messages.after(services.db, conversation_id, after):
                last = row["id"]
                yield _event(row)
            deadline = asyncio.get_running_loop().time() + STREAM_SECONDS
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), min(KEEPALIVE_SECONDS, left))
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if isinstance(item, dict):
                    if progress:
                        yield _progress_event(item)
                    continue
                message_id = item
                if message_id <= last:
                    continue
                row = await messages.message(services.db, message_id)
                if row is not None:
                    last = message_id
                    yield _event(row)

    response = await make_response(stream(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    response.timeout = None  # type: ignore[union-attr]
    return response  # type: ignore[return-value]


def _progress_event(item: dict[str, str]) -> bytes:
    """A turn's progress: ``delta`` (more of the reply's text) or ``working`` (a tool started,
    named in plain words). No id: a reconnecting page resumes from messages, not progress."""
    if item["kind"] == "delta":
        return f"event: delta\ndata: {json.dumps({'turn_id': item['turn_id'], 'text': item['text']})}\n\n".encode()
    data = {"turn_id": item["turn_id"], "tool": item["text"], "label": tool_label(item["text"])}
    return f"event: working\ndata: {json.dumps(data)}\n\n".encode()


def tool_label(name: str) -> str:
    """A tool's name in plain words: ``complete_todo`` -> ``Complete todo``."""
    words = name.replace("_", " ").replace(".", " ").strip()
    return (words[:1].upper() + words[1:]) if words else "A tool"


def _event(row: Any) -> bytes:
    return f"id: {row['id']}\nevent: message\ndata: {json.dumps(_message_json(row))}\n\n".encode()
