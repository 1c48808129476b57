"""Twilio's REST API for calls: place one (``Calls`` with answering-machine detection), change a
live one (new TwiML: ``<Dial>`` to hand the caller on, ``<Play digits>`` for a menu), and Lookup v2
(line type and caller name). Through the official SDK's async client, moved to
``PEPPER_TWILIO_API_URL`` like the messenger (``rest._HttpClient``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiohttp
from twilio.base.exceptions import TwilioRestException
from twilio.rest import Client

from core.adapters.twilio.rest import TwilioSendError, _HttpClient
from core.errors import ConfigError
from core.settings import Settings

log = logging.getLogger(__name__)

# Twilio waits for the greeting to end (the beep) before it asks for TwiML, so a voicemail left
# then is recorded whole.
MACHINE_DETECTION = "DetectMessageEnd"
STATUS_EVENTS = ["initiated", "ringing", "answered", "completed"]


@dataclass(frozen=True)
class LineInfo:
    """What Lookup v2 says of a number: ``line_type`` (mobile, landline, nonFixedVoip...) and the
    registered caller name, either None when Lookup did not say."""

    line_type: str | None
    caller_name: str | None


def _error(exc: Exception, what: str) -> TwilioSendError:
    if isinstance(exc, TwilioRestException):
        transient = exc.status == 429 or exc.status >= 500
        return TwilioSendError(f"Twilio refused {what} (HTTP {exc.status}, code {exc.code})", twilio_code=exc.code,
                               retryable=transient)  # fmt: skip
    return TwilioSendError(f"cannot reach Twilio: {type(exc).__name__}", retryable=True)


class TwilioVoice:
    """One per process, closed on shutdown."""

    def __init__(self, settings: Settings):
        if not settings.twilio_account_sid or settings.twilio_auth_token is None:
            raise ConfigError("TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN are needed to place calls")
        self._http = _HttpClient(settings.twilio_api_url, timeout=15)
        self._client = Client(
            settings.twilio_account_sid, settings.twilio_auth_token.get_secret_value(), http_client=self._http
        )

    async def place_call(
        self, *, to: str, from_: str, url: str, status_callback: str, send_digits: str | None = None,
        ring_seconds: int = 25,
    ) -> str:  # fmt: skip
        """Ring ``to``; Twilio asks ``url`` for TwiML once a person or a machine's beep answers
        (``AnsweredBy``). The call's ``CallSid``; raises ``TwilioSendError``."""
        try:
            call = await self._client.calls.create_async(
                to=to, from_=from_, url=url, method="POST", status_callback=status_callback,
                status_callback_method="POST", status_callback_event=STATUS_EVENTS,
                machine_detection=MACHINE_DETECTION, timeout=ring_seconds,
                **({"send_digits": send_digits} if send_digits else {}),
            )  # fmt: skip
        except (TwilioRestException, OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise _error(exc, "the call") from exc
        return str(call.sid)

    async def redirect(self, call_sid: str, twiml: str) -> None:
        """Give a live call new TwiML (its media stream ends; the TwiML runs)."""
        try:
            await self._client.calls(call_sid).update_async(twiml=twiml)
        except (TwilioRestException, OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise _error(exc, "the call update") from exc

    async def lookup(self, number: str) -> LineInfo:
        """Lookup v2 with ``line_type_intelligence`` and ``caller_name``."""
        try:
            found = await self._client.lookups.v2.phone_numbers(number).fetch_async(
                fields="line_type_intelligence,caller_name"
            )
        except (TwilioRestException, OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise _error(exc, "the lookup") from exc
        line = found.line_type_intelligence or {}
        name = found.caller_name or {}
        return LineInfo(line.get("type") or None, name.get("caller_name") or None)

    async def close(self) -> None:
        await self._http.close()
