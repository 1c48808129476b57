"""A loopback OpenAI SIP direct side for tests: the Live sessions REST API (``accept``,
``reject``, ``hangup`` under ``/v1/live/sessions/{id}/``) and the signed ``live.transport.incoming``
webhook, beside a :class:`~voice.testing.gpt_live_peer.GptLivePeer` that serves the sideband socket
(``/v1/live/sessions/{id}/attach``) of each accepted session.

    async with GptLivePeer() as live, GptLiveSipPeer(live, secret) as sip:
        session_id, body, headers = sip.incoming(caller="+14155552671", line="+14155550100")
        # POST body/headers to Pepper's /openai/live/webhook; then:
        session = await sip.accepted(session_id)           # the LiveSession the sideband drives

Behaviour (shared/reference/gpt-live.md, the SDK's ``live/sessions.py`` and ``lib/_webhooks.py``):
the webhook is signed the standard-webhooks way (``webhook-id``, ``webhook-timestamp``,
``webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>`` with the ``whsec_`` secret's
decoded bytes). ``accept`` needs a Bearer key and a pending session; its ``session`` must hold only
fields of the SDK's accept params (``audio.format`` is refused: SIP negotiates it) and a model;
accepting starts the session (the sideband may attach). ``reject`` needs a ``status_code``; a
session is answered once (a second accept or reject is a 409). ``hangup`` ends an accepted one.
``refer`` (``POST /v1/live/sessions/{id}/refer`` with a nonblank ``target_uri``, the SDK's
``live.sessions.refer``) hands an accepted one on: recorded in ``refers`` (session id, target),
and the session ends as the SIP leg leaves OpenAI; a second refer, or one after the hang-up, is a 409.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from aiohttp import web

from voice.adapters.gpt_live_sip import ACCEPT_FIELDS
from voice.testing.gpt_live_peer import GptLivePeer, LiveSession


def sign_webhook(secret: str, webhook_id: str, timestamp: int, body: str) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class GptLiveSipPeer:
    def __init__(self, live: GptLivePeer, secret: str):
        self.live = live
        self.secret = secret
        self.pending: set[str] = set()
        self.answered: dict[str, str] = {}  # session id -> accepted | rejected:<status> | hung-up
        self.accepts: list[dict[str, Any]] = []
        self.refers: list[tuple[str, str]] = []  # (session id, target_uri) of each REFER taken
        self.requests: list[tuple[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> GptLiveSipPeer:
        app = web.Application()
        app.router.add_post("/v1/live/sessions/{session_id}/{action}", self._action)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def incoming(self, *, caller: str, line: str, session_id: str | None = None, webhook_id: str | None = None,
                 event_type: str = "live.transport.incoming", secret: str | None = None,
                 timestamp: int | None = None) -> tuple[str, bytes, dict[str, str]]:  # fmt: skip
        """A pending SIP session and its signed webhook: (session id, body, headers)."""
        ident = session_id or f"live_{secrets.token_hex(8)}"
        self.pending.add(ident)
        headers_sip = [
            {"name": "From", "value": f'"Caller" <sip:{caller}@pstn.twilio.com>;tag={secrets.token_hex(4)}'},
            {"name": "To", "value": f"<sip:{line}@proj_test.sip.api.openai.com;transport=tls>"},
            {"name": "X-Twilio-CallSid", "value": "CA" + secrets.token_hex(16)},
        ]
        data: dict[str, Any] = {"sip_headers": headers_sip}
        if event_type == "realtime.call.incoming":
            data["call_id"] = "rtc_" + ident  # the Realtime API's id for the same pending call
        else:
            data |= {"type": "sip", "session_id": ident}
        body = json.dumps({"object": "event", "id": f"evt_{secrets.token_hex(8)}", "type": event_type,
                           "created_at": int(time.time()), "data": data})  # fmt: skip
        wid = webhook_id or f"wh_{secrets.token_hex(8)}"
        ts = timestamp if timestamp is not None else int(time.time())
        headers = {"webhook-id": wid, "webhook-timestamp": str(ts),
                   "webhook-signature": sign_webhook(secret or self.secret, wid, ts, body),
                   "content-type": "application/json"}  # fmt: skip
        return ident, body.encode(), headers

    async def accepted(self, session_id: str, within: float = 10.0) -> LiveSession:
        return await self.live.wait_for(lambda: self.live.sip_sessions.get(session_id), within, "the accepted session")

    async def _action(self, request: web.Request) -> web.Response:
        session_id, action = request.match_info["session_id"], request.match_info["action"]
        self.requests.append((session_id, action))
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return _error(401, "invalid_api_key", "missing bearer key")
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return _error(400, "invalid_json", "not JSON")
        if action == "hangup":
            session = self.live.sip_sessions.get(session_id)
            if session is None:
                return _error(404, "not_found", "no such session")
            self.answered[session_id] = "hung-up"
            if session.ws is not None:
                await session.send({"type": "session.closed", "reason": "close_requested", "usage": {"seconds": 1}})
            return web.json_response({})
        if action == "refer":
            session = self.live.sip_sessions.get(session_id)
            if session is None:
                return _error(404, "not_found", "no such session")
            if self.answered.get(session_id) != "accepted":
                return _error(409, "not_active", "the session is not in progress")
            target = body.get("target_uri") if isinstance(body, dict) else None
            if not isinstance(target, str) or not target.strip():
                return _error(400, "missing_required_parameter", "target_uri must be a nonblank string")
            self.answered[session_id] = "referred"
            self.refers.append((session_id, target))
            if session.ws is not None:
                await session.send({"type": "session.closed", "reason": "close_requested", "usage": {"seconds": 1}})
            return web.json_response({})
        if session_id not in self.pending:
            return _error(404 if session_id not in self.answered else 409, "not_pending", "no such pending session")
        if action == "reject":
            status = body.get("status_code") if isinstance(body, dict) else None
            if type(status) is not int:
                return _error(400, "missing_required_parameter", "status_code is required")
            self.pending.discard(session_id)
            self.answered[session_id] = f"rejected:{status}"
            return web.json_response({})
        if action != "accept":
            return _error(404, "not_found", "unknown action")
        session_cfg = body.get("session") if isinstance(body, dict) else None
        if not isinstance(session_cfg, dict) or not session_cfg.get("model"):
            return _error(400, "missing_required_parameter", "session.model is required")
        unknown = sorted(set(session_cfg) - ACCEPT_FIELDS)
        if unknown or "format" in (session_cfg.get("audio") or {}):
            return _error(400, "unknown_parameter", f"not accepted for SIP: {', '.join(unknown) or 'audio.format'}")
        self.pending.discard(session_id)
        self.answered[session_id] = "accepted"
        self.accepts.append(session_cfg)
        session = LiveSession({}, f"/v1/live/sessions/{session_id}", self.live, sip=True)
        session.config, session.id, session.started_at = session_cfg, session_id, time.monotonic()
        self.live.sip_sessions[session_id] = session
        self.live.sessions.append(session)
        return web.json_response({})


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": "invalid_request_error", "code": code, "message": message}},
                             status=status)  # fmt: skip
