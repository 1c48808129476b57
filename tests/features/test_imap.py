"""An IMAP mailbox, against a real Dovecot started for these tests: `pepper connect imap` (a wrong
password, garbage settings, something that is not an IMAP server, connecting twice), then the mail
tools reading it beside Pepper's own inbox, and the mailbox failing mid-way."""

from __future__ import annotations

import asyncio

import pytest

from core import identity
from core.testing.dovecot_server import DovecotServer, available
from core.testing.processes import free_port
from core.tools.connectors import Connectors
from core.untrusted import MAIL_LABEL
from core.vault import Vault, generate_key

from .support import Caller
from .test_connect import cli, private_hosts  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not available(), reason="dovecot-imapd is not installed (scripts/test installs it)")

PASSWORD = "imap-s3cret"


def mail(n: int, sender: str, subject: str, text: str, *, refs: str = "", day: int = 27) -> bytes:
    thread = f"In-Reply-To: {refs.split()[-1]}\r\nReferences: {refs}\r\n" if refs else ""
    return (
        f"From: {sender}\r\nTo: ada@example.com\r\nSubject: {subject}\r\nMessage-ID: <m{n}@mail.test>\r\n"
        f"Date: Thu, {day} Mar 2025 0{n % 10}:00:00 +0000\r\n{thread}"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n"
    ).encode()


@pytest.fixture(scope="module")
def dovecot(tmp_path_factory):
    with DovecotServer(tmp_path_factory.mktemp("dovecot"), {"ada": PASSWORD}) as server:
        server.deliver("ada", mail(1, "Bank <alerts@bank.example>", "Statement", "Your March statement is ready."))
        server.deliver("ada", mail(2, "Sam <sam@example.org>", "Lunch?", "Lunch on Friday?"), seen=True)
        server.deliver(
            "ada", mail(3, "Ada <ada@example.com>", "Re: Lunch?", "Yes, 12:30.\n\n> Lunch on Friday?",
                        refs="<m2@mail.test>"),
            seen=True,
        )  # fmt: skip
        server.deliver("ada", mail(4, "Kid's school <office@school.example>", "Trip", "Slip due Monday.", day=20))
        yield server


async def connect(env: dict[str, str], port: int, *extra: str) -> tuple[int, str]:
    argv = ("connect", "imap", "Ada", "--host", "127.0.0.1", "--port", str(port), "--user", "ada", *extra)
    return await asyncio.to_thread(cli, env, *argv)


@pytest.mark.usefixtures("private_hosts")
async def test_pepper_connect_imap_checks_then_stores_once_sealed(db, db_url, dovecot, capsys):
    await identity.create_account(db, "Ada", timezone="Europe/Paris")
    key = generate_key()
    env = {"DATABASE_URL": db_url, "PEPPER_SECRET_KEY": key, "PEPPER_IMAP_PASSWORD": "wrong"}
    code, _ = await connect(env, dovecot.port, "--security", "none")
    err = capsys.readouterr().err
    assert code == 1 and "refused the user name or password for ada" in err and "Traceback" not in err
    assert await db.fetchval("SELECT count(*) FROM connections") == 0
    # Garbage settings: each a clear error, nothing stored, no sign-in tried.
    env["PEPPER_IMAP_PASSWORD"] = PASSWORD
    for extra, said in (
        (("--security", "none", "--name", "../../etc"), "name the mailbox"),
        (("--security", "none", "--port", "0"), "is not a port"),
    ):
        code, _ = await connect(env, dovecot.port, *extra)
        err = capsys.readouterr().err
        assert code == 1 and said in err and "Traceback" not in err, err
    code, _ = await asyncio.to_thread(cli, env, "connect", "imap", "Ada", "--host", "bad host!", "--user", "ada")
    assert code == 1 and "is not a host name" in capsys.readouterr().err

    # Something that is not an IMAP server (it greets as a web server would), and nothing listening.
    async def not_imap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    impostor = await asyncio.start_server(not_imap, "127.0.0.1", 0)
    async with impostor:
        code, _ = await connect(env, impostor.sockets[0].getsockname()[1], "--security", "none")
    err = capsys.readouterr().err
    assert code == 1 and "did not answer" in err and "Traceback" not in err, err
    code, _ = await connect(env, free_port(), "--security", "none")
    assert code == 1 and "did not answer" in capsys.readouterr().err
    assert await db.fetchval("SELECT count(*) FROM connections") == 0

    code, out = await connect(env, dovecot.port, "--security", "none", "--name", "home")
    assert code == 0 and "connected IMAP mailbox 'home'" in out and "holds 4 message(s)" in out, out
    # Connecting again (another name, same mailbox) is the same connection, updated.
    code, out = await connect(env, dovecot.port, "--security", "none", "--name", "again")
    assert code == 0 and "updated the already connected" in out, out
    [row] = await db.fetch("SELECT * FROM connections")
    assert row["provider"] == "imap" and row["label"] == "home" and row["secret"] == "{}"
    assert PASSWORD.encode() not in row["sealed"]
    assert PASSWORD not in await db.fetchval("SELECT string_agg(c::text, '') FROM connections c")
    code, out = await asyncio.to_thread(cli, env, "connect", "list", "--account", "Ada")
    assert "IMAP mailbox: home (read-only)  [sealed]" in out, out
    # pepper doctor --online signs in to it (and keeps nothing).
    _, out = await asyncio.to_thread(cli, env, "doctor", "--online")
    assert "online: IMAP mailbox home" in out and "signs in; INBOX holds 4 message(s)" in out, out


async def test_a_real_server_sends_the_password_only_over_tls_and_to_public_hosts(db, owner):
    from core.errors import InvalidInput
    from core.tools.areas.mail import connect_imap

    strict = Connectors(vault=Vault(generate_key()))
    for host, security, said in (("imap.example.org", "none", "only over TLS"), ("127.0.0.1", "ssl", "private")):
        with pytest.raises(InvalidInput) as refused:
            await connect_imap(db, strict, owner.id, "x", host=host, port=None, username="a", password="b",
                               security=security)  # fmt: skip
        assert said in refused.value.message
    assert await db.fetchval("SELECT count(*) FROM connections") == 0


@pytest.fixture
async def mailbox(db, owner, connectors, dovecot):
    from core.tools.areas.mail import connect_imap

    await connect_imap(
        db, connectors, owner.id, "home", host="127.0.0.1", port=dovecot.port, username="ada", password=PASSWORD,
        security="none",
    )  # fmt: skip
    return Caller(db, owner, connectors)


@pytest.fixture
def connectors() -> Connectors:
    return Connectors(allow_private_hosts=True, http_timeout=5.0, vault=Vault(generate_key()))


async def test_the_mail_tools_read_imap_with_the_translated_query(mailbox):
    session = await mailbox.session()
    assert {"imap", "mailbox"} <= session.connections and "gmail_read" not in session.connections
    out = await mailbox("mail_search", {"query": "from:bank statement"})
    assert out.status == "ok", out.content
    assert "Checked: IMAP home (1 matched), Pepper's inbox (0 matched)" in out.content
    assert f"[email read from IMAP home; {MAIL_LABEL}]" in out.content
    assert 'From: "Bank <alerts@bank.example>"' in out.content and "Lunch" not in out.content
    unread = await mailbox("mail_list_unread", {"days": 30})
    assert "Statement" in unread.content and "Trip" in unread.content and "Lunch" not in unread.content
    recent = await mailbox("mail_search", {"query": "after:2025/03/25 is:unread"})
    assert "Statement" in recent.content and "Trip" not in recent.content
    [ref] = [line.split('"')[1] for line in (await mailbox("mail_search", {"query": "subject:Lunch"})).content
             .splitlines() if line.startswith("Thread:") and "Re:" not in line][:1]  # fmt: skip
    thread = await mailbox("mail_read_thread", {"thread": ref})
    assert thread.status == "ok" and "2 message(s)" in thread.content, thread.content
    assert thread.content.index("Lunch on Friday?") < thread.content.index("Yes, 12:30.")
    summary = await mailbox("mail_summarise_thread", {"thread": ref})
    assert "ada@example.com, sam@example.org" in summary.content
    # Reading marked nothing read: the bank's mail is still unread.
    again = await mailbox("mail_list_unread", {"days": 30})
    assert "Statement" in again.content


async def test_a_mailbox_that_stops_answering_is_named_not_empty(mailbox, db):
    await db.execute(
        "UPDATE connections SET config = jsonb_set(config, '{port}', to_jsonb($1::int)) WHERE provider = 'imap'",
        free_port(),
    )
    out = await mailbox("mail_search", {"query": "from:nobody"})
    assert out.status == "ok" and "found nothing" not in out.content.lower()
    assert "NOT checked, failed: IMAP home (the IMAP server 127.0.0.1" in out.content


async def test_the_settings_page_connects_a_mailbox_and_refuses_garbage_a_forgery_and_a_wrong_password(
    db, db_url, dovecot
):
    import dataclasses
    import json

    import aiohttp
    from web_app_support import PASSWORD as WEB_PASSWORD
    from web_app_support import web_app

    async with web_app(db, db_url) as app:
        harness = app.services.harness
        harness.connectors = dataclasses.replace(harness.connectors, allow_private_hosts=True)  # Dovecot on loopback
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as web:
            async with web.post(app.base + "/chat/login", data={"login": "ada", "password": WEB_PASSWORD}):
                pass
            async with web.get(app.base + "/api/session") as response:
                csrf = {"X-CSRF-Token": (await response.json())["csrf_token"], "Content-Type": "application/json"}
            async with web.get(app.base + "/settings") as response:
                page = await response.text()
            assert 'data-post="/api/connections/imap"' in page and 'type="password"' in page

            async def connect(body: object, headers: dict[str, str] = csrf) -> tuple[int, dict]:
                data = body if isinstance(body, bytes) else json.dumps(body)
                async with web.post(app.base + "/api/connections/imap", data=data, headers=headers) as response:
                    return response.status, await response.json()

            mailbox = {"host": "127.0.0.1", "port": str(dovecot.port), "username": "ada", "security": "none"}
            # Garbage, a forgery, a wrong password: each refused with a clear message, nothing stored.
            assert (await connect(b"\xff{not json"))[0] == 400
            assert (await connect({"host": "127.0.0.1"}))[1]["error"] == "bad-mailbox"
            assert (await connect({**mailbox, "password": PASSWORD, "account": "bob"}))[0] == 400
            assert (await connect({**mailbox, "password": PASSWORD, "port": "99999x"}))[1]["error"] == "bad-port"
            assert (await connect({**mailbox, "password": ["x"]}))[0] == 400
            assert (await connect({**mailbox, "password": PASSWORD, "host": "bad host!"}))[1]["message"] == (
                "'bad host!' is not a host name"
            )
            forged = {**csrf, "X-CSRF-Token": "forged"}
            assert (await connect({**mailbox, "password": PASSWORD}, forged))[0] == 403
            status, said = await connect({**mailbox, "password": "wrong"})
            assert status == 400 and said["error"] == "login-refused" and "ada" in said["message"]
            assert await db.fetchval("SELECT count(*) FROM connections") == 0

            status, said = await connect({**mailbox, "password": PASSWORD, "label": "home"})
            assert status == 200 and said["created"] is True and said["messages"] == 4, said
            # The same mailbox again (a double click): updated, still one connection.
            status, said = await connect({**mailbox, "password": PASSWORD, "label": "home"})
            assert status == 200 and said["created"] is False and said["message"].startswith("Updated")
            [row] = await db.fetch("SELECT provider, label, sealed FROM connections")
            assert row["provider"] == "imap" and row["label"] == "home" and PASSWORD.encode() not in row["sealed"]
            async with web.get(app.base + "/settings") as response:
                assert "IMAP mailbox (home): read-only" in await response.text()
