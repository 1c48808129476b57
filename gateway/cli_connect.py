"""``pepper connect``: connect a person's Google account, CalDAV calendar or iCalendar feed, list
and remove connections, and re-seal secrets under a new key.

pepper connect google --account A --area calendar|gmail   prints the consent URL; the web callback completes it
pepper connect caldav --account A URL --username U         password from $PEPPER_CALDAV_PASSWORD, a prompt or stdin
pepper connect imap A --host H --user U [--port P] [--security ssl|starttls] [--name N]
                                                           password from $PEPPER_IMAP_PASSWORD, a prompt or stdin
pepper connect ics --account A URL [--name N]
pepper connect list [--account A]
pepper connect remove --account A REF                      REF: an id from `list`, or google
pepper connect rotate-key                                  seal every secret again under the first key
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from core import identity
from core.errors import ConfigError, InvalidInput, NotFound, PepperError
from core.records import connections
from core.settings import Settings
from core.store.queries import Queries
from core.tools.areas.calendar import add_ical_feed, connect_caldav
from core.tools.areas.mail import connect_imap
from core.tools.connectors import SCOPE_CONNECTIONS, Connectors, rotate_secrets
from core.tools.google_api import revoke_grant
from core.tools.oauth import AREA_NAMES, CLI_CONSENT_TTL, GOOGLE_AREAS, begin_google_consent
from core.vault import SecretKeyError
from gateway.connect_routes import callback_url

PASSWORD_ENV = "PEPPER_CALDAV_PASSWORD"
IMAP_PASSWORD_ENV = "PEPPER_IMAP_PASSWORD"
GOOGLE_PERMISSIONS = "https://myaccount.google.com/permissions"
# What each granted Google scope lets Pepper do, as `pepper connect list` says it.
GRANT_NAMES = {"google_calendar": "Google Calendar", "gmail_read": "Gmail (read)", "gmail": "Gmail (drafts and sends)"}

# Tests replace this (to let feeds and calendars on 127.0.0.1 through).
connectors_factory: Callable[[Settings], Connectors] = Connectors.from_settings


def add_commands(sub: Any) -> None:
    top = sub.add_parser("connect", help="connect Google, CalDAV calendars and iCalendar feeds; list and remove")
    actions = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    google = actions.add_parser("google", help="print the Google consent URL (the web callback completes it)")
    google.add_argument("--account", required=True, help="account id or unique name")
    google.add_argument("--area", required=True, choices=tuple(GOOGLE_AREAS))
    caldav = actions.add_parser("caldav", help=f"connect a CalDAV calendar (password: ${PASSWORD_ENV} or asked)")
    caldav.add_argument("--account", required=True, help="account id or unique name")
    caldav.add_argument("url", help="the calendar collection URL")
    caldav.add_argument("--username", required=True)
    mailbox = actions.add_parser(
        "imap", help=f"connect an IMAP mailbox for Pepper to read (password: ${IMAP_PASSWORD_ENV} or asked)"
    )
    mailbox.add_argument("account", help="account id or unique name")
    mailbox.add_argument("--host", required=True)
    mailbox.add_argument("--user", required=True, help="the mailbox's user name")
    mailbox.add_argument("--port", type=int, help="default: 993 for ssl, 143 for starttls")
    mailbox.add_argument("--security", choices=("ssl", "starttls", "none"), default="ssl")
    mailbox.add_argument("--name", help="how Pepper names the mailbox (default: user@host)")
    ics = actions.add_parser("ics", help="follow a read-only iCalendar feed (fetched once now to check it)")
    ics.add_argument("--account", required=True, help="account id or unique name")
    ics.add_argument("url")
    ics.add_argument("--name", default="Feed", help="how the calendar is called in the agenda")
    listing = actions.add_parser("list", help="connections and feeds, with whether their secrets open")
    listing.add_argument("--account", help="account id or unique name (default: every account)")
    remove = actions.add_parser("remove", help="remove a connection or feed (its calendars go with it)")
    remove.add_argument("--account", required=True, help="account id or unique name")
    remove.add_argument("ref", help="an id shown by `pepper connect list`, or google")
    actions.add_parser("rotate-key", help="seal every stored secret again under the first PEPPER_SECRET_KEY key")


def _read_password(env: str = PASSWORD_ENV, prompt: str = "CalDAV password: ") -> str:
    from_env = os.environ.get(env)
    if from_env:
        return from_env
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    return sys.stdin.readline().rstrip("\n")


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command != "connect":
        return False
    connectors = connectors_factory(settings)
    if args.action == "rotate-key":
        out(f"sealed {await rotate_secrets(db, connectors.require_vault())} secret(s) again under the first key")
        return True
    if args.action == "list":
        accounts = [await identity.get_account(db, args.account)] if args.account else await identity.list_accounts(db)
        for account in accounts:
            await _list(db, connectors, account, out)
        return True
    account = await identity.get_account(db, args.account)
    if args.action == "google":
        if not settings.public_url:
            raise ConfigError("set PEPPER_PUBLIC_URL: Google sends the browser back to its /connect/google/callback")
        url = await begin_google_consent(
            db, connectors, account.id, args.area, callback_url(settings.public_url), ttl=CLI_CONSENT_TTL
        )
        minutes = int(CLI_CONSENT_TTL.total_seconds() // 60)
        out(f"Open this address in a browser within {minutes} minutes to connect {AREA_NAMES[GOOGLE_AREAS[args.area]]}")
        out(f"for {account.name} (the running server at {settings.public_url} completes it):")
        out(url)
    elif args.action == "caldav":
        password = _read_password()
        calendar_id = await connect_caldav(db, connectors, account.id, args.url, args.username, password or None)
        name = await connections.calendar_name(db, calendar_id)
        out(f"connected CalDAV calendar {name!r} for {account.name}")
    elif args.action == "imap":
        password = _read_password(IMAP_PASSWORD_ENV, "IMAP password: ")
        name = args.name or f"{args.user}@{args.host}"
        _, created, count = await connect_imap(
            db, connectors, account.id, name, host=args.host, port=args.port, username=args.user, password=password,
            security=args.security,
        )  # fmt: skip
        state = "connected" if created else "updated the already connected"
        out(f"{state} IMAP mailbox {name!r} for {account.name} (read-only; its INBOX holds {count} message(s))")
    elif args.action == "ics":
        calendar_id = await add_ical_feed(db, connectors, account.id, args.url, args.name)
        out(f"following the iCalendar feed {args.name!r} for {account.name} ({calendar_id.hex[:8]})")
    else:
        out(await _remove(db, connectors, account, args.ref))
    return True


async def _list(db: Queries, connectors: Connectors, account: identity.Account, out: Callable[[str], None]) -> None:
    rows = await connections.connections_of(db, account.id)
    feeds = await connections.feeds_of(db, account.id)
    out(f"{account.name} ({account.id})")
    if not rows and not feeds:
        out("  nothing connected")
    for row in rows:
        if row["provider"] == "google":
            granted = {SCOPE_CONNECTIONS[s] for s in row["scopes"] if s in SCOPE_CONNECTIONS}
            what = ", ".join(name for key, name in GRANT_NAMES.items() if key in granted)
            what = f"Google: {what or 'no usable scope'}"
        elif row["provider"] == "mcp":
            what = f"MCP server: {row['label']} (pepper mcp list)"
        elif row["provider"] == "imap":
            what = f"IMAP mailbox: {row['label']} (read-only)"
        else:
            what = f"CalDAV: {row['label']}"
        out(f"  {row['id'].hex[:8]}  {what}  [{_secret_state(connectors, row)}]")
    for feed in feeds:
        out(f"  {feed['id'].hex[:8]}  iCalendar feed {feed['name']!r}: {feed['remote']}")


def _secret_state(connectors: Connectors, row: Any) -> str:
    if row["sealed"] is None:
        return "secret in plaintext: sealed at the next start" if row["plain"] else "no secret"
    try:
        connectors.require_vault().unseal(row["sealed"])
    except SecretKeyError:
        return "secret does not open with the configured key"
    return "sealed"


async def _revoke(db: Queries, connectors: Connectors, connection_id: UUID) -> str:
    """Revoke a Google grant before forgetting it; a failure is reported, and removal goes on."""
    if await connections.provider_of(db, connection_id) != "google":
        return ""
    try:
        await revoke_grant(db, connectors, connection_id)
    except PepperError as exc:
        return f"; Google's grant was NOT revoked ({exc.message}): remove Pepper at {GOOGLE_PERMISSIONS}"
    return "; Google's grant is revoked"


async def revoke_google_grants(db: Queries, settings: Settings, account_id: UUID) -> str:
    """Revoke every Google grant of an account that is about to be deleted (what ``pepper connect
    remove google`` does for each one); what happened, for the command's output."""
    connectors = connectors_factory(settings)
    notes = [await _revoke(db, connectors, cid) for cid in await connections.google_connections(db, account_id)]
    return "".join(notes)


async def _remove(db: Queries, connectors: Connectors, account: identity.Account, ref: str) -> str:
    ref = ref.strip().lower()
    if ref == "google":
        ids = await connections.google_connections(db, account.id)
    else:
        if len(ref) < 4:
            raise InvalidInput("give at least the first 4 characters of an id from `pepper connect list`")
        ids = await connections.connections_matching(db, account.id, ref)
    if len(ids) == 1:
        note = await _revoke(db, connectors, ids[0])
        await connections.remove_connection(db, ids[0])
        return f"removed the connection {_hex(ids[0])} of {account.name} (and its calendars){note}"
    feeds = await connections.feeds_matching(db, account.id, ref)
    if len(ids) > 1 or len(feeds) > 1:
        raise InvalidInput(f"{ref!r} matches more than one connection; give more of the id")
    if not feeds:
        raise NotFound(f"{account.name} has no connection or feed {ref!r}; see `pepper connect list`")
    await connections.remove_calendar(db, feeds[0])
    return f"removed the iCalendar feed {_hex(feeds[0])} of {account.name}"


def _hex(value: UUID) -> str:
    return value.hex[:8]
