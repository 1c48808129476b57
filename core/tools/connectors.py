"""What feature areas need to reach outside services, and which of them a person has connected.

Built once at start-up from the settings (:meth:`Connectors.from_settings`) and handed to the
areas' tool factories. Per-person credentials (Google tokens, a CalDAV password) live in the
``connections`` table; server-wide ones (Pepper's SMTP account, the Google OAuth client) here.

Connection names a session can hold (``SessionContext.connections``):

* ``pepper_mail``: Pepper's own SMTP address is configured and the person has an email handle to
  put on CC;
* ``gmail``: a Google connection granted the Gmail compose scope (drafts and sends);
* ``gmail_read``: a Google connection granted the Gmail read-only scope;
* ``imap``: an IMAP mailbox (``pepper connect imap``);
* ``mailbox``: a mailbox Pepper can read: ``gmail_read`` or ``imap`` (what the mail-reading tools
  need; Pepper's own inbox is read beside them);
* ``google_calendar``: a Google connection granted the Calendar events scope;
* ``caldav``: a CalDAV server;
* ``mcp:<name>``: an MCP server the person connected (``pepper mcp add``; GitHub's is ``mcp:github``).
* ``home_assistant``: a Home Assistant server with a long-lived token (``pepper connect home-assistant``);
* ``texting``: Pepper can text from one of the person's lines (Twilio is set up and they have a
  personal line);
* ``web``: not an account: this turn may hand a question to the web research helper (the
  conversation asked for the web, ``core.web.permission``); a text turn adds it, and a verified
  owner's call (``voice.owner_profile``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import httpx

from core.errors import ConfigError, InvalidInput
from core.store.queries import Queries
from core.vault import SecretKeyError, Vault
from core.web.egress import EgressPolicy, egress_policy
from core.web.permission import WebWindow
from core.web.tls import tls_context

WEB_TOOL = "web_research"

log = logging.getLogger(__name__)

GMAIL_COMPOSE = "https://www.googleapis.com/auth/gmail.compose"
GMAIL_READONLY = "https://www.googleapis.com/auth/gmail.readonly"
CALENDAR_EVENTS = "https://www.googleapis.com/auth/calendar.events"
# What each Google feature asks for: only the scopes its tools use (read and compose for Gmail,
# events for Calendar; the events scope also reads events, which is all free/busy needs).
GOOGLE_SCOPES: dict[str, tuple[str, ...]] = {
    "gmail": (GMAIL_COMPOSE, GMAIL_READONLY),
    "google_calendar": (CALENDAR_EVENTS,),
}
# The connection name each granted scope gives (a person who connected Gmail before it asked to
# read keeps the send tools, and reads once they connect again).
SCOPE_CONNECTIONS: dict[str, str] = {
    GMAIL_COMPOSE: "gmail",
    GMAIL_READONLY: "gmail_read",
    CALENDAR_EVENTS: "google_calendar",
}
MAILBOX = "mailbox"
# How a missing connection is named to the person (``pepper skills list``).
CONNECTION_NAMES: dict[str, str] = {
    "gmail": "Gmail",
    "gmail_read": "Gmail",
    MAILBOX: "Gmail or IMAP",
    "google_calendar": "Google Calendar",
    "caldav": "CalDAV",
    "pepper_mail": "Pepper's mail address",
    "home_assistant": "Home Assistant",
    "texting": "a Pepper line (Twilio)",
}


@dataclass(frozen=True)
class Connectors:
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_from: str | None = None
    smtp_security: str = "starttls"
    google_client_id: str | None = None
    google_client_secret: str | None = None
    google_auth_url: str = "https://accounts.google.com/o/oauth2/v2/auth"
    google_api_url: str = "https://www.googleapis.com"
    google_token_url: str = "https://oauth2.googleapis.com/token"
    google_revoke_url: str = "https://oauth2.googleapis.com/revoke"
    http_timeout: float = 15.0
    # Tests serve feeds and calendars on 127.0.0.1; a real server refuses private addresses so a
    # URL from a conversation cannot reach the machine's own services.
    allow_private_hosts: bool = False
    transport: httpx.AsyncBaseTransport | None = None
    # Seals what ``connections`` stores (core.vault); None only where nothing is connected.
    vault: Vault | None = None
    # The research helper's socket (core.web.helper) and how long one hand-off may take; None: no web research.
    research_socket: str | None = None
    research_seconds: float = 60.0
    # After a message that asks for the web, this many follow-ups within this many minutes may use it.
    research_followups: int = 3
    research_followup_minutes: float = 30.0
    # Travel time (core/tools/areas/places): "none" estimates from straight-line distance.
    routing_kind: str = "none"
    routing_url: str | None = None
    routing_key: str | None = None
    travel_speed_kmh: float = 30.0
    # Following (core/following): pages and sources are fetched under the web relay's egress rules.
    egress_policy: EgressPolicy = field(default_factory=EgressPolicy)
    sportsdb_url: str = "https://www.thesportsdb.com"
    sportsdb_key: str = "123"  # TheSportsDB's free key
    tvmaze_url: str = "https://api.tvmaze.com"
    # Weather forecasts (Open-Meteo: no key); tests point these at a loopback peer.
    open_meteo_url: str = "https://api.open-meteo.com"
    open_meteo_geocoding_url: str = "https://geocoding-api.open-meteo.com"
    # Sends texts from the person's line (``core.adapters.twilio.rest.TwilioMessenger`` or anything
    # with its ``send``); None: the messages area says texting is not set up.
    texter: Any = None
    # Where Twilio reports the delivery of texts Pepper sends (the gateway's status URL).
    text_status_url: str | None = None
    # The text models (``core.models.router.ModelRouter`` or anything with its ``generate``): the
    # translation area's own small call. None: translation says no model is configured.
    models: Any = None

    @classmethod
    def from_settings(cls, settings: Any) -> Connectors:
        def secret(value: Any) -> str | None:
            return value.get_secret_value() if value is not None else None

        return cls(
            smtp_host=settings.smtp_host,
            smtp_port=settings.smtp_port,
            smtp_username=settings.smtp_username,
            smtp_password=secret(settings.smtp_password),
            smtp_from=settings.smtp_from,
            smtp_security=settings.smtp_security,
            google_client_id=settings.google_client_id,
            google_client_secret=secret(settings.google_client_secret),
            google_auth_url=settings.google_auth_url,
            google_api_url=settings.google_api_url.rstrip("/"),
            google_token_url=settings.google_token_url,
            google_revoke_url=settings.google_revoke_url,
            vault=Vault.from_settings(settings),
            research_socket=settings.web_research_socket,
            research_seconds=settings.web_research_seconds,
            research_followups=settings.web_followups,
            research_followup_minutes=settings.web_followup_minutes,
            routing_kind=settings.routing_kind,
            routing_url=settings.routing_url,
            routing_key=secret(settings.routing_key),
            travel_speed_kmh=settings.travel_speed_kmh,
            egress_policy=egress_policy(settings),
            sportsdb_url=settings.sportsdb_url,
            sportsdb_key=secret(settings.sportsdb_key) or "123",
            tvmaze_url=settings.tvmaze_url,
        )

    def require_vault(self) -> Vault:
        if self.vault is None:
            raise ConfigError("no key to seal connection secrets with (PEPPER_SECRET_KEY or the data dir's key file)")
        return self.vault

    @property
    def smtp_configured(self) -> bool:
        return bool(self.smtp_host and self.smtp_from)

    def http(self, **kw: Any) -> httpx.AsyncClient:
        """A fresh HTTP client with Pepper's timeouts (close it, or use ``async with``)."""
        return httpx.AsyncClient(
            timeout=self.http_timeout,
            transport=self.transport,
            verify=tls_context(),  # built once: a fresh context per client costs 15-60 ms
            follow_redirects=kw.pop("follow_redirects", False),
            **kw,
        )

    async def check_public_url(self, url: str) -> str:
        """``url`` if it is an http(s) URL whose host is a public address; else ``InvalidInput``."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput("the address must be an http:// or https:// URL")
        if self.allow_private_hosts:
            return url.strip()
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname, parts.port or 443, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise InvalidInput("the address's host name does not resolve") from exc
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                raise InvalidInput("the address points to a private network")
        return url.strip()


def connections_select(connectors: Connectors | None = None) -> str:
    """A scalar SQL expression over the account id ``$1``: what :func:`connection_names` reads.
    ``account_connections`` runs it as a statement of its own; a text turn folds it into its first
    statement (``core.conversation.open_turn``)."""
    email = "false"
    if connectors is not None and connectors.smtp_configured:
        email = "EXISTS (SELECT 1 FROM handles WHERE account_id = $1 AND kind = 'email')"
    texting = "false"
    if connectors is not None and connectors.texter is not None:
        texting = "EXISTS (SELECT 1 FROM phone_lines WHERE account_id = $1 AND kind = 'personal')"
    return (
        "json_build_object('rows', (SELECT coalesce(json_agg(json_build_array(provider, scopes, label)), '[]')"
        f" FROM connections WHERE account_id = $1), 'email', {email}, 'texting', {texting})"
    )


def connection_names(selected: str) -> frozenset[str]:
    """The connection names (see the module docstring) from the JSON :func:`connections_select` gives."""
    data = json.loads(selected)
    names: set[str] = set()
    for provider, scopes, label in data["rows"]:
        if provider == "caldav":
            names.add("caldav")
        elif provider == "mcp":
            names.add(f"mcp:{label}")
        elif provider == "home_assistant":
            names.add("home_assistant")
        elif provider == "imap":
            names.add("imap")
        elif provider == "google":
            names.update(SCOPE_CONNECTIONS[s] for s in scopes if s in SCOPE_CONNECTIONS)
    if data["email"]:
        names.add("pepper_mail")
    if data.get("texting"):
        names.add("texting")
    if "gmail_read" in names or "imap" in names:
        names.add(MAILBOX)
    return frozenset(names)


async def account_connections(db: Queries, account_id: UUID, connectors: Connectors | None = None) -> frozenset[str]:
    """The connection names this person has (see the module docstring): what the gateway puts in
    ``SessionContext.connections`` for each turn."""
    return connection_names(await db.fetchval(f"SELECT {connections_select(connectors)}", account_id))


# --- Secrets of connections, sealed at rest -------------------------------------------------------


def seal(connectors: Connectors, secret: dict[str, Any]) -> bytes | None:
    """What to store in ``connections.sealed`` for ``secret`` (None when there is nothing secret)."""
    return connectors.require_vault().seal(secret) if secret else None


async def connection_secret(db: Queries, connectors: Connectors, connection_id: UUID) -> dict[str, Any] | None:
    """The connection's secret, opened; None when the connection is gone. A row still in plaintext
    (written before secrets were sealed) is sealed now. Raises ``SecretKeyError`` on a wrong key."""
    row = await db.fetchrow("SELECT secret, sealed FROM connections WHERE id = $1", connection_id)
    return None if row is None else await opened_secret(db, connectors, connection_id, row)


async def opened_secret(db: Queries, connectors: Connectors, connection_id: UUID, row: Any) -> dict[str, Any] | None:
    """The secret of a ``connections`` row the caller read with its ``secret`` and ``sealed``
    columns (beside whatever else it needed), as :func:`connection_secret` opens it."""
    if row["sealed"] is not None:
        return connectors.require_vault().unseal(row["sealed"])
    plain = _json(row["secret"])
    if plain:
        await _seal_row(db, connectors.require_vault(), connection_id, plain)
    return plain


async def store_secret(db: Queries, connectors: Connectors, connection_id: UUID, secret: dict[str, Any]) -> None:
    await db.execute(
        "UPDATE connections SET sealed = $2, secret = '{}', updated_at = now() WHERE id = $1",
        connection_id,
        seal(connectors, secret),
    )


async def seal_plaintext_secrets(db: Queries, vault: Vault) -> int:
    """Seal every secret still stored in plaintext; returns how many. Idempotent (run at start-up)."""
    rows = await db.fetch("SELECT id, secret FROM connections WHERE sealed IS NULL AND secret <> '{}'")
    for row in rows:
        await _seal_row(db, vault, row["id"], _json(row["secret"]))
    if rows:
        log.info("sealed %s connection secret(s) stored in plaintext", len(rows))
    return len(rows)


async def unopenable_secrets(db: Queries, vault: Vault) -> list[UUID]:
    """Connections whose sealed secret the configured key does not open (a changed or lost key)."""
    bad: list[UUID] = []
    for row in await db.fetch("SELECT id, sealed FROM connections WHERE sealed IS NOT NULL ORDER BY created_at"):
        try:
            vault.unseal(row["sealed"])
        except SecretKeyError:
            bad.append(row["id"])
    return bad


async def rotate_secrets(db: Queries, vault: Vault) -> int:
    """Seal every stored secret again under the newest key (after adding one to PEPPER_SECRET_KEY)."""
    rows = await db.fetch("SELECT id, sealed FROM connections WHERE sealed IS NOT NULL")
    for row in rows:
        await db.execute("UPDATE connections SET sealed = $2 WHERE id = $1", row["id"], vault.rotate(row["sealed"]))
    return len(rows)


async def _seal_row(db: Queries, vault: Vault, connection_id: UUID, plain: dict[str, Any]) -> None:
    # Only the row still in plaintext: a concurrent sealer or a new token must not be overwritten.
    await db.execute(
        "UPDATE connections SET sealed = $2, secret = '{}' WHERE id = $1 AND sealed IS NULL",
        connection_id,
        vault.seal(plain),
    )


def _json(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value or {})


def web_window(connectors: Connectors | None, registry: Any) -> WebWindow | None:
    """How long a request for the web lasts in a conversation; None when the registry has no web tool."""
    if connectors is None or connectors.research_socket is None or WEB_TOOL not in registry:
        return None
    return WebWindow(connectors.research_followups, timedelta(minutes=connectors.research_followup_minutes))
