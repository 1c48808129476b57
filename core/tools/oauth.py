"""Connecting a Google account: the consent Pepper asks for and the callback that completes it.

:func:`begin_google_consent` stores a pending consent (the SHA-256 of a random ``state``, the
PKCE verifier, who asked and until when) and returns Google's consent URL; the callback calls
:func:`finish_google_consent`, which uses the state once, checks it was not forged, reused,
expired or carried to another browser, and trades the code for tokens (stored sealed).

Areas a person connects, and the connection name each gives their sessions:
``calendar`` -> ``google_calendar`` (Calendar events scope), ``gmail`` -> ``gmail`` (compose scope).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from core.access import token_hash
from core.errors import InvalidInput, PepperError
from core.store.queries import Queries
from core.tools.connectors import GOOGLE_SCOPES, Connectors
from core.tools.google_api import authorization_url, exchange_code

log = logging.getLogger(__name__)

GOOGLE_AREAS: dict[str, str] = {"calendar": "google_calendar", "gmail": "gmail"}
AREA_NAMES: dict[str, str] = {"google_calendar": "Google Calendar", "gmail": "Gmail"}
# Long enough to read a consent screen; a CLI user also has to carry the URL to a browser.
WEB_CONSENT_TTL = timedelta(minutes=10)
CLI_CONSENT_TTL = timedelta(minutes=30)


class ConsentRefused(PepperError):
    """The callback's state is unknown, used, expired or from another browser: nothing is stored."""

    code = "oauth-state-refused"


@dataclass(frozen=True)
class ConnectedGoogle:
    account_id: UUID
    connection_id: UUID
    features: tuple[str, ...]
    granted: tuple[str, ...]  # of ``features``, those whose scopes Google granted

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(f for f in self.features if f not in self.granted)


def google_feature(area: str) -> str:
    """The connection name for an area (``calendar``, ``gmail``); ``InvalidInput`` otherwise."""
    try:
        return GOOGLE_AREAS[area]
    except KeyError:
        raise InvalidInput(f"connect one of {', '.join(GOOGLE_AREAS)} (got {area!r})") from None


def _challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


async def begin_google_consent(
    db: Queries,
    connectors: Connectors,
    account_id: UUID,
    area: str,
    redirect_uri: str,
    *,
    ttl: timedelta = WEB_CONSENT_TTL,
    session_hash: bytes | None = None,
    browser_binding: str | None = None,
) -> str:
    """Store a pending consent and return Google's consent URL for ``area``.

    ``session_hash`` and ``browser_binding`` (a random value the caller also sets as a cookie on
    the browser) bind a web-started consent to that session and browser; the CLI passes neither.
    """
    feature = google_feature(area)
    if not connectors.google_client_id or not connectors.google_client_secret:
        raise InvalidInput("Google is not set up: set PEPPER_GOOGLE_CLIENT_ID and PEPPER_GOOGLE_CLIENT_SECRET")
    connectors.require_vault()  # refuse before the person consents, not after
    state = secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(48)  # 64 characters, within RFC 7636's 43..128
    await db.execute("DELETE FROM oauth_states WHERE expires_at < now()")
    await db.execute(
        """
        INSERT INTO oauth_states (state_hash, account_id, provider, features, redirect_uri, code_verifier,
                                  session_hash, browser_hash, expires_at)
        VALUES ($1, $2, 'google', $3, $4, $5, $6, $7, now() + $8)
        """,
        token_hash(state),
        account_id,
        [feature],
        redirect_uri,
        verifier,
        session_hash,
        token_hash(browser_binding) if browser_binding else None,
        ttl,
    )
    return authorization_url(connectors, [feature], redirect_uri, state, code_challenge=_challenge(verifier))


async def _take_state(db: Queries, state: str | None) -> Any:
    """The pending consent for ``state``, deleted in the same statement: a state works once."""
    if not state:
        raise ConsentRefused("the answer from Google carries no state; start connecting again")
    row = await db.fetchrow(
        "DELETE FROM oauth_states WHERE state_hash = $1 RETURNING *, expires_at < now() AS expired", token_hash(state)
    )
    if row is None:
        raise ConsentRefused("this sign-in link is unknown or was already used; start connecting again")
    if row["expired"]:
        raise ConsentRefused("this sign-in link expired; start connecting again")
    return row


async def _check_binding(db: Queries, row: Any, browser_binding: str | None) -> None:
    if row["session_hash"] is None:
        return  # started by `pepper connect`: bound to the account only
    if not browser_binding or not hmac.compare_digest(token_hash(browser_binding), bytes(row["browser_hash"])):
        raise ConsentRefused("this sign-in was started in another browser; start connecting again from this one")
    alive = await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM web_sessions WHERE token_hash = $1 AND expires_at > now())",
        row["session_hash"],
    )
    if not alive:
        raise ConsentRefused("you signed out of Pepper since starting; sign in and connect again")


async def finish_google_consent(
    db: Queries, connectors: Connectors, state: str | None, code: str | None, *, browser_binding: str | None = None
) -> ConnectedGoogle:
    """Complete a consent: use the state once, check its binding, trade ``code`` for tokens and
    store the connection. Raises ``ConsentRefused`` (nothing stored) or the exchange's error."""
    row = await _take_state(db, state)
    await _check_binding(db, row, browser_binding)
    if not code:
        raise ConsentRefused("Google sent no authorization code; start connecting again")
    connection_id = await exchange_code(
        db, connectors, row["account_id"], code, row["redirect_uri"], code_verifier=row["code_verifier"]
    )
    scopes = set(await db.fetchval("SELECT scopes FROM connections WHERE id = $1", connection_id))
    features = tuple(row["features"])
    granted = tuple(f for f in features if scopes.issuperset(GOOGLE_SCOPES[f]))
    return ConnectedGoogle(row["account_id"], connection_id, features, granted)


async def decline_google_consent(db: Queries, state: str | None, *, browser_binding: str | None = None) -> None:
    """Google answered with an error (the person declined): use up the state; nothing is stored.
    Raises ``ConsentRefused`` when the state itself is bad."""
    row = await _take_state(db, state)
    await _check_binding(db, row, browser_binding)
