"""The owner's view of an answering-service call: the transcript the notification links to.

Signed-in owners only (the web chat's session cookie or an API token), and only their own calls.
The caller's words are shown as text (escaped by the template), labelled as the caller's. The
page is the dashboard's call page (``templates/call.html``), from the answering records.
"""

from __future__ import annotations

import json

from quart import Blueprint, Response, current_app, request

from core import access
from core.records import answering
from core.records.answering_bookings import bookings_of
from gateway.pages import render
from gateway.services import Services
from gateway.webchat import COOKIE, _authenticate, plain_id

blueprint = Blueprint("answering", __name__)


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
    return await render(
        "call.html", title="Answering call", here="/calls", csrf=session.csrf_token if session else None, call=call,
        lines=[line for line in lines if isinstance(line, dict)], message=message,
        bookings=await bookings_of(services.db, call_sid), tools=[], stats={}, latency=None,
    )  # fmt: skip
