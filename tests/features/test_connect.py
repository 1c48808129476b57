"""Connecting accounts as a person does: Google's consent through the real web routes (against the
loopback Google peer) and from `pepper connect google`; CalDAV against a real Radicale that checks
passwords; iCalendar feeds; secrets sealed at rest, key rotation, and a wrong key."""

from __future__ import annotations

import asyncio
import stat
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web

from core import access, identity
from core.settings import Settings
from core.store import Database
from core.testing.google_api_peer import GoogleApiPeer
from core.testing.radicale_server import RadicaleServer
from core.tools.connectors import (
    CALENDAR_EVENTS,
    GMAIL_COMPOSE,
    GMAIL_READONLY,
    Connectors,
    account_connections,
    rotate_secrets,
    seal_plaintext_secrets,
)
from core.vault import SecretKeyError, Vault, generate_key
from gateway import cli_connect
from gateway.server import running_app

from .support import Caller, cli, serving
from .test_calendar_remote import FEED

PASSWORD = "correct horse battery"
PUBLIC = "https://pepper.example.org"
CALLBACK = PUBLIC + "/connect/google/callback"


@dataclass
class Site:
    db: Database
    google: GoogleApiPeer
    base: str
    account: identity.Account
    settings: Settings

    def browser(self) -> aiohttp.ClientSession:
        # The public URL is https (Secure cookies) while the test talks http to the loopback
        # socket, as behind a TLS-terminating proxy.
        jar = aiohttp.CookieJar(unsafe=True, treat_as_secure_origin=[self.base])
        return aiohttp.ClientSession(cookie_jar=jar)

    def local(self, public_url: str) -> str:
        """Where the browser lands for a public URL (the proxy forwards it to our socket)."""
        assert public_url.startswith(PUBLIC + "/"), public_url
        return self.base + public_url.removeprefix(PUBLIC)

    def caller(self) -> Caller:
        return Caller(self.db, self.account, Connectors.from_settings(self.settings))

    async def connections(self) -> list:
        return await self.db.fetch("SELECT * FROM connections WHERE account_id = $1", self.account.id)


@pytest.fixture
async def site(db: Database, db_url: str, tmp_path: Path) -> AsyncIterator[Site]:
    ada = await identity.create_account(db, "Ada", timezone="Europe/Paris")
    await access.set_web_password(db, ada.id, "ada", PASSWORD)
    async with GoogleApiPeer() as google:
        settings = Settings(
            database_url=db_url, port=0, public_url=PUBLIC, data_dir=tmp_path / "data", secret_key=generate_key(),
            google_client_id="client-id", google_client_secret="client-secret", google_auth_url=google.auth_url,
            google_token_url=google.token_url, google_api_url=google.url, scheduler_enabled=False,
            memory_jobs_interval=0,
        )  # fmt: skip
        async with running_app(settings, db) as (_app, port):
            yield Site(db, google, f"http://127.0.0.1:{port}", ada, settings)


async def sign_in(browser: aiohttp.ClientSession, base: str) -> None:
    async with browser.post(base + "/chat/login", data={"login": "ada", "password": PASSWORD}, allow_redirects=False):
        pass
    async with browser.get(base + "/api/session") as response:
        assert response.status == 200


async def consent(site: Site, browser: aiohttp.ClientSession, area: str) -> tuple[str, dict[str, list[str]]]:
    """Start on Pepper's page and pass Google's consent: the callback URL Google sends back to."""
    async with browser.get(site.base + f"/connect/google?area={area}", allow_redirects=False) as start:
        assert start.status == 302, await start.text()
        to_google = start.headers["Location"]
    query = parse_qs(urlsplit(to_google).query)
    async with browser.get(to_google, allow_redirects=False) as answer:
        assert answer.status == 302
        return answer.headers["Location"], query


async def visit(browser: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with browser.get(url, allow_redirects=False) as response:
        return response.status, await response.text()


async def test_the_google_consent_dance_through_the_web_page_then_calendar_tools_use_the_token(site: Site):
    google = site.google
    async with site.browser() as browser:
        await sign_in(browser, site.base)
        back, asked = await consent(site, browser, "calendar")
        # Only the Calendar scope, offline access, the consent screen, PKCE, our public callback.
        assert asked["scope"] == [CALENDAR_EVENTS] and asked["redirect_uri"] == [CALLBACK]
        assert asked["access_type"] == ["offline"] and asked["prompt"] == ["consent"]
        assert asked["code_challenge_method"] == ["S256"] and len(asked["code_challenge"][0]) == 43
        state = asked["state"][0]
        assert await site.db.fetchval("SELECT count(*) FROM oauth_states") == 1
        assert await site.db.fetchval("SELECT count(*) FROM oauth_states o WHERE strpos(o::text, $1) > 0", state) == 0
        status, page = await visit(browser, site.local(back))
        assert status == 200 and "Google Calendar is connected" in page, page
        # The code went to the configured token URL with the PKCE verifier and our redirect URI.
        [exchange] = google.token_requests
        assert exchange["redirect_uri"] == CALLBACK and len(exchange["code_verifier"]) >= 43
        # The same answer replayed is refused: the state worked once.
        status, page = await visit(browser, site.local(back))
        assert status == 400 and "already used" in page
    [row] = await site.connections()
    assert row["scopes"] == [CALENDAR_EVENTS] and row["secret"] == "{}"
    assert b"refresh-1" not in row["sealed"] and b"token-" not in row["sealed"]
    dump = await site.db.fetchval("SELECT string_agg(c::text, '') FROM connections c")
    assert "refresh-1" not in dump and "token-" not in dump
    assert await site.db.fetchval("SELECT count(*) FROM oauth_states") == 0

    caller = site.caller()
    assert "google_calendar" in (await caller.session()).connections
    made = await caller("create_event", {"title": "Dentist", "start": "2025-03-28T09:00", "calendar": "google"})
    assert made.status == "ok", made.content
    listed = await caller("list_events", {"start": "2025-03-28T00:00", "days": 1})
    assert "Dentist" in listed.content and "unknown" not in listed.content, listed.content
    # The access token expires: the stored refresh token gets a new one, sealed again.
    before = row["sealed"]
    google.expire_tokens()
    listed = await caller("list_events", {"start": "2025-03-28T00:00", "days": 1})
    assert "Dentist" in listed.content and "unknown" not in listed.content, listed.content
    assert [r["grant_type"] for r in google.token_requests] == ["authorization_code", "refresh_token"]
    [row] = await site.connections()
    assert row["sealed"] != before and b"token-" not in row["sealed"]


async def test_gmail_asks_for_compose_and_read_only_and_keeps_calendar(site: Site):
    async with site.browser() as browser:
        await sign_in(browser, site.base)
        for area in ("calendar", "gmail"):
            back, asked = await consent(site, browser, area)
            gmail = " ".join(sorted([GMAIL_COMPOSE, GMAIL_READONLY]))
            assert asked["scope"] == [CALENDAR_EVENTS if area == "calendar" else gmail]
            status, page = await visit(browser, site.local(back))
            assert status == 200, page
    [row] = await site.connections()
    assert sorted(row["scopes"]) == sorted([CALENDAR_EVENTS, GMAIL_COMPOSE, GMAIL_READONLY])
    assert {"gmail", "gmail_read", "mailbox", "google_calendar"} <= await account_connections(site.db, site.account.id)


async def test_forged_expired_foreign_and_declined_consents_store_nothing(site: Site):
    google = site.google
    async with site.browser() as browser:
        # Signed out: no consent starts.
        status, page = await visit(browser, site.base + "/connect/google?area=calendar")
        assert status == 401 and "Sign in" in page
        await sign_in(browser, site.base)
        status, page = await visit(browser, site.base + "/connect/google?area=contacts")
        assert status == 400 and "calendar" in page
        # A forged state.
        status, page = await visit(browser, site.base + "/connect/google/callback?code=x&state=forged")
        assert status == 400 and "unknown" in page
        # Expired.
        back, _ = await consent(site, browser, "calendar")
        await site.db.execute("UPDATE oauth_states SET expires_at = now() - interval '1 second'")
        status, page = await visit(browser, site.local(back))
        assert status == 400 and "expired" in page
        # Carried to another browser (no binding cookie), even with a valid session elsewhere.
        back, _ = await consent(site, browser, "calendar")
        async with site.browser() as other:
            await sign_in(other, site.base)
            status, page = await visit(other, site.local(back))
        assert status == 400 and "another browser" in page
        # The person declines on Google's page.
        google.deny = True
        back, _ = await consent(site, browser, "calendar")
        assert "error=access_denied" in back
        status, page = await visit(browser, site.local(back))
        assert status == 200 and "You declined" in page and "connected nothing" in page
    assert await site.connections() == []
    assert await site.db.fetchval("SELECT count(*) FROM oauth_states WHERE expires_at > now()") == 0
    assert await site.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'oauth-state-refused'") == 3
    assert [r for r in google.token_requests] == []  # no code was ever exchanged


def site_env(site: Site) -> dict[str, str]:
    s = site.settings
    return {
        "DATABASE_URL": s.database_url.get_secret_value(),  # type: ignore[union-attr]
        "PEPPER_PUBLIC_URL": PUBLIC,
        "PEPPER_SECRET_KEY": s.secret_key.get_secret_value(),  # type: ignore[union-attr]
        "PEPPER_GOOGLE_CLIENT_ID": "client-id",
        "PEPPER_GOOGLE_CLIENT_SECRET": "client-secret",
        "PEPPER_GOOGLE_AUTH_URL": site.google.auth_url,
        "PEPPER_GOOGLE_TOKEN_URL": site.google.token_url,
        "PEPPER_GOOGLE_API_URL": site.google.url,
        "PEPPER_GOOGLE_REVOKE_URL": site.google.revoke_url,
    }


async def test_pepper_connect_google_prints_the_url_and_the_web_callback_completes_it(site: Site, capsys):
    env = site_env(site)
    code, out = await asyncio.to_thread(cli, env, "connect", "google", "--account", "Ada", "--area", "gmail")
    assert code == 0, capsys.readouterr().err
    url = out.splitlines()[-1]
    asked = parse_qs(urlsplit(url).query)
    assert url.startswith(site.google.auth_url) and asked["redirect_uri"] == [CALLBACK]
    assert asked["scope"] == [" ".join(sorted([GMAIL_COMPOSE, GMAIL_READONLY]))]
    async with site.browser() as browser:  # a browser that never signed in to Pepper
        async with browser.get(url, allow_redirects=False) as answer:
            back = answer.headers["Location"]
        status, page = await visit(browser, site.local(back))
        assert status == 200 and "Gmail is connected" in page
        status, page = await visit(browser, site.local(back))
        assert status == 400 and "already used" in page
    code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
    assert code == 0 and "Google: Gmail (read), Gmail (drafts and sends)" in out and "[sealed]" in out, out
    code, out = await asyncio.to_thread(cli, env, "connect", "remove", "--account", "Ada", "google")
    assert code == 0 and "removed" in out and "grant is revoked" in out, out
    assert site.google.revoked == ["refresh-1"]
    assert await site.connections() == []
    code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
    assert "nothing connected" in out


# --- CalDAV and iCalendar feeds from the CLI -------------------------------------------------------


@pytest.fixture(scope="module")
def radicale_with_passwords(tmp_path_factory):
    with RadicaleServer(tmp_path_factory.mktemp("radicale-auth"), users={"ada": "s3cret-pw"}) as server:
        yield server


EVENT = b"""BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//Test//EN
BEGIN:VEVENT
UID:standup@test
DTSTART:20250328T080000Z
DTEND:20250328T083000Z
SUMMARY:Standup
END:VEVENT
END:VCALENDAR
"""


@pytest.fixture
def private_hosts(monkeypatch):
    """The CLI's connectors as a server's, but letting feeds on 127.0.0.1 through."""

    def factory(settings: Settings) -> Connectors:
        from dataclasses import replace

        return replace(Connectors.from_settings(settings), allow_private_hosts=True)

    monkeypatch.setattr(cli_connect, "connectors_factory", factory)


async def test_pepper_connect_caldav_checks_the_password_then_tools_list_its_events(
    db: Database, db_url: str, radicale_with_passwords: RadicaleServer, capsys, private_hosts
):
    import httpx

    ada = await identity.create_account(db, "Ada", timezone="Europe/Paris")
    url = radicale_with_passwords.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    async with httpx.AsyncClient(auth=("ada", "s3cret-pw")) as http:
        put = await http.put(url + "standup.ics", content=EVENT, headers={"Content-Type": "text/calendar"})
        assert put.status_code == 201
    key = generate_key()
    env = {"DATABASE_URL": db_url, "PEPPER_SECRET_KEY": key, "PEPPER_CALDAV_PASSWORD": "wrong"}
    code, _ = await asyncio.to_thread(cli, env, "connect", "caldav", "--account", "Ada", url, "--username", "ada")
    err = capsys.readouterr().err
    assert code == 1 and "refused the user name or password" in err and "Traceback" not in err
    assert await db.fetchval("SELECT count(*) FROM connections") == 0
    env["PEPPER_CALDAV_PASSWORD"] = "s3cret-pw"
    code, out = await asyncio.to_thread(cli, env, "connect", "caldav", "--account", "Ada", url, "--username", "ada")
    assert code == 0 and "connected CalDAV calendar" in out, capsys.readouterr().err
    row = await db.fetchrow("SELECT * FROM connections")
    assert b"s3cret-pw" not in row["sealed"] and row["secret"] == "{}"
    assert "s3cret-pw" not in await db.fetchval("SELECT string_agg(c::text, '') FROM connections c")

    caller = Caller(db, ada, Connectors(allow_private_hosts=True, vault=Vault(key)))
    listed = await caller("list_events", {"start": "2025-03-28T00:00", "days": 1})
    assert "09:00-09:30 Standup" in listed.content and "unknown" not in listed.content, listed.content

    # A wrong key: the calendar is still connected, and says why it cannot be read.
    wrong = Caller(db, ada, Connectors(allow_private_hosts=True, vault=Vault(generate_key())))
    assert "caldav" in (await wrong.session()).connections
    listed = await wrong("list_events", {"start": "2025-03-28T00:00", "days": 1})
    assert "unknown, not absent" in listed.content and "Standup" not in listed.content
    assert "do not open with this server's key" in listed.content
    env["PEPPER_SECRET_KEY"] = generate_key()
    code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
    assert code == 0 and "does not open with the configured key" in out


async def test_pepper_connect_caldav_with_a_url_that_is_not_http_says_so(db: Database, db_url: str, capsys):
    await identity.create_account(db, "Ada")
    env = {"DATABASE_URL": db_url, "PEPPER_SECRET_KEY": generate_key(), "PEPPER_CALDAV_PASSWORD": "pw"}
    for url, says in (
        ("ftp://dav.example.org/cal/", "this one starts with ftp://"),
        ("dav.example.org/cal/", "this one has no scheme"),
        ("https:///cal/", "this one names no server"),
    ):
        code, _ = await asyncio.to_thread(cli, env, "connect", "caldav", "--account", "Ada", url, "--username", "ada")
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("pepper: error: a CalDAV URL starts with https://") and says in err, err
        assert "did not answer" not in err
    assert await db.fetchval("SELECT count(*) FROM connections") == 0


async def test_pepper_connect_ics_fetches_the_feed_once_and_refuses_what_is_not_one(
    db: Database, db_url: str, capsys, private_hosts
):
    async def feed(request: web.Request) -> web.Response:
        return web.Response(body=FEED, content_type="text/calendar")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html></html>", content_type="text/html")

    await identity.create_account(db, "Ada", timezone="Europe/Paris")
    env = {"DATABASE_URL": db_url, "PEPPER_SECRET_KEY": generate_key()}
    async with serving({"/school.ics": feed, "/page": page}) as base:
        code, _ = await asyncio.to_thread(cli, env, "connect", "ics", "--account", "Ada", base + "/page")
        assert code == 1 and "not an iCalendar calendar" in capsys.readouterr().err
        assert await db.fetchval("SELECT count(*) FROM calendars WHERE kind = 'ical'") == 0
        code, out = await asyncio.to_thread(
            cli, env, "connect", "ics", "--account", "Ada", base + "/school.ics", "--name", "School"
        )
        assert code == 0 and "School" in out
        code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
        assert "iCalendar feed 'School'" in out
        ref = out.splitlines()[-1].split()[0]
        code, out = await asyncio.to_thread(cli, env, "connect", "remove", "--account", "Ada", ref)
        assert code == 0 and "removed the iCalendar feed" in out
        assert await db.fetchval("SELECT count(*) FROM calendars WHERE kind = 'ical'") == 0


# --- Sealing ----------------------------------------------------------------------------------------


async def test_plaintext_secrets_from_before_are_sealed_once_and_keys_rotate(db: Database):
    ada = await identity.create_account(db, "Ada")
    # A row as Pepper wrote it before secrets were sealed.
    await db.execute(
        "INSERT INTO connections (account_id, provider, label, config, secret) VALUES ($1, 'caldav', 'x', '{}', $2)",
        ada.id,
        '{"password": "old-plaintext"}',
    )
    old, new = generate_key(), generate_key()
    assert await seal_plaintext_secrets(db, Vault(old)) == 1
    assert await seal_plaintext_secrets(db, Vault(old)) == 0  # idempotent
    row = await db.fetchrow("SELECT secret, sealed FROM connections")
    assert row["secret"] == "{}" and b"old-plaintext" not in row["sealed"]
    assert Vault(old).unseal(row["sealed"]) == {"password": "old-plaintext"}
    # Rotation: the new key first, the old one still opens; after re-sealing only the new one does.
    both = Vault(f"{new},{old}")
    assert both.unseal(row["sealed"]) == {"password": "old-plaintext"}
    assert await rotate_secrets(db, both) == 1
    sealed = await db.fetchval("SELECT sealed FROM connections")
    assert Vault(new).unseal(sealed) == {"password": "old-plaintext"}
    with pytest.raises(SecretKeyError, match="does not open with PEPPER_SECRET_KEY"):
        Vault(old).unseal(sealed)


def test_the_key_file_is_made_once_with_owner_only_permissions(tmp_path: Path):
    vault = Vault(key_file=tmp_path / "data" / "secret.key")
    with pytest.raises(SecretKeyError, match="is missing"):
        vault.unseal(b"gAAAA")  # opening never invents a key
    token = vault.seal({"password": "pw"})
    path = tmp_path / "data" / "secret.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Vault(key_file=path).unseal(token) == {"password": "pw"}
    path.write_text(generate_key())
    with pytest.raises(SecretKeyError, match=r"secret\.key"):
        Vault(key_file=path).unseal(token)


async def test_the_server_seals_old_plaintext_secrets_at_start_and_names_a_wrong_key(
    db: Database, db_url: str, tmp_path: Path, caplog
):
    ada = await identity.create_account(db, "Ada")
    await db.execute(
        "INSERT INTO connections (account_id, provider, label, config, secret) VALUES ($1, 'caldav', 'x', '{}', $2)",
        ada.id,
        '{"password": "from-before"}',
    )
    settings = Settings(
        database_url=db_url, port=0, data_dir=tmp_path / "data", scheduler_enabled=False, memory_jobs_interval=0
    )
    async with running_app(settings, db) as (_app, port):
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as health:
            assert health.status == 200
    row = await db.fetchrow("SELECT secret, sealed FROM connections")
    assert row["secret"] == "{}" and b"from-before" not in row["sealed"]
    key_file = tmp_path / "data" / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert Vault(key_file=key_file).unseal(row["sealed"]) == {"password": "from-before"}
    # Started again with another key: it serves, and the log names the problem once.
    caplog.clear()
    other = Settings(**{**settings.model_dump(), "secret_key": generate_key(), "port": 0})
    async with running_app(other, db) as (_app, port):
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as health:
            assert health.status == 200
    [error] = [r for r in caplog.records if "connection secrets" in r.getMessage()]
    assert error.levelname == "ERROR" and "does not open with PEPPER_SECRET_KEY" in error.getMessage()
    assert await db.fetchval("SELECT count(*) FROM connections") == 1  # still connected


async def test_deleting_an_account_revokes_its_google_grant_first(site: Site, capsys):
    env = site_env(site)
    code, out = await asyncio.to_thread(cli, env, "connect", "google", "--account", "Ada", "--area", "gmail")
    assert code == 0, capsys.readouterr().err
    async with site.browser() as browser:
        async with browser.get(out.splitlines()[-1], allow_redirects=False) as answer:
            back = answer.headers["Location"]
        status, _page = await visit(browser, site.local(back))
        assert status == 200
    code, out = await asyncio.to_thread(cli, env, "account", "delete", "Ada", "--yes")
    assert code == 0 and "deleted account" in out and "grant is revoked" in out, out
    assert site.google.revoked == ["refresh-1"]
    assert await site.connections() == []


async def test_pepper_connect_home_assistant_checks_the_token_and_seals_it(db: Database, db_url: str, capsys):
    from core.testing.home_assistant_peer import HomeAssistantPeer

    await identity.create_account(db, "Ada")
    key = generate_key()
    async with HomeAssistantPeer() as home:
        env = {"DATABASE_URL": db_url, "PEPPER_SECRET_KEY": key, "PEPPER_HA_TOKEN": "forged-token"}
        code, _ = await asyncio.to_thread(cli, env, "connect", "home-assistant", "Ada", home.url)
        err = capsys.readouterr().err
        assert code == 1 and "refused the token" in err and "Traceback" not in err
        assert await db.fetchval("SELECT count(*) FROM connections") == 0
        env["PEPPER_HA_TOKEN"] = home.token
        for _ in range(2):  # connecting again replaces the connection: still one
            code, out = await asyncio.to_thread(cli, env, "connect", "home-assistant", "Ada", home.url)
            assert code == 0 and f"connected Home Assistant at {home.url}" in out, capsys.readouterr().err
        row = await db.fetchrow("SELECT * FROM connections")
        assert await db.fetchval("SELECT count(*) FROM connections") == 1
        assert home.token.encode() not in row["sealed"] and row["secret"] == "{}"
        code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
        assert code == 0 and f"Home Assistant: {home.url}" in out and "[sealed]" in out
        code, _ = await asyncio.to_thread(cli, env, "connect", "home-assistant", "Ada", "not a url")
        assert code == 1 and "http:// or https://" in capsys.readouterr().err
