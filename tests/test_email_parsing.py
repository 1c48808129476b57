"""The email channel's pure parts: the signature, reading a Mailgun form, quotes, HTML, threading."""

from __future__ import annotations

import json
import time

import pytest
from werkzeug.datastructures import MultiDict

from core.errors import InvalidInput
from core.mailtext import html_to_text, strip_quoted
from core.settings import Settings
from core.testing.mailgun_peer import MailgunPeer
from gateway.email_channel import (
    MAX_REFERENCES,
    build_reply,
    fresh,
    parse_inbound,
    reply_subject,
    sender_authenticated,
    sender_problem,
    signature_ok,
)

KEY = "key-123"
peer = MailgunPeer(KEY)


def test_the_signature_is_mailguns_hmac_over_timestamp_and_token():
    settings = Settings(email_webhook_signing_key=KEY)
    form = peer.sign({})
    assert signature_ok(settings, form["timestamp"], form["token"], form["signature"])
    assert signature_ok(settings, form["timestamp"], form["token"], form["signature"].upper())
    assert not signature_ok(settings, form["timestamp"], form["token"] + "x", form["signature"])
    assert not signature_ok(settings, str(int(form["timestamp"]) + 1), form["token"], form["signature"])
    assert not signature_ok(settings, form["timestamp"], form["token"], "é" * 64)
    assert not signature_ok(Settings(), form["timestamp"], form["token"], form["signature"])


def test_freshness_allows_a_few_minutes_either_way():
    now = time.time()
    assert fresh(str(int(now) - 290), now) and fresh(str(int(now) + 60), now)
    assert not fresh(str(int(now) - 301), now) and not fresh(str(int(now) + 301), now)
    assert not fresh("yesterday", now) and not fresh("", now)


def test_a_form_is_read_into_the_mail_the_person_sent():
    form = peer.inbound(
        sender="Ada@Example.org", sender_name="Ada", recipient="Pepper <pepper@assistant.example>",
        subject="  Dinner   plans ", text="full text\n> quoted", stripped_text="just this",
        in_reply_to="<a@x>", references="<root@x>\n <a@x>",
    )  # fmt: skip
    mail = parse_inbound(form)
    assert (mail.sender, mail.sender_name, mail.recipient) == ("ada@example.org", "Ada", "pepper@assistant.example")
    assert mail.subject == "Dinner plans" and mail.text == "just this"
    assert mail.message_id == form["Message-Id"] and not mail.message_id_derived
    assert mail.in_reply_to == "<a@x>" and mail.references == ("<root@x>", "<a@x>")
    assert mail.body() == "Subject: Dinner plans\n\njust this"
    assert not mail.automatic


def test_headers_fall_back_to_message_headers_and_a_missing_message_id_is_derived_stably():
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="hi", message_id="<m1@x>")
    del form["Message-Id"]
    assert parse_inbound(form).message_id == "<m1@x>"  # from message-headers
    form["message-headers"] = "not json"
    first, again = parse_inbound(form), parse_inbound(dict(form, token="other"))
    assert first.message_id_derived and first.message_id == again.message_id
    assert first.message_id != parse_inbound(dict(form, **{"body-plain": "other text"})).message_id


def test_bad_forms_say_what_is_wrong():
    with pytest.raises(InvalidInput, match="From"):
        parse_inbound({"recipient": "p@a.example"})
    with pytest.raises(InvalidInput, match="not an email address"):
        parse_inbound({"from": "Ada <ada@localhost>", "recipient": "p@a.example"})
    with pytest.raises(InvalidInput, match="recipient"):
        parse_inbound({"from": "ada@example.org"})


def test_attachments_are_named_not_lost():
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="see attached")
    form["attachment-count"] = "2"
    assert parse_inbound(form).body().endswith("[Attachments not read: unnamed, unnamed]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes, Friday.\n\nOn Mon, 3 Mar 2025 at 10:00, Pepper <p@a.example> wrote:\n> Friday?", "Yes, Friday."),
        ("Yes.\n\nOn Mon, 3 Mar 2025 at 10:00 Pepper <\np@a.example> wrote:\n> Friday?", "Yes."),
        ("Sure\n-----Original Message-----\nFrom: Pepper", "Sure"),
        ("Sure\n\nFrom: Pepper <p@a.example>\nSent: Monday\nSubject: x\n\nold", "Sure"),
        ("Top\n> quoted line\nBottom", "Top\nBottom"),
        ("Thanks\n-- \nAda Lovelace\nAnalytical Engines Ltd", "Thanks"),
        ("> everything is quoted", "> everything is quoted"),  # never cut to nothing
        ("From: the article, I gather\nthat it works.", "From: the article, I gather\nthat it works."),
    ],
)
def test_quoted_replies_and_signatures_are_cut(text: str, expected: str):
    assert strip_quoted(text) == expected


def test_html_becomes_readable_text():
    html = (
        "<html><head><title>t</title><script>alert(1)</script></head><body><h1>Plan</h1>"
        "<p>Book the <a href='https://x.example'>restaurant</a> &amp; the taxi.</p>"
        "<table><tr><td>Fri</td><td>7pm</td></tr></table><img src='x.png' alt='logo'>"
        "<blockquote type='cite'>old thread</blockquote></body></html>"
    )
    text = html_to_text(html)
    assert "Plan" in text and "Book the restaurant & the taxi." in text
    assert "Fri" in text and "7pm" in text
    assert "alert" not in text and "old thread" not in text and "https://x.example" not in text
    assert "old thread" in html_to_text(html, drop_quotes=False)
    assert html_to_text("") == "" and html_to_text("   ") == ""


def _auth(dkim: str, spf: str, d: str, envelope: str, sender: str = "ada@example.org") -> bool:
    form = peer.inbound(sender=sender, recipient="p@a.example", text="x", dkim=dkim, spf=spf)
    form["message-headers"] = f'[["DKIM-Signature", "v=1; a=rsa-sha256; d={d}; s=s1; b=AAA"]]'
    form["sender"] = envelope  # the envelope sender Mailgun saw in the SMTP chat
    return sender_authenticated(form, sender)


def test_the_sender_must_be_authenticated_for_the_from_domain():
    assert _auth("Pass", "Fail", "example.org", "bounce@other.example")  # aligned DKIM
    assert _auth("Pass", "", "mail.example.org", "")  # relaxed alignment
    assert _auth("Fail", "Pass", "x.example", "ada@example.org")  # aligned SPF
    assert not _auth("Pass", "Fail", "evil.example", "ada@example.org")  # DKIM for another domain
    assert not _auth("Fail", "Pass", "example.org", "bounce@evil.example")  # SPF for another domain
    assert not _auth("Fail", "SoftFail", "example.org", "ada@example.org")
    assert not _auth("", "", "example.org", "ada@example.org")  # no verdict is no proof
    assert not _auth("Pass", "Fail", "org", "bounce@other.example")  # a bare TLD never aligns
    assert not _auth("Pass", "Fail", "evil.example.org", "", sender="ada@mail.example.org")  # siblings do not


EVIL_SIGNATURE = "v=1; a=rsa-sha256; d=evil.example; s=s1; h=from:to:subject; b=VALID"
FORGED_SIGNATURE = "v=1; a=rsa-sha256; d=example.org; s=s1; h=from:to:subject; b=FORGED"
FORGED_RESULTS = [
    ("Authentication-Results", "mx.mailgun.org; dkim=pass header.d=example.org; spf=pass smtp.mailfrom=example.org"),
    ("Authentication-Results", "mxa.mailgun.org; dmarc=pass header.from=example.org"),
    ("Received-SPF", "pass (mailgun.org: domain of ada@example.org designates 203.0.113.9 as permitted sender)"),
]


def _forged(pairs: list[tuple[str, str]], **fields: str) -> dict:
    """Mail from an attacker's server claiming Ada's From address: the envelope is the attacker's."""
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="x", dkim=None, spf=None)
    form["sender"] = "bounce@evil.example"
    form["message-headers"] = json.dumps([list(p) for p in pairs])
    return form | fields


def test_headers_the_sender_wrote_never_prove_the_from_address():
    # Mailgun's verdict is Pass (the attacker's own signature verifies) and SPF passed for the
    # attacker's envelope; a second, forged signature names Ada's domain.
    two_signatures = _forged(
        [("X-Mailgun-Dkim-Check-Result", "Pass"), ("X-Mailgun-Spf", "Pass"), ("DKIM-Signature", EVIL_SIGNATURE),
         ("DKIM-Signature", FORGED_SIGNATURE), *FORGED_RESULTS],
        **{"X-Mailgun-Dkim-Check-Result": "Pass", "X-Mailgun-Spf": "Pass", "DKIM-Signature": FORGED_SIGNATURE},
    )  # fmt: skip
    assert not sender_authenticated(two_signatures, "ada@example.org")
    # No verdict from the provider at all: verdict headers, Authentication-Results and
    # Received-SPF inside the mail are the sender's words and are not read.
    in_the_mail = [
        ("X-Mailgun-Dkim-Check-Result", "Pass"), ("X-Mailgun-Spf", "Pass"), ("DKIM-Signature", FORGED_SIGNATURE),
        *FORGED_RESULTS,
    ]  # fmt: skip
    no_verdict = _forged(in_the_mail, sender="ada@example.org")
    assert sender_problem(no_verdict, "ada@example.org") == "the provider reported no DKIM or SPF verdict"
    # The sender wrote its own "X-Mailgun-Spf: Pass" under Mailgun's "Fail": two verdicts, none counts.
    second_verdict = _forged(
        [("X-Mailgun-Spf", "Fail"), ("From", "ada@example.org"), ("X-Mailgun-Spf", "Pass")],
        sender="ada@example.org", **{"X-Mailgun-Spf": "Pass"},
    )  # fmt: skip
    assert not sender_authenticated(second_verdict, "ada@example.org")
    both_fields = MultiDict(list(_forged([], sender="ada@example.org").items()))
    both_fields.add("X-Mailgun-Spf", "Fail")
    both_fields.add("x-mailgun-spf", "Pass")
    assert not sender_authenticated(both_fields, "ada@example.org")
    # The same mail with Mailgun's one verdict, for the one signature Ada's server made, is proof.
    genuine = _forged(
        [("X-Mailgun-Dkim-Check-Result", "Pass"), ("DKIM-Signature", FORGED_SIGNATURE)],
        **{"X-Mailgun-Dkim-Check-Result": "Pass"},
    )  # fmt: skip
    assert sender_authenticated(genuine, "ada@example.org")


def test_reply_subjects_and_references():
    assert reply_subject("Dinner") == "Re: Dinner"
    assert reply_subject("RE: Dinner") == "RE: Dinner"
    assert reply_subject("") == "Re: your message"
    refs = " ".join(f"<{i}@x>" for i in range(40))
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="x", references=refs)
    reply = build_reply(parse_inbound(form), "ok", from_name="Pepper", from_address="p@a.example", owner="o@x.example")
    chain = reply["References"].split()
    assert len(chain) == MAX_REFERENCES and chain[0] == "<0@x>" and chain[-1] == form["Message-Id"]
    assert reply["In-Reply-To"] == form["Message-Id"] and reply["Cc"] == "o@x.example"


def test_a_mail_without_its_own_message_id_is_not_threaded_to_a_made_up_one():
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="x")
    del form["Message-Id"]
    form["message-headers"] = "[]"
    reply = build_reply(parse_inbound(form), "ok", from_name="Pepper", from_address="p@a.example", owner="o@x")
    assert reply["In-Reply-To"] is None and reply["References"] is None


@pytest.mark.parametrize(
    "headers",
    [[("Auto-Submitted", "auto-replied")], [("Precedence", "bulk")], [("List-Id", "<x.lists.example>")]],
)
def test_automatic_mail_is_recognised(headers):
    form = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="x", headers=headers)
    assert parse_inbound(form).automatic
    no = peer.inbound(sender="ada@example.org", recipient="p@a.example", text="x", headers=[("Auto-Submitted", "no")])
    assert not parse_inbound(no).automatic
