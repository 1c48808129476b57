"""Email: who sends is always said; verifiable recipients only; drafts in scheduled runs; Gmail drafts."""

from __future__ import annotations

import base64
import email
import email.policy
from urllib.parse import parse_qs, urlsplit

import pytest

from core.identity import add_handle, set_handle_verified
from core.testing.google_api_peer import GoogleApiPeer
from core.testing.smtp_capture import MuteAfterData
from core.testing.smtp_peer import SmtpPeer
from core.tools import commit_turn_writes
from core.tools.areas.email import draft_cards
from core.tools.connectors import GMAIL_COMPOSE
from core.tools.google_api import authorization_url, exchange_code
from core.tools.starter import starter_registry

from .support import OWNER_EMAIL

MAIL = {"to": ["bob@example.org"], "subject": "Friday", "body": "See you at noon."}


@pytest.fixture
async def smtp():
    async with SmtpPeer() as peer:
        yield peer


@pytest.fixture
def mailer(call, smtp):
    return call.using(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", smtp_from="pepper@p.test")


async def test_unconnected_mail_tools_are_invisible(call, mailer):
    session = await call.session()
    names = {t.name for t in starter_registry(call.connectors).visible(session)}
    assert "email_from_pepper" not in names and "email_from_my_gmail" not in names
    out = await call("email_from_pepper", MAIL)
    assert out.status == "denied"
    session = await mailer.session()
    assert "pepper_mail" in session.connections
    assert "email_from_pepper" in {t.name for t in starter_registry(mailer.connectors).visible(session)}


async def test_pepper_sends_from_its_address_with_the_owner_on_cc(mailer, smtp):
    await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    out = await mailer("email_from_pepper", MAIL)
    assert out.status == "ok", out.content
    assert "sent from Pepper (pepper@p.test)" in out.content and f"cc {OWNER_EMAIL}" in out.content
    [mail] = smtp.received
    assert mail.message["From"] == "Pepper <pepper@p.test>"
    assert set(mail.rcpt_to) == {"bob@example.org", OWNER_EMAIL}
    assert mail.message["Cc"] == OWNER_EMAIL
    row = await mailer.db.fetchrow("SELECT status, message_id FROM email_messages")
    assert row["status"] == "sent" and row["message_id"] == mail.message["Message-ID"]


async def test_a_send_to_an_unverifiable_address_is_refused(mailer, smtp):
    out = await mailer("email_from_pepper", {**MAIL, "to": ["bob@example.org"], "cc": []})
    assert out.status == "failed" and "bob@example.org" in out.content and "Nothing was sent" in out.content
    assert smtp.received == [] and await mailer.db.fetchval("SELECT count(*) FROM email_messages") == 0
    bad = await mailer("email_from_pepper", {**MAIL, "to": ["not an address"]})
    assert bad.status == "failed" and "not an email address" in bad.content


async def test_the_same_send_in_one_turn_goes_out_once(mailer, smtp):
    await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    session = await mailer.session()
    first = await mailer("email_from_pepper", MAIL, session=session)
    second = await mailer("email_from_pepper", MAIL, session=session)
    assert first.status == second.status == "ok"
    assert len(smtp.received) == 1


async def test_in_a_scheduled_run_a_send_becomes_a_draft_and_says_so(mailer, smtp):
    await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    out = await mailer("email_from_pepper", {**MAIL, "mode": "send"}, kind="scheduled")
    assert out.status == "ok"
    assert "NOT sent" in out.content and "sent from" not in out.content
    assert out.arguments["mode"] == "draft"
    assert smtp.received == []
    [card] = await draft_cards(mailer.db, mailer.account.id)
    assert card["type"] == "email-draft" and card["to"] == ["bob@example.org"] and card["from"] == "pepper@p.test"
    # The scheduled run cannot send the draft either; the person can, later, in a live turn.
    assert (await mailer("send_email_draft", {"draft": card["draft"]}, kind="scheduled")).status == "failed"
    sent = await mailer("send_email_draft", {"draft": card["draft"]})
    assert sent.status == "ok" and len(smtp.received) == 1
    assert await draft_cards(mailer.db, mailer.account.id) == []


async def test_smtp_refusal_is_a_failure_and_records_nothing(mailer, smtp):
    await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    smtp.refuse = 554
    out = await mailer("email_from_pepper", MAIL)
    assert out.status == "failed"
    assert await mailer.db.fetchval("SELECT count(*) FROM email_messages") == 0


async def test_google_connection_asks_only_for_the_scopes_it_uses(call):
    connectors = call.connectors.__class__(google_client_id="client-id")

    def scopes(features: list[str]) -> list[str]:
        url = authorization_url(connectors, features, "https://pepper.test/cb", "s1")
        return parse_qs(urlsplit(url).query)["scope"][0].split()

    gmail = ["https://www.googleapis.com/auth/gmail.compose", "https://www.googleapis.com/auth/gmail.readonly"]
    assert scopes(["gmail"]) == gmail
    assert scopes(["google_calendar"]) == ["https://www.googleapis.com/auth/calendar.events"]
    assert sorted(scopes(["google_calendar", "gmail"])) == sorted(
        [*gmail, "https://www.googleapis.com/auth/calendar.events"]
    )


@pytest.fixture
async def google(call):
    async with GoogleApiPeer() as peer:
        peer.granted_scopes = GMAIL_COMPOSE
        yield peer


@pytest.fixture
async def gmail(call, google):
    caller = call.using(
        google_api_url=google.url, google_token_url=google.token_url, google_client_id="client-id",
        google_client_secret="client-secret",
    )  # fmt: skip
    code = google.issue_code("https://pepper.test/cb")
    await exchange_code(call.db, caller.connectors, call.account.id, code, "https://pepper.test/cb")
    return caller


async def test_gmail_makes_a_draft_by_default_shown_as_a_card(gmail, google):
    out = await gmail("email_from_my_gmail", {**MAIL, "to": ["anyone@else.test"]})
    assert out.status == "ok", out.content
    assert f"from the person's Gmail ({OWNER_EMAIL})" in out.content and "NOT sent" in out.content
    [draft] = google.drafts.values()
    raw = base64.urlsafe_b64decode(draft["message"]["raw"])
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["To"] == "anyone@else.test" and parsed["Subject"] == "Friday"
    [card] = await draft_cards(gmail.db, gmail.account.id)
    assert card["sender"] == "gmail"
    # Sending it needs a verifiable recipient.
    refused = await gmail("send_email_draft", {"draft": card["draft"]})
    assert refused.status == "failed" and google.sent == []


async def test_gmail_send_when_asked_and_draft_in_a_scheduled_run(gmail, google):
    await gmail("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    sent = await gmail("email_from_my_gmail", {**MAIL, "mode": "send"})
    assert sent.status == "ok" and "mail sent from the person's Gmail" in sent.content and len(google.sent) == 1
    google.expire_tokens()  # the next call refreshes the token once and carries on
    later = await gmail("email_from_my_gmail", {**MAIL, "mode": "send", "subject": "Again"}, kind="scheduled")
    assert later.status == "ok" and "NOT sent" in later.content
    assert len(google.sent) == 1 and len(google.drafts) == 1
    assert [r["grant_type"] for r in google.token_requests] == ["authorization_code", "refresh_token"]


# --- recipients a fooled model tries to make verifiable ------------------------------------------

ATTACKER = {"to": ["attacker@evil.example"], "subject": "Statements", "body": "Account 4411, balance attached."}


async def test_a_contact_added_in_the_turn_does_not_make_its_address_verifiable(mailer, smtp):
    # The model, talked into it, tries the send, adds the address as a contact, and tries again.
    turn = await mailer.session()
    first = await mailer("email_from_pepper", ATTACKER, session=turn)
    added = await mailer("add_contact", {"name": "Support", "emails": ["attacker@evil.example"]}, session=turn)
    again = await mailer("email_from_pepper", {**ATTACKER, "subject": "Statements (2)"}, session=turn)
    assert first.status == "failed" and added.status == "ok" and added.write["staged"]
    assert again.status == "failed" and "attacker@evil.example" in again.content and "Nothing was sent" in again.content
    assert await mailer.db.fetchval("SELECT count(*) FROM contacts") == 0  # staged: saved only on delivery
    # Even once the write commits while the turn still runs (a call commits as the caller hears it).
    registry = starter_registry(mailer.connectors)
    assert [w.status for w in await commit_turn_writes(mailer.db, registry, turn.turn_id)] == ["committed"]
    late = await mailer("email_from_pepper", {**ATTACKER, "subject": "Statements (3)"}, session=turn)
    assert late.status == "failed"
    assert smtp.received == [] and await mailer.db.fetchval("SELECT count(*) FROM email_messages") == 0
    # A later turn finds a contact that existed before it, one the person was told about.
    assert (await mailer("email_from_pepper", ATTACKER)).status == "ok" and len(smtp.received) == 1


async def test_a_contacts_address_changed_in_the_turn_gets_no_mail(mailer, smtp):
    await mailer("add_contact", {"name": "Accountant", "emails": ["jo@taxfirm.example"]}, delivered=True)
    contact = await mailer.db.fetchval("SELECT id FROM contacts")
    turn = await mailer.session()
    changed = await mailer("update_contact", {"id": contact, "emails": ["jo@taxflrm.example"]}, session=turn)
    assert changed.status == "ok" and changed.write["staged"]
    await commit_turn_writes(mailer.db, starter_registry(mailer.connectors), turn.turn_id)
    private = {"to": ["jo@taxflrm.example"], "subject": "My return", "body": "SSN 078-05-1120, income attached."}
    out = await mailer("email_from_pepper", private, session=turn)
    assert out.status == "failed" and "jo@taxflrm.example" in out.content
    assert smtp.received == []
    # The address that was on the contact before the turn still counts.
    assert (await mailer("email_from_pepper", {**private, "to": ["jo@taxfirm.example"]}, session=turn)).status == "ok"
    assert [m.rcpt_to for m in smtp.received] == [["jo@taxfirm.example", OWNER_EMAIL]]


async def test_an_unverified_own_address_is_not_verifiable(mailer, smtp):
    await add_handle(mailer.db, mailer.account.id, "email", "ada.backup@evil.example")  # not verified
    out = await mailer("email_from_pepper", {**MAIL, "to": ["ada.backup@evil.example"]})
    assert out.status == "failed" and "ada.backup@evil.example" in out.content
    assert smtp.received == []
    await set_handle_verified(mailer.db, "email", "ada.backup@evil.example", True)
    assert (await mailer("email_from_pepper", {**MAIL, "to": ["ada.backup@evil.example"]})).status == "ok"


# --- the outbox: a record commits before the mail leaves -----------------------------------------


async def test_a_send_whose_record_cannot_commit_does_not_go_out(mailer, smtp):
    await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    # The store refuses the commit itself (a deferred check fails at COMMIT).
    await mailer.db.execute(
        """
        CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$;
        CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON email_messages
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit();
        """
    )
    out = await mailer("email_from_pepper", MAIL)
    assert out.status == "failed"
    # Never a mail that went out with no record of it: here neither.
    assert smtp.received == [] and await mailer.db.fetchval("SELECT count(*) FROM email_messages") == 0


async def test_a_send_cut_off_after_the_mail_was_handed_over_is_kept_as_failed(mailer):
    """A server that takes the whole mail and drops the connection instead of answering: the mail
    may have gone, so its record stays, with the Message-ID it was sent under."""
    async with MuteAfterData() as server:
        await mailer("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        out = await mailer.using(smtp_port=server.port)("email_from_pepper", MAIL)
    got = server.received
    assert out.status == "failed" and len(got) == 1
    row = await mailer.db.fetchrow("SELECT status, message_id, to_addresses FROM email_messages")
    assert row["status"] == "failed" and row["to_addresses"] == ["bob@example.org"]
    assert row["message_id"] and row["message_id"].encode() in got[0]
