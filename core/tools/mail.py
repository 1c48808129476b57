"""Outgoing mail shared by the email and calendar areas: who may receive, and Pepper's SMTP account.

Recipient rule: every address of a real send must be one Pepper can verify, meaning one of the
person's own *verified* email handles or an address on one of their contacts as the contacts
stood before the current turn. Contact writes are staged (they commit when the reply that reports
them is delivered), and an address a contact write of the current turn names does not count even
once committed (a call commits its writes as the caller hears them): a model talked into adding
or changing a contact cannot send to it in the same turn. Anything else is refused by the caller,
never guessed or corrected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from uuid import UUID

import aiosmtplib

from core.errors import InvalidInput, PepperError
from core.identity import normalize_email
from core.store.queries import Queries
from core.tools.connectors import Connectors

log = logging.getLogger(__name__)


class MailError(PepperError):
    """A send that failed. ``maybe_sent``: the server may have taken the mail before the failure
    (the connection broke or timed out after it was opened); otherwise it surely did not."""

    code = "mail-failed"
    maybe_sent = False


def clean_addresses(raw: Iterable[str]) -> list[str]:
    """Lower-cased, de-duplicated addresses in the order given; ``InvalidInput`` names a bad one."""
    out: list[str] = []
    for value in raw:
        try:
            address = normalize_email(value)
        except InvalidInput as exc:
            raise InvalidInput(f"{value.strip()!r} is not an email address") from exc
        if address not in out:
            out.append(address)
    return out


async def owner_emails(db: Queries, account_id: UUID) -> list[str]:
    """The person's own email handles, verified ones first."""
    rows = await db.fetch(
        "SELECT value FROM handles WHERE account_id = $1 AND kind = 'email'"
        " ORDER BY verified_at IS NULL, verified_at, created_at",
        account_id,
    )
    return [r["value"] for r in rows]


CONTACT_WRITES = ("add_contact", "update_contact")


async def unverifiable(db: Queries, account_id: UUID, addresses: Sequence[str], turn_id: UUID | None) -> list[str]:
    """The addresses that are neither the person's verified handles nor on one of their contacts.

    ``turn_id`` is the turn asking: an address that one of its own contact writes names (staged,
    committed or not) is not verifiable in it.
    """
    if not addresses:
        return []
    rows = await db.fetch(
        """
        SELECT a FROM unnest($2::text[]) AS a
        WHERE NOT EXISTS (SELECT 1 FROM handles h WHERE h.account_id = $1 AND h.kind = 'email' AND h.value = a
                          AND h.verified_at IS NOT NULL)
          AND (NOT EXISTS (SELECT 1 FROM contacts c WHERE c.account_id = $1 AND a = ANY(c.emails))
               OR EXISTS (SELECT 1 FROM staged_writes s WHERE s.turn_id = $3 AND s.tool = ANY($4::text[])
                          AND s.payload -> 'emails' ? a))
        """,
        account_id,
        list(addresses),
        turn_id,
        list(CONTACT_WRITES),
    )
    bad = {r["a"] for r in rows}
    return [a for a in addresses if a in bad]


def build_message(
    *,
    from_address: str,
    from_name: str,
    to: Sequence[str],
    cc: Sequence[str],
    subject: str,
    body: str,
    message_id: str | None = None,
    calendar: bytes | None = None,
    calendar_method: str = "REQUEST",
) -> EmailMessage:
    message = EmailMessage()
    message["From"] = formataddr((from_name, from_address))
    message["To"] = ", ".join(to)
    if cc:
        message["Cc"] = ", ".join(cc)
    message["Subject"] = subject
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = message_id or make_msgid(domain=from_address.rsplit("@", 1)[-1])
    message.set_content(body)
    if calendar is not None:
        message.add_alternative(calendar.decode("utf-8"), subtype="calendar", params={"method": calendar_method})
    return message


async def send_smtp(connectors: Connectors, message: EmailMessage) -> None:
    """Send through Pepper's SMTP account. Raises ``MailError`` (retryable for transient faults)."""
    if not connectors.smtp_configured:
        raise MailError("Pepper's own mail account is not configured", retryable=False)
    try:
        await aiosmtplib.send(
            message,
            hostname=connectors.smtp_host,
            port=connectors.smtp_port,
            username=connectors.smtp_username,
            password=connectors.smtp_password,
            use_tls=connectors.smtp_security == "tls",
            start_tls=True if connectors.smtp_security == "starttls" else False,
            timeout=connectors.http_timeout,
        )
    except aiosmtplib.SMTPRecipientsRefused as exc:
        raise MailError("the mail server refused a recipient", retryable=False) from exc
    except aiosmtplib.SMTPResponseException as exc:
        log.warning("smtp send refused: code=%s", exc.code)
        raise MailError(
            f"the mail server refused the message ({exc.code})", retryable=exc.code >= 400 and exc.code < 500
        ) from exc
    except (aiosmtplib.SMTPException, OSError) as exc:
        log.warning("smtp send failed: error=%s", type(exc).__name__)
        error = MailError("the mail server could not be reached", retryable=True)
        error.maybe_sent = not isinstance(exc, (aiosmtplib.SMTPConnectError, ConnectionRefusedError))
        raise error from exc
