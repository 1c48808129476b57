"""The one module that talks to Twilio's REST API (through the official SDK's async client).

``PEPPER_TWILIO_API_URL`` moves every request to another base URL (a loopback peer in tests);
the SDK has no base-URL option, so a small ``http_client`` subclass rewrites the scheme and host.
"""

from __future__ import annotations

import base64
import logging
import urllib.parse
from datetime import datetime, timedelta

import aiohttp
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.rest import Client

from core.errors import ConfigError, PepperError
from core.settings import Settings

log = logging.getLogger(__name__)
# The SDK logs request bodies (numbers, message text) at INFO, the async client as
# "twilio.async_http_client": keep every twilio logger out of our logs (gateway.logs does too).
logging.getLogger("twilio").setLevel(logging.WARNING)

# Twilio error codes meaning the recipient has opted out (or is otherwise unreachable for good).
OPTED_OUT_CODES = {21610}
# The newest messages between two numbers read to find one a crash left unconfirmed: one turn's
# reply is the newest there, unless the person got many since.
RECONCILE_LIMIT = 20
# How far Twilio's clock may be behind ours when matching a message to the row recorded before it.
CLOCK_SLACK = timedelta(minutes=1)


class TwilioSendError(PepperError):
    code = "twilio-send-failed"

    def __init__(self, message: str, *, twilio_code: int | None = None, retryable: bool = False):
        super().__init__(message, retryable=retryable)
        self.twilio_code = twilio_code


class _HttpClient(AsyncTwilioHttpClient):
    """The SDK's aiohttp client, sending to ``base_url`` and with the credentials as a header.

    aiohttp 3.13 deprecates the ``auth=`` argument the SDK still passes; the header is equivalent.
    """

    def __init__(self, base_url: str, **kwargs):
        super().__init__(**kwargs)
        self._base = urllib.parse.urlsplit(base_url.rstrip("/"))

    async def request(self, method, url, params=None, data=None, headers=None, auth=None, **kwargs):
        parts = urllib.parse.urlsplit(url)
        moved = urllib.parse.urlunsplit(parts._replace(scheme=self._base.scheme, netloc=self._base.netloc))
        headers = dict(headers or {})
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        return await super().request(method, moved, params=params, data=data, headers=headers, **kwargs)


class TwilioMessenger:
    """Sends SMS and WhatsApp messages; one instance per process, closed on shutdown."""

    def __init__(self, settings: Settings):
        if not settings.twilio_account_sid or settings.twilio_auth_token is None:
            raise ConfigError("TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN are needed to send messages")
        http_client = _HttpClient(settings.twilio_api_url, timeout=15)
        self._http = http_client
        self._client = Client(
            settings.twilio_account_sid, settings.twilio_auth_token.get_secret_value(), http_client=http_client
        )

    async def send(self, *, to: str, from_: str, body: str, status_callback: str | None) -> str:
        """Queue one message; return its ``MessageSid``. Raises ``TwilioSendError``."""
        try:
            message = await self._client.messages.create_async(
                to=to, from_=from_, body=body, status_callback=status_callback
            )
        except TwilioRestException as exc:
            transient = exc.status == 429 or exc.status >= 500
            raise TwilioSendError(
                f"Twilio refused the message (HTTP {exc.status}, code {exc.code})",
                twilio_code=exc.code,
                retryable=transient,
            ) from exc
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise TwilioSendError(f"cannot reach Twilio: {exc}", retryable=True) from exc
        return message.sid

    async def find_sent(self, *, to: str, from_: str, body: str, since: datetime) -> list[tuple[str, str]]:
        """``(MessageSid, status)`` of the messages Twilio holds from ``from_`` to ``to`` with this
        body, created since ``since`` (less ``CLOCK_SLACK``: Twilio dates them by its clock, to the
        second), newest first: what tells whether a send cut short by a crash reached Twilio (the
        caller leaves out those it recorded already). Raises ``TwilioSendError`` when the list
        cannot be read."""
        floor = since.replace(microsecond=0) - CLOCK_SLACK
        try:
            found = await self._client.messages.list_async(to=to, from_=from_, limit=RECONCILE_LIMIT)
        except TwilioRestException as exc:
            raise TwilioSendError(
                f"Twilio refused the message list (HTTP {exc.status}, code {exc.code})", twilio_code=exc.code,
                retryable=exc.status == 429 or exc.status >= 500,
            ) from exc  # fmt: skip
        except TwilioException as exc:  # a page it could not fetch: the SDK raises its base error
            raise TwilioSendError("Twilio could not list the messages", retryable=True) from exc
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise TwilioSendError(f"cannot reach Twilio: {exc}", retryable=True) from exc
        return [
            (str(m.sid), str(m.status))
            for m in found
            if m.body == body and (m.date_created is None or m.date_created >= floor)
        ]

    async def close(self) -> None:
        await self._http.close()


async def check_account(settings: Settings) -> str:
    """Fetch the configured account (one read-only call, ``pepper doctor --online``): its status,
    e.g. ``active``. Raises ``TwilioSendError`` with why it failed (wrong SID or token: 401)."""
    if not settings.twilio_account_sid or settings.twilio_auth_token is None:
        raise ConfigError("TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN are not set")
    http_client = _HttpClient(settings.twilio_api_url, timeout=15)
    client = Client(settings.twilio_account_sid, settings.twilio_auth_token.get_secret_value(), http_client=http_client)
    try:
        account = await client.api.v2010.accounts(settings.twilio_account_sid).fetch_async()
    except TwilioRestException as exc:
        why = "wrong account SID or auth token" if exc.status == 401 else f"code {exc.code}"
        raise TwilioSendError(
            f"Twilio refused the credentials (HTTP {exc.status}, {why})", twilio_code=exc.code
        ) from exc
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        raise TwilioSendError(f"cannot reach Twilio at {settings.twilio_api_url} ({type(exc).__name__})") from exc
    finally:
        await http_client.close()
    return str(account.status)
