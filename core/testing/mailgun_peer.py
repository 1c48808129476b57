"""A loopback mail provider for tests: builds Mailgun route forms and signs them as Mailgun does.

    mailgun = MailgunPeer(signing_key="...")
    form = mailgun.inbound(sender="ada@example.org", recipient="pepper@assistant.example",
                           subject="Dinner", text="Are we still on for Friday?")
    status, body = await mailgun.post(app_url, form)

The signature is hex HMAC-SHA256 over ``timestamp + token`` under the webhook signing key
(``wire-protocols.md`` §9.1). By default the form carries passing DKIM and SPF verdicts aligned
with the From domain, as Mailgun reports them for genuine mail: its own headers first in
``message-headers`` (``X-Mailgun-Dkim-Check-Result``, ``X-Mailgun-Spf``, ``X-Envelope-From``, its
``Received``), then the sender's, and each header also as a form field of its own. An empty
verdict leaves that header out, as Mailgun does (no DKIM verdict for an unsigned mail).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any

import aiohttp


def new_message_id(domain: str = "mail.example.org") -> str:
    return f"<{secrets.token_hex(12)}@{domain}>"


class MailgunPeer:
    path = "/email/inbound"

    def __init__(self, signing_key: str) -> None:
        self.signing_key = signing_key

    def signature(self, timestamp: str, token: str) -> str:
        return hmac.new(self.signing_key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()

    def sign(self, form: dict[str, Any], *, timestamp: int | None = None, token: str | None = None) -> dict[str, Any]:
        """``form`` with a fresh ``timestamp``, ``token`` (50 characters, as Mailgun's) and ``signature``."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        token = token or secrets.token_hex(25)
        return {**form, "timestamp": stamp, "token": token, "signature": self.signature(stamp, token)}

    def inbound(
        self,
        *,
        sender: str,
        recipient: str,
        subject: str = "",
        text: str | None = None,
        html: str | None = None,
        stripped_text: str | None = None,
        message_id: str | None = None,
        in_reply_to: str | None = None,
        references: str | None = None,
        sender_name: str = "",
        dkim: str | None = "Pass",
        spf: str | None = "Pass",
        headers: list[tuple[str, str]] | None = None,
        signed: bool = True,
    ) -> dict[str, Any]:
        """A parsed-message form as a Mailgun route posts it (``body-plain`` only when ``text`` given)."""
        domain = sender.rsplit("@", 1)[-1]
        from_header = f"{sender_name} <{sender}>" if sender_name else sender
        message_id = message_id or new_message_id(domain)
        verdicts = [
            (name, value) for name, value in (("X-Mailgun-Dkim-Check-Result", dkim), ("X-Mailgun-Spf", spf)) if value
        ]
        pairs: list[tuple[str, str]] = [
            *verdicts,
            ("X-Mailgun-Incoming", "Yes"),
            ("X-Envelope-From", f"<{sender}>"),
            ("Received", f"from mail.{domain} by mxa.mailgun.org with ESMTP"),
            ("From", from_header),
            ("To", recipient),
            ("Subject", subject),
            ("Message-Id", message_id),
            ("DKIM-Signature", f"v=1; a=rsa-sha256; c=relaxed/relaxed; d={domain}; s=s1; h=from:to:subject; b=AAAA"),
        ]
        if in_reply_to:
            pairs.append(("In-Reply-To", in_reply_to))
        if references:
            pairs.append(("References", references))
        pairs += headers or []
        form: dict[str, Any] = {
            "recipient": recipient,
            "sender": sender,
            "from": from_header,
            "subject": subject,
            "Message-Id": message_id,
            **dict(verdicts),
            "message-headers": json.dumps([list(p) for p in pairs]),
        }
        if in_reply_to:
            form["In-Reply-To"] = in_reply_to
        if references:
            form["References"] = references
        if text is not None:
            form["body-plain"] = text
        if stripped_text is not None:
            form["stripped-text"] = stripped_text
        if html is not None:
            form["body-html"] = html
        return self.sign(form) if signed else form

    async def post(
        self, base_url: str, form: dict[str, Any], *, session: aiohttp.ClientSession | None = None
    ) -> tuple[int, str]:
        """POST ``form`` to the app's inbound route as Mailgun would; returns (status, body)."""
        own = session is None
        session = session or aiohttp.ClientSession()
        try:
            async with session.post(base_url + self.path, data=form) as response:
                return response.status, await response.text()
        finally:
            if own:
                await session.close()
