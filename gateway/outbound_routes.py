"""Twilio's webhooks for calls Pepper places (``voice.outbound``) and hands on (``voice.transfer``).

Every one is signature-checked like the other Twilio webhooks (a forgery: 403 and a security
event); a form without a Twilio call id or with an unknown status is refused with 400; a status
callback Twilio retries is acted on once.
"""

from __future__ import annotations

import logging

from quart import Blueprint, Response, current_app

from core.errors import InvalidInput
from gateway.services import Services
from gateway.voice_routes import UNAVAILABLE_TWIML, _signed_form, _xml
from gateway.webhooks import (
    MEDIA_STREAM,
    OUTBOUND_ANSWER,
    OUTBOUND_STATUS,
    TRANSFER_AFTER,
    TRANSFER_WHISPER,
    VOICE_AFTER_STREAM,
    public_url_for,
)
from voice.control import FINAL_STATUSES
from voice.outbound import check_call_form

log = logging.getLogger(__name__)

blueprint = Blueprint("outbound", __name__)


def _services() -> Services:
    return current_app.extensions["pepper"]


def _bad(why: str) -> Response:
    return Response(f"{why}\n", status=400, content_type="text/plain")


async def _signed_call_form(services: Services) -> dict[str, str] | Response:
    """The signed form of a webhook about one call: a forgery is refused (403), a form without a
    Twilio call id or with an unknown status 400."""
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    try:
        check_call_form(form)
    except InvalidInput as exc:
        return _bad(exc.message)
    return form


@blueprint.post(OUTBOUND_ANSWER.path)
async def outbound_answer() -> Response:
    """Twilio asks what to do with a call Pepper placed, now answered (``AnsweredBy``)."""
    services = _services()
    form = await _signed_call_form(services)
    if isinstance(form, Response):
        return form
    stream_url = public_url_for(services.settings, MEDIA_STREAM)
    calls = services.calls
    if calls is None or calls.outbound is None or stream_url is None:
        return _xml(UNAVAILABLE_TWIML)
    action_url = public_url_for(services.settings, VOICE_AFTER_STREAM)
    return _xml(await calls.outbound.answer(form, stream_url=stream_url, action_url=action_url))


@blueprint.post(OUTBOUND_STATUS.path)
async def outbound_status() -> Response:
    services = _services()
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    calls = services.calls
    if calls is None or calls.outbound is None:
        return Response("", status=204)
    try:
        verdict = await calls.outbound.status(form)
    except InvalidInput as exc:
        return _bad(exc.message)
    if verdict == "not-ours":
        return Response("not a call Pepper placed\n", status=404, content_type="text/plain")
    status = (form.get("CallStatus") or "").lower()
    if verdict == "acted" and status in FINAL_STATUSES:
        await calls.call_status(form["CallSid"], status)
    return Response("", status=204)


@blueprint.post(TRANSFER_WHISPER.path)
async def transfer_whisper() -> Response:
    """What the owner hears on picking up a handed-on call, before the caller is connected."""
    services = _services()
    form = await _signed_form(services)
    if isinstance(form, Response):
        return form
    calls = services.calls
    parent = form.get("ParentCallSid") or ""
    if calls is None or calls.transfers is None or not parent:
        return _bad("ParentCallSid is required")
    return _xml(await calls.transfers.whisper(parent))


@blueprint.post(TRANSFER_AFTER.path)
async def transfer_after() -> Response:
    """The ``<Dial>`` ended: the owner talked to the caller, or did not pick up (back to Pepper)."""
    services = _services()
    form = await _signed_call_form(services)
    if isinstance(form, Response):
        return form
    calls = services.calls
    stream_url = public_url_for(services.settings, MEDIA_STREAM)
    if calls is None or calls.transfers is None or stream_url is None:
        return _xml(UNAVAILABLE_TWIML)
    twiml = await calls.transfers.after_dial(
        form, stream_url=stream_url, action_url=public_url_for(services.settings, VOICE_AFTER_STREAM)
    )
    return _xml(twiml)
