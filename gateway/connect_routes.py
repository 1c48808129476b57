"""Connecting Google from the web page: ``/connect/google?area=calendar|gmail`` and its callback.

The owner must be signed in (the Strict session cookie is sent only when the link is followed
from Pepper's own page, which also keeps other sites from starting a consent). Google's redirect
back is a cross-site navigation that carries no Strict cookie, so the start also sets a short-lived
Lax cookie on the callback path; the pending consent is bound to its hash and to the session.
The redirect URI is always ``PEPPER_PUBLIC_URL`` + ``/connect/google/callback``.
"""

from __future__ import annotations

import logging
import secrets

from quart import Blueprint, Response, current_app, redirect, request

from core import access
from core.errors import InvalidInput, PepperError
from core.security import record_security_event
from core.tools.oauth import (
    AREA_NAMES,
    WEB_CONSENT_TTL,
    ConsentRefused,
    begin_google_consent,
    decline_google_consent,
    finish_google_consent,
)
from gateway.pages import message_page
from gateway.services import Services
from gateway.webchat import COOKIE
from gateway.webhooks import GOOGLE_CALLBACK

log = logging.getLogger(__name__)

blueprint = Blueprint("connect", __name__)

CALLBACK_PATH = GOOGLE_CALLBACK.path
BINDING_COOKIE = "pepper_connect"


def callback_url(public_url: str) -> str:
    return public_url.rstrip("/") + CALLBACK_PATH


def _services() -> Services:
    return current_app.extensions["pepper"]


async def _page(status: int, title: str, text: str) -> Response:
    response = await message_page(status, title, text)
    response.headers["Referrer-Policy"] = "no-referrer"  # the callback URL carries the code
    return response


def _secure() -> bool:
    return (_services().settings.public_url or "").startswith("https://") or request.scheme == "https"


@blueprint.get("/connect/google")
async def start() -> Response:
    services = _services()
    token = request.cookies.get(COOKIE)
    session = await access.session_for(services.db, token)
    if session is None or token is None:
        return await _page(401, "Sign in first", "Sign in to Pepper, then follow the connect link again.")
    public_url = services.settings.public_url
    if not public_url:
        return await _page(503, "Not set up", "Set PEPPER_PUBLIC_URL: Google sends people back to that address.")
    harness = services.harness
    connectors = getattr(harness, "connectors", None)
    if connectors is None:
        return await _page(503, "Not set up", "This server has no connectors configured.")
    binding = secrets.token_urlsafe(32)
    try:
        url = await begin_google_consent(
            services.db, connectors, session.account_id, request.args.get("area", ""), callback_url(public_url),
            session_hash=access.token_hash(token), browser_binding=binding,
        )  # fmt: skip
    except InvalidInput as exc:
        return await _page(400, "Cannot connect", exc.message)
    except PepperError as exc:
        log.error("google consent could not start: %s", exc.code)
        return await _page(503, "Cannot connect", exc.message)
    response = redirect(url)
    # Lax, not Strict: it must come back on Google's cross-site redirect to the callback.
    response.set_cookie(
        BINDING_COOKIE, binding, max_age=int(WEB_CONSENT_TTL.total_seconds()), httponly=True, secure=_secure(),
        samesite="Lax", path=CALLBACK_PATH,
    )  # fmt: skip
    return response


@blueprint.get(CALLBACK_PATH)
async def callback() -> Response:
    services = _services()
    args = request.args
    binding = request.cookies.get(BINDING_COOKIE)
    connectors = getattr(services.harness, "connectors", None)
    try:
        if args.get("error"):
            await decline_google_consent(services.db, args.get("state"), browser_binding=binding)
            declined = args["error"] == "access_denied"
            log.info("google consent not given: %s", "declined" if declined else "error")
            return _clear(
                await _page(
                    200,
                    "Nothing was connected",
                    "You declined on Google's page, so Pepper connected nothing."
                    if declined
                    else "Google answered with an error, so Pepper connected nothing. Try again later.",
                )
            )
        if connectors is None:
            return await _page(503, "Not set up", "This server has no connectors configured.")
        done = await finish_google_consent(
            services.db, connectors, args.get("state"), args.get("code"), browser_binding=binding
        )
    except ConsentRefused as exc:
        await record_security_event(services.db, "oauth-state-refused", path=CALLBACK_PATH, reason=exc.message)
        return _clear(await _page(400, "Not connected", exc.message))
    except PepperError as exc:
        log.warning("google code exchange failed: %s", exc.code)
        return _clear(await _page(502, "Not connected", f"Google did not complete the sign-in ({exc.message})."))
    names = ", ".join(AREA_NAMES[f] for f in done.granted)
    if done.missing:
        text = f"Google did not grant access to {', '.join(AREA_NAMES[f] for f in done.missing)}."
        if names:
            text += f" Connected: {names}."
        return _clear(await _page(200, "Partly connected", text))
    return _clear(await _page(200, "Connected", f"{names} is connected. Pepper can use it from your next message."))


def _clear(response: Response) -> Response:
    response.delete_cookie(BINDING_COOKIE, path=CALLBACK_PATH)
    return response
