"""The owner's view of an answering-service call: the transcript the notification links to.

Signed-in owners only (the web chat's session cookie or an API token), and only their own calls.
The caller's words are shown as text (escaped by the template), labelled as the caller's. The
page is the dashboard's call page (``templates/call.html``), from the answering records, with the
caller signals beside the message (:func:`screening`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from quart import Blueprint, Response, current_app, request

from core import access
from core.records import answering
from core.records import calls as call_records
from core.records.answering_bookings import bookings_of
from gateway.pages import render
from gateway.services import Services
from gateway.webchat import COOKIE, _authenticate, plain_id

blueprint = Blueprint("answering", __name__)

# Twilio's StirVerstat, in words (the carrier's STIR/SHAKEN verdict on the caller ID).
_VERSTAT = {
    "TN-Validation-Passed-A": "full attestation: the carrier vouches for the number",
    "TN-Validation-Passed-B": "partial attestation: the carrier knows the caller, not that they own the number",
    "TN-Validation-Passed-C": "gateway attestation: the carrier only passed the call on",
    "TN-Validation-Failed-A": "failed", "TN-Validation-Failed-B": "failed", "TN-Validation-Failed-C": "failed",
    "No-TN-Validation": "not validated",
    "TN-Validation-Failed": "failed",
}  # fmt: skip


def screening(call: Mapping[str, Any]) -> dict[str, str] | None:
    """What Twilio said of the caller, as the owner sees it beside the message: the line type and
    registered name from Lookup (``PEPPER_TWILIO_LOOKUP``; absent until looked up), and the
    STIR/SHAKEN verdict (``StirVerstat``) when the call carried one. None when nothing was recorded."""
    shown: dict[str, str] = {}
    if call.get("line_type") is not None:
        shown["line_type"] = call["line_type"] or "unknown"
    if call.get("caller_name_lookup"):
        shown["caller_name"] = call["caller_name_lookup"]
    verstat = call.get("stir_verstat")
    if verstat:
        shown["verstat"] = f"{verstat} ({_VERSTAT.get(verstat, 'unknown verdict')})"
    return shown or None


@blueprint.get("/answering/calls/<call_sid>")
async def transcript(call_sid: str) -> Response:
    who = await _authenticate(state_changing=False)
    if isinstance(who, Response):
        return who
    services: Services = current_app.extensions["pepper"]
    row = await answering.call_of(services.db, call_sid, who) if plain_id(call_sid) else None
    if row is None:
        return Response("no such call\n", status=404, content_type="text/plain")
    lines = json.loads(row["transcript"]) if isinstance(row["transcript"], str) else row["transcript"]
    session = await access.session_for(services.db, request.cookies.get(COOKIE))
    message = await answering.message_of(services.db, call_sid)
    call = {
        "route": "answering", "caller": row["caller"], "started_at": row["started_at"],
        "status": "ended" if row["ended_at"] else "in progress", "end_reason": row["end_reason"],
        "answering_summary": row["summary"] or "in progress",
    }  # fmt: skip
    signals = {**dict(row), "stir_verstat": await call_records.verstat(services.db, call_sid)}
    return await render(
        "call.html", title="Answering call", here="/calls", csrf=session.csrf_token if session else None, call=call,
        lines=[line for line in lines if isinstance(line, dict)], message=message, screening=screening(signals),
        bookings=await bookings_of(services.db, call_sid), tools=[], stats={}, latency=None,
    )  # fmt: skip
