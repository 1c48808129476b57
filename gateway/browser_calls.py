"""Voice calls from the chat page over WebRTC: signalling, and the call run by the one call engine.

``POST /api/calls`` takes the browser's SDP offer (ICE not trickled) and answers with the server's;
the call then runs as an owner's phone call does (``voice.engine.CallEngine``: notice, gate,
barge-in, staged writes, records) with the owner's profile already verified by the signed-in web
session (``voice.owner_profile.BrowserOwnerProfile``): the cookie session and its CSRF token, as
every state-changing web request; an API token cannot open one. One call per web session at a
time. ``POST /api/calls/<call_id>/hangup`` ends it, and so does signing out. ``GET /call.js`` is the page's script
(``gateway/static/call.js``), which enhances the chat page's ``#call-button``.

Browser calls live in the process that answered the offer (the web server), in the call service's
sessions beside the phone calls it holds, so a shutdown hangs them up and records them as it does
phone calls.
"""

from __future__ import annotations

import json
import logging
import secrets
from importlib import resources
from uuid import UUID

from quart import Blueprint, Response, current_app, request
from quart.blueprints import BlueprintSetupState

from core import access
from core.adapters.twilio.media_streams import StreamStart
from core.records import calls as call_records
from core.security import record_security_event
from gateway.services import Services
from gateway.webchat import COOKIE, SIGN_OUT_HOOKS, _json_body, _json_error
from voice.owner_profile import BrowserOwnerProfile
from voice.profile import AdmittedCall
from voice.service import Admission, CallService

log = logging.getLogger(__name__)

blueprint = Blueprint("browser_calls", __name__)

CALL_PREFIX = "WB"  # browser calls' ids in ``calls.call_sid`` (Twilio's start with CA)
ACTIVE_CALLS = "pepper-browser-calls"  # app.extensions key: web session (token hash) -> its open call


def _services() -> Services:
    return current_app.extensions["pepper"]


@blueprint.record_once
def _hang_up_on_sign_out(state: BlueprintSetupState) -> None:
    """Signing out ends the session's browser call: a call must not outlive the sign-in it was
    opened with (the engine records its end as for a hang-up)."""
    app = state.app

    def hang_up(session_key: bytes) -> None:
        call_sid = app.extensions.get(ACTIVE_CALLS, {}).get(session_key)
        calls = app.extensions["pepper"].calls
        engine = calls.sessions.get(call_sid) if call_sid is not None and calls is not None else None
        if engine is not None:
            log.info("browser call hung up at sign-out: call=%s", call_sid[-8:])
            engine.hang_up("signed-out")

    app.extensions.setdefault(SIGN_OUT_HOOKS, []).append(hang_up)


def _still_open(calls: CallService, call_sid: str) -> bool:
    """Whether the session's call still holds it: one being answered (no engine yet) or running.
    One that is ending (its end is recorded before it lets go of the session) no longer keeps the
    session from calling again."""
    engine = calls.sessions.get(call_sid)
    return engine is None or engine.end_reason is None


def _active() -> dict[bytes, str]:
    """Web session (its token's hash) -> the browser call it has open, in this process."""
    return current_app.extensions.setdefault(ACTIVE_CALLS, {})


async def _session() -> tuple[UUID, bytes] | Response:
    """The signed-in web session (account, token hash) of a state-changing request, or the error."""
    services = _services()
    token = request.cookies.get(COOKIE)
    session = await access.session_for(services.db, token)
    if session is None or token is None:
        return _json_error(401, "signed-out", "sign in first: browser calls need the signed-in web session")
    if not secrets.compare_digest(request.headers.get("X-CSRF-Token", ""), session.csrf_token):
        log.warning("refused a browser call request with a missing or wrong CSRF token")
        await record_security_event(services.db, "browser-call-csrf", path=request.path)
        return _json_error(403, "csrf", "missing or wrong CSRF token")
    return session.account_id, access.token_hash(token)


@blueprint.get("/call.js")
async def script() -> Response:
    text = (resources.files("gateway") / "static" / "call.js").read_text(encoding="utf-8")
    response = Response(text, content_type="text/javascript; charset=utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@blueprint.post("/api/calls")
async def offer() -> Response:
    from voice.adapters.webrtc import BadOffer, BrowserCall

    who = await _session()
    if isinstance(who, Response):
        return who
    account_id, session_key = who
    services = _services()
    calls = services.calls
    if calls is None:
        return _json_error(503, "no-calls", "calls are not set up on this server")
    body = await _json_body()
    if not isinstance(body, dict) or body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
        return _json_error(400, "bad-offer", 'send JSON {"type": "offer", "sdp": "..."}')
    active = _active()
    if session_key in active and _still_open(calls, active[session_key]):
        return _json_error(409, "call-in-progress", "this session already has a call open; hang it up first")
    call_sid = CALL_PREFIX + secrets.token_hex(16)
    active[session_key] = call_sid  # before any await: a second offer meanwhile is refused
    browser = BrowserCall("MZ" + call_sid[len(CALL_PREFIX) :], timings=current_app.extensions.get("pepper-timings"))
    try:
        answer = await browser.answer(body["sdp"])
    except BadOffer as exc:
        active.pop(session_key, None)
        await browser.close()
        return _json_error(400, "bad-offer", str(exc))
    except BaseException:
        active.pop(session_key, None)
        await browser.close()
        raise
    try:
        await call_records.record_call(services.db, call_sid, account_id=account_id, line_number=None, caller=None,
                                       handle_id=None, route="owner", attested=False)  # fmt: skip
        call = AdmittedCall(call_sid, account_id, None, None, None)
        profile = BrowserOwnerProfile(calls.deps, call, on_line=browser.line)
        start = StreamStart(browser.link.stream_sid, call_sid, "", {}, "audio/x-mulaw")
        engine = calls.open_session(browser.link, Admission(start, call, profile))
    except BaseException:
        active.pop(session_key, None)
        await browser.close()
        raise
    browser.attach(engine)

    async def run() -> None:
        try:
            await calls.run_session(engine)
        finally:
            browser.ended(engine.end_reason)
            if active.get(session_key) == call_sid:  # before any await: the session may call again
                del active[session_key]
            await browser.close()

    services.tasks.spawn(f"call-{call_sid[-8:]}", run(), limited=False)
    log.info("browser call opened: call=%s", call_sid[-8:])
    payload = {"call_id": call_sid, "type": "answer", "sdp": answer}
    return Response(json.dumps(payload), status=201, content_type="application/json")


@blueprint.post("/api/calls/<call_id>/hangup")
async def hang_up(call_id: str) -> Response:
    who = await _session()
    if isinstance(who, Response):
        return who
    account_id, session_key = who
    services = _services()
    active = _active()
    if active.get(session_key) == call_id and services.calls is not None:
        engine = services.calls.sessions.get(call_id)
        if engine is not None and engine.end_reason is None:
            engine.hang_up("hangup")
            return Response(json.dumps({"ok": True}), content_type="application/json")
        # This session's call, ending already (its end may be recorded before it lets go of the
        # session): the same answer as for one that is over.
        return Response(json.dumps({"ok": True, "duplicate": True}), content_type="application/json")
    if call_id in active.values():
        return _json_error(404, "no-such-call", "no browser call with that id in this session")
    # Over already (hung up twice, or ended by Pepper): fine, if it was this account's call.
    if call_id.startswith(CALL_PREFIX) and await call_records.call_account(services.db, call_id) == account_id:
        return Response(json.dumps({"ok": True, "duplicate": True}), content_type="application/json")
    return _json_error(404, "no-such-call", "no browser call with that id in this session")
