"""Twilio Voice: the call webhook, the media WebSocket, the after-stream action and call status.

The gateway checks signatures and owns the sockets; ``voice.service.CallService`` decides what a
call is and runs it. The media socket is admitted only with a valid ``X-Twilio-Signature`` over
the *public* ``wss://`` URL and an unused one-time token bound to the call; anything else is
closed with 1008 and leaves only a security event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from quart import Blueprint, Response, current_app, request, websocket

from core.security import record_security_event
from gateway.services import Services
from gateway.signatures import public_request_url, twilio_signature_ok
from gateway.webhooks import MEDIA_STREAM, VOICE, VOICE_AFTER_STREAM, VOICE_STATUS, public_url_for

log = logging.getLogger(__name__)

blueprint = Blueprint("voice", __name__)

POLICY_VIOLATION = 1008
UNAVAILABLE_TWIML = (
    '<?xml version="1.0" encoding="UTF-8"?><Response><Say>Sorry, Pepper cannot take calls right now.'
    " Please try again later.</Say><Hangup/></Response>"
)


def _services() -> Services:
    return current_app.extensions["pepper"]


def _xml(text: str) -> Response:
    return Response(text, status=200, content_type="text/xml")


async def _signed_form(services: Services) -> dict[str, str] | Response:
    form = await request.form
    url = public_request_url(services.settings, request.path, request.query_string)
    if not twilio_signature_ok(services.settings, url, form, request.headers):
        log.warning("refused a voice webhook with a missing or invalid Twilio signature")
        await record_security_event(services.db, "twilio-signature-invalid", path=request.path)
        return Response("invalid signature\n", status=403, content_type="text/plain")
    return {k: form.get(k) for k in form}


@blueprint.post(VOICE.path)
async def voice_webhook() -> Response:
    services = _services()
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    if not form.get("CallSid") or not form.get("To"):
        return Response("CallSid and To are required\n", status=400, content_type="text/plain")
    stream_url = public_url_for(services.settings, MEDIA_STREAM)
    if services.calls is None or stream_url is None:
        log.error("a call came in but phone calls are not configured (PEPPER_PUBLIC_URL, a voice model)")
        return _xml(UNAVAILABLE_TWIML)
    _, twiml = await services.calls.answer(
        form, stream_url=stream_url, action_url=public_url_for(services.settings, VOICE_AFTER_STREAM)
    )
    return _xml(twiml)


@blueprint.post(VOICE_AFTER_STREAM.path)
async def after_stream() -> Response:
    services = _services()
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    if services.calls is None:
        return _xml(UNAVAILABLE_TWIML)
    return _xml(await services.calls.after_stream(form.get("CallSid", "")))


@blueprint.post(VOICE_STATUS.path)
async def call_status() -> Response:
    services = _services()
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    if services.calls is not None and form.get("CallSid"):
        await services.calls.call_status(form["CallSid"], (form.get("CallStatus") or "").lower())
    return Response("", status=204)


class _QuartLink:
    """The session's view of the socket: send text, close with a code."""

    def __init__(self, ws):  # type: ignore[no-untyped-def]
        self._ws = ws
        self.closed = False

    async def send(self, text: str) -> None:
        if not self.closed:
            await self._ws.send(text)

    async def close(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            await self._ws.close(code)


@blueprint.websocket(MEDIA_STREAM.path)
async def media_stream() -> None:
    from voice.service import StreamRefused

    services = _services()
    settings = services.settings
    public = public_url_for(settings, MEDIA_STREAM)
    # Twilio signs the upgrade over the public wss:// URL with no parameters.
    signature_ok = twilio_signature_ok(settings, public, {}, websocket.headers)
    ws = websocket._get_current_object()  # type: ignore[attr-defined]
    await ws.accept()
    if services.calls is None:
        await ws.close(POLICY_VIOLATION)
        return
    try:
        frames = await services.calls.read_first_frames(ws.receive)
        start, call = await services.calls.admit(frames, signature_ok=signature_ok)
    except StreamRefused:
        await ws.close(POLICY_VIOLATION)
        return
    link = _QuartLink(ws)
    session = services.calls.open_session(link, start, call)
    task = services.tasks.spawn(f"call-{call.call_sid[-8:]}", services.calls.run_session(session))
    try:
        while not session.ended:
            raw = await ws.receive()
            await session.feed(raw)
    except asyncio.CancelledError:
        # The caller's side closed the socket: Quart cancels this handler. The call task owns the rest.
        link.closed = True
        session.hang_up("hangup")
        raise
    with contextlib.suppress(Exception):
        await asyncio.shield(task)
