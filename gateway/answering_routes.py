"""The owner's view of an answering-service call: the transcript the notification links to.

Signed-in owners only (the web chat's session cookie or an API token), and only their own calls.
The caller's words are shown as text (escaped), labelled as the caller's.
"""

from __future__ import annotations

import html
import json

from quart import Blueprint, Response, current_app

from core.records import answering
from gateway.services import Services
from gateway.webchat import _authenticate

blueprint = Blueprint("answering", __name__)


@blueprint.get("/answering/calls/<call_sid>")
async def transcript(call_sid: str) -> Response:
    who = await _authenticate(state_changing=False)
    if isinstance(who, Response):
        return who
    services: Services = current_app.extensions["pepper"]
    row = await answering.call_of(services.db, call_sid, who)
    if row is None:
        return Response("no such call\n", status=404, content_type="text/plain")
    message = await answering.message_of(services.db, call_sid)
    lines = json.loads(row["transcript"]) if isinstance(row["transcript"], str) else row["transcript"]
    caller = html.escape(row["caller"] or "an unknown number")
    summary = html.escape(row["summary"] or "in progress")
    out = [f"<h1>Call from {caller}</h1>", f"<p>{row['started_at']:%Y-%m-%d %H:%M} UTC; {summary}</p>"]
    if message is not None:
        out.append(
            "<h2>Message (the caller's words)</h2><ul>"
            f"<li>Name: {html.escape(message['caller_name'])}</li>"
            f"<li>Call back: {html.escape(message['callback_number'])}</li>"
            f"<li>Reason: {html.escape(message['reason'])}</li><li>Urgency: {message['urgency']}</li></ul>"
        )
    out.append("<h2>Transcript</h2><ol>")
    for line in lines:
        who_said = "Caller" if line.get("role") == "caller" else "Pepper"
        out.append(f"<li><b>{who_said}:</b> {html.escape(line.get('text', ''))}</li>")
    out.append("</ol>")
    page = "<!doctype html><meta charset=utf-8><title>Answering call</title>" + "".join(out)
    response = Response(page, content_type="text/html; charset=utf-8")
    response.headers["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
    return response
