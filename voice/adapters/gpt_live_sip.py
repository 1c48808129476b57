"""GPT-Live over SIP direct, through the official ``openai`` SDK: a Twilio Elastic SIP trunk sends
the call to OpenAI (``sip:$PROJECT_ID@sip.api.openai.com;transport=tls``), OpenAI posts a signed
``live.transport.incoming`` (or older ``realtime.call.incoming``) webhook, Pepper accepts or rejects
the pending session (``client.live.sessions.accept`` / ``reject``; ``refer`` hands an accepted one
on, ``hangup`` ends it) and drives it over the **sideband** WebSocket
(``client.live.sideband.connect(session_id=...)``). Media never passes through Pepper.

The webhook's signature is the standard-webhooks scheme the SDK verifies
(``client.webhooks.verify_signature``: HMAC-SHA256 over ``id.timestamp.body`` with the
``whsec_`` secret, five minutes' tolerance).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import orjson
from openai import AsyncOpenAI, InvalidWebhookSignatureError, OpenAIError
from openai.types.live.session_accept_params import Session as AcceptSession

from core.models.voice_models import default_voice_model
from voice.adapters.gpt_live import GptLive, GptLiveConnection
from voice.realtime import RealtimeError, SessionConfig

log = logging.getLogger(__name__)

INCOMING = frozenset({"live.transport.incoming", "realtime.call.incoming"})
# Session and webhook ids as Pepper stores them (signed is not well-formed: no NUL, no odd text).
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
# What sessions.accept's session may hold, from the SDK's types (the loopback peer checks it).
ACCEPT_FIELDS = frozenset(AcceptSession.__annotations__)


class SipWebhookRefused(Exception):
    """The webhook is not OpenAI's (``status`` 401) or not one Pepper can read (400)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class IncomingSip:
    """A verified incoming SIP session: its webhook id, the session to accept or reject, and the
    SIP headers (untrusted caller metadata: name -> the first value)."""

    webhook_id: str
    event_type: str
    session_id: str
    headers: dict[str, str]


class SipControlError(RealtimeError):
    code = "sip-control-failed"


def accept_payload(config: SessionConfig, model: str) -> dict[str, Any]:
    """``sessions.accept``'s session: the model, the front instructions, the voice, client
    delegation (SIP negotiates the audio format: none is sent)."""
    return {
        "model": model,
        "instructions": config.instructions,
        "audio": {"output": {"voice": config.voice}},
        "delegation": {"type": "client"},
    }


class SidebandConnection(GptLiveConnection):
    """A sideband socket on a session ``accept`` started: never ``session.start`` again."""

    def __init__(self, conn: Any, model: str, session_id: str):
        super().__init__(conn, model)
        self.session_id = session_id


class GptLiveSip(GptLive):
    """One server's SIP direct control: ``base_url`` for the REST calls, ``websocket_base_url`` for
    the sideband, ``webhook_secret`` for the signatures. ``for_session`` gives the realtime model a
    call runs on (its ``connect`` attaches the sideband)."""

    name = "gpt-live-sip"

    def __init__(self, *, api_key: str, webhook_secret: str, model: str = default_voice_model("gpt-live"),
                 base_url: str | None = None, websocket_base_url: str | None = None):  # fmt: skip
        # Not GptLive.__init__: this client carries the webhook secret too (one client, closed in aclose).
        self.model = model
        self._client = AsyncOpenAI(api_key=api_key, base_url=base_url, websocket_base_url=websocket_base_url,
                                   webhook_secret=webhook_secret, max_retries=0)  # fmt: skip
        self._session_id: str | None = None

    def verify(self, body: bytes, headers: Any) -> IncomingSip:
        """The verified incoming call, or :class:`SipWebhookRefused`."""
        try:
            self._client.webhooks.verify_signature(body, headers)
        except InvalidWebhookSignatureError as exc:
            raise SipWebhookRefused(401, "invalid-signature") from exc
        except (ValueError, UnicodeDecodeError) as exc:  # a header missing, a body that is not text
            raise SipWebhookRefused(401, "unsigned") from exc
        try:
            event = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise SipWebhookRefused(400, "not-json") from exc
        data = event.get("data") if isinstance(event, dict) else None
        if not isinstance(data, dict) or event.get("type") not in INCOMING:
            raise SipWebhookRefused(400, "not-an-incoming-call")
        # realtime.call.incoming names the call for the Realtime API (call_id); Pepper acts on the
        # Live event of the same pending session (voice.sip), but reads both.
        ident = data.get("session_id") or data.get("call_id")
        raw = data.get("sip_headers")
        if not isinstance(ident, str) or not _PLAIN_ID.fullmatch(ident) or not isinstance(raw, list):
            raise SipWebhookRefused(400, "malformed-incoming-call")
        sip: dict[str, str] = {}
        for header in raw:
            name, value = (header.get("name"), header.get("value")) if isinstance(header, dict) else (None, None)
            if isinstance(name, str) and isinstance(value, str):
                sip.setdefault(name.lower(), value)
        webhook_id = str(headers.get("webhook-id") or "")
        if not _PLAIN_ID.fullmatch(webhook_id):
            raise SipWebhookRefused(400, "malformed-webhook-id")
        return IncomingSip(webhook_id, str(event["type"]), ident, sip)

    async def accept(self, session_id: str, config: SessionConfig) -> None:
        try:
            await self._client.live.sessions.accept(session_id, session=accept_payload(config, self.model))  # type: ignore[arg-type]
        except OpenAIError as exc:
            raise SipControlError(f"could not accept the SIP session: {type(exc).__name__}") from exc

    async def reject(self, session_id: str, status_code: int) -> None:
        try:
            await self._client.live.sessions.reject(session_id, status_code=status_code)
        except OpenAIError as exc:
            raise SipControlError(f"could not reject the SIP session: {type(exc).__name__}") from exc

    async def refer(self, session_id: str, target_uri: str) -> None:
        """Hand the SIP call on (``client.live.sessions.refer``: a SIP REFER with ``Refer-To:
        target_uri``, such as ``tel:+14155550123``); the trunk connects the caller there."""
        try:
            await self._client.live.sessions.refer(session_id, target_uri=target_uri)
        except OpenAIError as exc:
            raise SipControlError(f"could not refer the SIP session: {type(exc).__name__}") from exc

    async def hangup(self, session_id: str) -> None:
        try:
            await self._client.live.sessions.hangup(session_id)
        except OpenAIError:
            log.warning("could not hang up a SIP session", exc_info=True)

    def for_session(self, session_id: str) -> GptLiveSip:
        """This control, as the realtime model of one SIP session (shares the client)."""
        model = object.__new__(GptLiveSip)
        model.__dict__.update(self.__dict__)
        model._session_id = session_id
        return model

    def _manager(self, options: Any) -> Any:
        assert self._session_id is not None
        return self._client.live.sideband.connect(session_id=self._session_id, websocket_connection_options=options,
                                                  max_retries=0)  # fmt: skip

    def _session(self, conn: Any) -> GptLiveConnection:
        assert self._session_id is not None
        return SidebandConnection(conn, self.model, self._session_id)
