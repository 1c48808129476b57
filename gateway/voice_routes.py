"""Twilio Voice: the call webhook, the after-stream action and call status.

The gateway checks signatures; ``voice.service.CallService`` decides what a call is and runs it.
The media WebSocket itself has its own listener: ``gateway.media_server``.
"""

from __future__ import annotations

import logging

from quart import Blueprint, Response, current_app, request

from core.adapters.twilio.signatures import public_request_url, twilio_signature_ok
from core.security import record_security_event
from gateway.metrics_route import mark_duplicate
from gateway.services import Services
from gateway.webchat import _storable, plain_id
from gateway.webhooks import MEDIA_STREAM, SIP_INCOMING, VOICE, VOICE_AFTER_STREAM, VOICE_STATUS, public_url_for

log = logging.getLogger(__name__)

blueprint = Blueprint("voice", __name__)

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
    fields = {k: form.get(k) or "" for k in form}
    # Signed is not well-formed: Twilio's fields are plain text and its call SIDs plain ids, and
    # Postgres stores neither a NUL nor a lone surrogate.
    if not all(_storable(k) and _storable(v) for k, v in fields.items()):
        return Response("the form holds a character that cannot be stored\n", status=400, content_type="text/plain")
    if "CallSid" in fields and not plain_id(fields["CallSid"]):
        return Response("CallSid is not a call SID\n", status=400, content_type="text/plain")
    return fields


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
        form, stream_url=stream_url, action_url=public_url_for(services.settings, VOICE_AFTER_STREAM),
        on_duplicate=mark_duplicate,
    )  # fmt: skip
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


@blueprint.post(SIP_INCOMING.path)
async def sip_incoming() -> Response:
    """SIP direct: OpenAI's signed webhook for a call on its SIP endpoint (``voice.sip``)."""
    services = _services()
    sip = getattr(services.calls, "sip", None)
    if sip is None:
        return Response("SIP direct is not configured (OPENAI_API_KEY and OPENAI_WEBHOOK_SECRET)\n", status=404,
                        content_type="text/plain")  # fmt: skip
    body = await request.get_data(cache=False)
    headers = {k.lower(): v for k, v in request.headers.items()}
    status, reason = await sip.incoming(body, headers)
    return Response(reason + "\n", status=status, content_type="text/plain")
