"""A small Google API client (Calendar v3, Gmail v1) over httpx, with OAuth tokens kept in the store.

Pepper owns this client instead of importing google-api-python-client: the few calls it makes
are plain JSON over HTTPS, and tests point ``Connectors.google_api_url`` and ``google_token_url``
at the loopback peer in ``core.testing.google_api_peer``.

Scopes are narrow (``core.tools.connectors.GOOGLE_SCOPES``): Calendar events and Gmail compose,
asked only for the features the person connects.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import httpx

from core.errors import InvalidInput, PepperError
from core.store.queries import Queries
from core.tools.connectors import GOOGLE_SCOPES, Connectors, connection_secret, seal, store_secret
from core.vault import SecretKeyError

log = logging.getLogger(__name__)


class GoogleError(PepperError):
    code = "google-error"

    def __init__(
        self, message: str, *, status: int | None = None, retryable: bool | None = None, code: str | None = None
    ):
        super().__init__(message, retryable=retryable, code=code)
        self.status = status


def authorization_url(
    connectors: Connectors, features: list[str], redirect_uri: str, state: str, *, code_challenge: str | None = None
) -> str:
    """The consent page URL for ``features`` (``gmail``, ``google_calendar``): only their scopes,
    offline access (a refresh token) and the consent screen every time, so a refresh token comes
    back even for a person who connected before. ``code_challenge``: PKCE S256 (RFC 7636)."""
    if not connectors.google_client_id:
        raise InvalidInput("PEPPER_GOOGLE_CLIENT_ID is not set")
    unknown = [f for f in features if f not in GOOGLE_SCOPES]
    if unknown or not features:
        raise InvalidInput(f"connect one or more of {', '.join(GOOGLE_SCOPES)}")
    scopes = sorted({scope for f in features for scope in GOOGLE_SCOPES[f]})
    query = {
        "client_id": connectors.google_client_id,
        "redirect_uri": redirect_uri,
        "response_type": "code",
        "scope": " ".join(scopes),
        "access_type": "offline",
        "include_granted_scopes": "true",
        "prompt": "consent",
        "state": state,
    }
    if code_challenge is not None:
        query |= {"code_challenge": code_challenge, "code_challenge_method": "S256"}
    return f"{connectors.google_auth_url}?{urlencode(query)}"


async def exchange_code(
    db: Queries,
    connectors: Connectors,
    account_id: UUID,
    code: str,
    redirect_uri: str,
    *,
    label: str = "",
    code_verifier: str | None = None,
) -> UUID:
    """Trade an authorization code for tokens and store the connection (sealed); returns its id."""
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
    if code_verifier is not None:
        form["code_verifier"] = code_verifier
    tokens = await _token_request(connectors, form)
    scopes = sorted(set(tokens.get("scope", "").split()))
    sealed = seal(connectors, _secret_from(tokens, {}))
    return await db.fetchval(
        """
        INSERT INTO connections (account_id, provider, label, sealed, scopes)
        VALUES ($1, 'google', $2, $3, $4)
        ON CONFLICT (account_id, provider, label)
        DO UPDATE SET sealed = EXCLUDED.sealed, secret = '{}', scopes = EXCLUDED.scopes, updated_at = now()
        RETURNING id
        """,
        account_id,
        label,
        sealed,
        scopes,
    )


async def google_connection(db: Queries, account_id: UUID, scope: str) -> UUID | None:
    """The person's Google connection that was granted ``scope``, if any."""
    return await db.fetchval(
        "SELECT id FROM connections WHERE account_id = $1 AND provider = 'google' AND $2 = ANY(scopes)"
        " ORDER BY created_at LIMIT 1",
        account_id,
        scope,
    )


async def revoke_grant(db: Queries, connectors: Connectors, connection_id: UUID) -> None:
    """Ask Google to revoke the grant behind a stored connection (its refresh token). Raises
    ``GoogleError`` when Google refuses or cannot be reached, ``SecretKeyError`` on a wrong key."""
    secret = await connection_secret(db, connectors, connection_id) or {}
    token = secret.get("refresh_token") or secret.get("access_token")
    if not token:
        return
    try:
        async with connectors.http() as http:
            response = await http.post(connectors.google_revoke_url, data={"token": token})
    except httpx.HTTPError as exc:
        raise GoogleError("Google's sign-in service did not answer", retryable=True) from exc
    # 400 invalid_token: already revoked or expired, which is what was wanted.
    if response.status_code not in (200, 400):
        raise GoogleError(f"Google answered {response.status_code}", status=response.status_code)


def _secret_from(tokens: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    expires = datetime.now(UTC) + timedelta(seconds=int(tokens.get("expires_in", 3600)) - 60)
    return {
        "access_token": tokens["access_token"],
        "refresh_token": tokens.get("refresh_token") or old.get("refresh_token"),
        "expires_at": expires.isoformat(),
    }


async def _token_request(connectors: Connectors, form: dict[str, str]) -> dict[str, Any]:
    if not connectors.google_client_id or not connectors.google_client_secret:
        raise GoogleError("the Google OAuth client is not configured", retryable=False)
    form = {**form, "client_id": connectors.google_client_id, "client_secret": connectors.google_client_secret}
    try:
        async with connectors.http() as http:
            response = await http.post(connectors.google_token_url, data=form)
    except httpx.HTTPError as exc:
        raise GoogleError("Google's sign-in service did not answer", retryable=True) from exc
    if response.status_code != 200:
        raise GoogleError(
            "Google refused the sign-in; the person may need to connect Google again",
            status=response.status_code,
            retryable=response.status_code >= 500,
        )
    return response.json()


async def check_refresh(db: Queries, connectors: Connectors, connection_id: UUID) -> None:
    """Refresh one stored connection's access token and discard it (``pepper doctor --online``):
    proves the client and the person's grant still work, and stores nothing. Raises ``GoogleError``."""
    try:
        secret = await connection_secret(db, connectors, connection_id)
    except SecretKeyError as exc:
        raise GoogleError(exc.message, retryable=False, code=exc.code) from exc
    if not secret or not secret.get("refresh_token"):
        raise GoogleError("the connection holds no refresh token; connect Google again", retryable=False)
    await _token_request(connectors, {"grant_type": "refresh_token", "refresh_token": secret["refresh_token"]})


class GoogleClient:
    """Authorised JSON calls for one stored connection. Refreshes the access token when it is
    expired or Google answers 401, once per call."""

    def __init__(self, db: Queries, connectors: Connectors, connection_id: UUID):
        self.db = db
        self.connectors = connectors
        self.connection_id = connection_id

    async def _token(self, *, force: bool = False) -> str:
        try:
            secret = await connection_secret(self.db, self.connectors, self.connection_id)
        except SecretKeyError as exc:
            log.error("google connection secret does not open with the configured key")
            raise GoogleError(exc.message, retryable=False, code=exc.code) from exc
        if secret is None:
            raise GoogleError("the Google connection is gone", retryable=False)
        expires = secret.get("expires_at")
        fresh = expires is not None and datetime.fromisoformat(expires) > datetime.now(UTC)
        if secret.get("access_token") and fresh and not force:
            return secret["access_token"]
        if not secret.get("refresh_token"):
            raise GoogleError("the Google connection has expired; connect Google again", retryable=False)
        tokens = await _token_request(
            self.connectors, {"grant_type": "refresh_token", "refresh_token": secret["refresh_token"]}
        )
        secret = _secret_from(tokens, secret)
        await store_secret(self.db, self.connectors, self.connection_id, secret)
        return secret["access_token"]

    async def call(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One API call; returns the JSON body ({} for an empty one). Raises ``GoogleError``."""
        url = self.connectors.google_api_url + path
        token = await self._token()
        for attempt in (1, 2):
            try:
                async with self.connectors.http() as http:
                    response = await http.request(
                        method, url, params=params, json=body, headers={"Authorization": f"Bearer {token}"}
                    )
            except httpx.HTTPError as exc:
                raise GoogleError("Google did not answer", retryable=True) from exc
            if response.status_code == 401 and attempt == 1:
                token = await self._token(force=True)
                continue
            break
        if response.status_code >= 400:
            log.warning("google api error: status=%s path=%s", response.status_code, path.split("?")[0])
            raise GoogleError(
                _google_message(response),
                status=response.status_code,
                retryable=response.status_code in (429, 500, 502, 503, 504),
            )
        if not response.content:
            return {}
        return response.json()


def _google_message(response: httpx.Response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return f"Google answered {response.status_code}" + (f": {message}" if message else "")
