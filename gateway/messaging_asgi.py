"""A thin ASGI layer in front of Quart for Twilio's messaging webhooks: inbound SMS and WhatsApp,
and the delivery receipts of the replies.

Acknowledging a message is one signature check and one statement, yet Quart's request and
response machinery cost more CPU than both together, and at a few hundred messages a second the
web process saturates on it. Receipts come at twice that rate (``sent`` and ``delivered`` for
every reply) and are as small. This layer reads the form itself and hands it to the very same
``gateway.messaging.answer_inbound`` and ``answer_status`` the Quart routes use, so validation,
recording and the answers are shared, not copied. Everything else, and any webhook request it
does not fully understand (another content type, a body declared larger than the limit), falls
through to Quart unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.datastructures import MultiDict

from core.store import unreachable
from gateway.messaging import Answer, answer_inbound, answer_status
from gateway.metrics_route import count_webhook
from gateway.services import Services
from gateway.webhooks import MESSAGE_STATUS, SMS, WHATSAPP

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

Handler = Callable[[Services, str, bytes, Any, Any], Awaitable[Answer]]


def _inbound(channel: str) -> Handler:
    async def answer(services: Services, path: str, query_string: bytes, form: Any, headers: Any) -> Answer:
        return await answer_inbound(services, channel, path, query_string, form, headers)

    return answer


# Path -> (name for the log, handler): the same functions the Quart routes call.
ROUTES: dict[str, tuple[str, Handler]] = {
    SMS.path: ("sms", _inbound("sms")),
    WHATSAPP.path: ("whatsapp", _inbound("whatsapp")),
    MESSAGE_STATUS.path: ("message-status", answer_status),
}
FORM = b"application/x-www-form-urlencoded"
TOO_LARGE = Answer(413, b"request body too large\n", "text/plain")
FAILED = Answer(500, b"internal error\n", "text/plain")
# The database is restarting or out of reach: nothing was recorded, so Twilio should send it again.
UNAVAILABLE = Answer(503, b"temporarily unavailable; retry\n", "text/plain")
RETRY_AFTER_SECONDS = b"1"


class Headers(dict[str, str]):
    """Request headers by lower-case name, looked up in any case (as the signature check does)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class MessagingWebhooks:
    """The ASGI app served: messaging webhooks here, the rest to ``app`` (Quart)."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = ROUTES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = Headers((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"])
        declared = headers.get("content-length")
        if not headers.get("content-type", "").encode("latin-1").startswith(FORM) or (
            declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes)
        ):
            return await self.app(scope, receive, send)  # Quart's own answer (413, an empty form's 403)
        body = await self._body(receive)
        if body is None:
            return  # the client went away
        if len(body) > self.max_body_bytes:
            count_webhook(route[0], TOO_LARGE.status)
            return await _send(send, TOO_LARGE)
        form = MultiDict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        services: Services = self.app.extensions["pepper"]
        name, handler = route
        try:
            answer = await handler(services, scope["path"], scope["query_string"], form, headers)
        except Exception as exc:  # as Quart would: logged, a 500, and Twilio retries
            if unreachable(exc):
                log.warning("the %s webhook found the database out of reach: %s", name, type(exc).__name__)
                answer = UNAVAILABLE
            else:
                log.exception("the %s webhook failed", name)
                answer = FAILED
        await _send(send, answer)
        count_webhook(name, answer.status, duplicate=answer.duplicate)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body, or as much as shows it is over the limit; None on a disconnect."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body_bytes or not message.get("more_body", False):
                return b"".join(chunks)


async def _send(send: Send, answer: Answer) -> None:
    headers = [(b"content-length", str(len(answer.body)).encode())]
    if answer.content_type:  # none for a 204
        headers.append((b"content-type", answer.content_type.encode()))
    if answer.status == 503:
        headers.append((b"retry-after", RETRY_AFTER_SECONDS))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
