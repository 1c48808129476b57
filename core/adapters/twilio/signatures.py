"""Checks that a webhook really comes from Twilio, with the SDK's own validator.

The signature covers the *public* URL Twilio called (``PEPPER_PUBLIC_URL`` + path + query), never
the address this process saw behind a proxy or in a test. The HMAC-SHA256 SharedKey variant is
used when Twilio says so in ``X-Twilio-Webhooks-Signature-Settings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from twilio.request_validator import RequestValidator, get_signature_algorithm

from core.settings import Settings


def public_request_url(settings: Settings, path: str, query_string: bytes | str = b"") -> str | None:
    if settings.public_url is None:
        return None
    query = query_string.decode() if isinstance(query_string, bytes) else query_string
    return settings.public_url + path + (f"?{query}" if query else "")


def twilio_signature_ok(
    settings: Settings, url: str | None, params: Mapping[str, Any] | Any, headers: Mapping[str, str]
) -> bool:
    """True only for a valid signature; any missing piece or error fails closed."""
    signature = headers.get("X-Twilio-Signature")
    if not signature or url is None or settings.twilio_auth_token is None:
        return False
    try:
        algorithm = get_signature_algorithm(headers.get("X-Twilio-Webhooks-Signature-Settings"))
        if algorithm == "HMAC_SHA1":
            secret = settings.twilio_auth_token.get_secret_value()
        elif settings.twilio_webhook_shared_key is not None:
            secret = settings.twilio_webhook_shared_key.get_secret_value()
        else:
            return False
        return bool(_validator(secret).validate(url, params, signature, algorithm=algorithm))
    except (ValueError, TypeError, KeyError):
        return False


@lru_cache(maxsize=4)
def _validator(secret: str) -> RequestValidator:
    """One validator per secret (the auth token and, if set, the shared key), not one per request."""
    return RequestValidator(secret)


def sign(secret: str, url: str, params: Mapping[str, str]) -> str:
    """The ``X-Twilio-Signature`` Twilio sends for ``params`` posted to ``url`` (HMAC-SHA1 with the
    auth token), as the SDK computes it: the loopback peers sign their webhooks with it."""
    return str(RequestValidator(secret).compute_signature(url, params))
