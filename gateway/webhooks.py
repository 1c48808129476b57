"""The public paths that providers call, in one place for the routes and for ``pepper doctor``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.settings import Settings


@dataclass(frozen=True)
class Webhook:
    name: str
    path: str
    where: str  # where to paste it
    websocket: bool = False


VOICE = Webhook("voice", "/twilio/voice", "Twilio phone number > Voice > A call comes in (HTTP POST)")
VOICE_STATUS = Webhook("voice-status", "/twilio/voice/status", "Twilio phone number > Voice > Call status changes")
MEDIA_STREAM = Webhook(
    "media-stream", "/twilio/media", "used in TwiML <Stream>; proxy it to PEPPER_MEDIA_PORT", websocket=True
)
# Set by Pepper in the TwiML <Connect action>: what Twilio does after Pepper closes the media socket.
VOICE_AFTER_STREAM = Webhook("voice-after-stream", "/twilio/voice/after-stream", "set in TwiML by Pepper")
# Set by Pepper on the calls it places (voice.outbound): the TwiML once answered, and call status.
OUTBOUND_ANSWER = Webhook("outbound-answer", "/twilio/voice/outbound", "set per call by Pepper; nothing to paste")
OUTBOUND_STATUS = Webhook("outbound-status", "/twilio/voice/outbound/status", "set per call by Pepper")
# Set by Pepper in the <Dial> that hands a caller to the owner (voice.transfer).
TRANSFER_WHISPER = Webhook("transfer-whisper", "/twilio/voice/transfer/whisper", "set in TwiML by Pepper")
TRANSFER_AFTER = Webhook("transfer-after", "/twilio/voice/transfer/after", "set in TwiML by Pepper")
SMS = Webhook("sms", "/twilio/sms", "Twilio phone number > Messaging > A message comes in (HTTP POST)")
WHATSAPP = Webhook("whatsapp", "/twilio/whatsapp", "Twilio WhatsApp sender > When a message comes in")
MESSAGE_STATUS = Webhook("message-status", "/twilio/status", "set per message by Pepper; nothing to paste")
# SIP direct (lines on the sip transport): OpenAI's signed webhook for a call its SIP endpoint took.
SIP_INCOMING = Webhook(
    "openai-sip", "/openai/live/webhook", "OpenAI project settings > Webhooks > live.transport.incoming"
)
EMAIL = Webhook("email", "/email/inbound", "mail provider inbound route (Mailgun forward)")
# Where Google sends the browser back after consent (`pepper connect google`, the web page's link).
GOOGLE_CALLBACK = Webhook(
    "google-oauth", "/connect/google/callback", "Google Cloud console > OAuth client (Web) > Authorized redirect URIs"
)

WEBHOOKS: tuple[Webhook, ...] = (
    VOICE, VOICE_STATUS, MEDIA_STREAM, SIP_INCOMING, SMS, WHATSAPP, MESSAGE_STATUS, EMAIL, GOOGLE_CALLBACK,
)  # fmt: skip


def public_url_for(settings: Settings, webhook: Webhook) -> str | None:
    """The exact URL to give the provider, or None while ``PEPPER_PUBLIC_URL`` is unset."""
    base = settings.public_ws_url if webhook.websocket else settings.public_url
    return None if base is None else base + webhook.path


def served_paths(app: Any) -> set[str]:
    """Paths a built app (``gateway.app.create_app``) serves: its routes, and the media socket on
    its own listener (``gateway.media_server``)."""
    return {rule.rule for rule in app.url_map.iter_rules()} | {MEDIA_STREAM.path}
