"""Reading one IMAP mailbox with IMAPClient (a maintained client; synchronous, so each call runs
in a worker thread). Read-only: the folder is opened with EXAMINE and bodies are fetched with
``BODY.PEEK[]``, so nothing Pepper reads is marked read, moved or deleted.

Every call opens its own connection and logs out: a turn reads a mailbox a few times at most, and
a connection held between turns would need a keeper for idle timeouts and reconnects.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import imaplib
import ssl
from dataclasses import dataclass
from datetime import UTC, date, datetime
from email.message import EmailMessage
from email.utils import getaddresses, parseaddr, parsedate_to_datetime
from typing import Any

from imapclient import IMAPClient
from imapclient.exceptions import IMAPClientError, LoginError

from core.errors import InvalidInput, PepperError
from core.mailtext import html_to_text

SECURITY = ("ssl", "starttls", "none")
# The most messages one call reads (newest first); a search that matches more says so.
MAX_FETCH = 50
MAX_TEXT = 20_000
# An invitation's iCalendar parts kept per message (for the calendar's detectors): the first few, small ones.
MAX_CALENDAR_PARTS, MAX_CALENDAR_BYTES = 5, 256 * 1024


class ImapError(PepperError):
    code = "imap-error"


class ImapLoginRefused(ImapError):
    code = "imap-login-refused"


@dataclass(frozen=True)
class ImapAccount:
    host: str
    port: int
    username: str
    password: str
    security: str = "ssl"
    timeout: float = 15.0

    def __post_init__(self) -> None:
        if self.security not in SECURITY:
            raise InvalidInput(f"IMAP security must be one of {', '.join(SECURITY)}")


@dataclass(frozen=True)
class Mail:
    """One message as read: headers Pepper shows and its text (HTML turned into text)."""

    uid: int
    message_id: str
    in_reply_to: str
    references: tuple[str, ...]
    sender_name: str
    sender: str
    to: tuple[str, ...]
    subject: str
    sent_at: datetime | None
    text: str
    unread: bool
    calendars: tuple[bytes, ...] = ()  # text/calendar parts and .ics attachments, as sent


@dataclass(frozen=True)
class Criteria:
    """A search in IMAP terms (RFC 3501 SEARCH keys), built by the caller from a query."""

    sender: tuple[str, ...] = ()
    to: tuple[str, ...] = ()
    subject: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    unread: bool | None = None
    since: date | None = None
    before: date | None = None

    def keys(self) -> list[Any]:
        out: list[Any] = []
        for key, values in (("FROM", self.sender), ("TO", self.to), ("SUBJECT", self.subject), ("TEXT", self.words)):
            for value in values:
                out += [key, value]
        if self.unread is True:
            out.append("UNSEEN")
        elif self.unread is False:
            out.append("SEEN")
        if self.since is not None:
            out += ["SINCE", self.since]
        if self.before is not None:
            out += ["BEFORE", self.before]
        return out or ["ALL"]


def parse_mail(uid: int, raw: bytes, flags: tuple[bytes, ...] = ()) -> Mail:
    """A fetched RFC 5322 message as :class:`Mail` (also what tests and other sources use)."""
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    name, address = parseaddr(str(message.get("From", "")))
    try:
        sent_at = parsedate_to_datetime(str(message["Date"])) if message["Date"] else None
        if sent_at is not None and sent_at.tzinfo is None:
            sent_at = sent_at.replace(tzinfo=UTC)
    except (TypeError, ValueError):
        sent_at = None
    return Mail(
        uid=uid,
        message_id=str(message.get("Message-ID", "")).strip(),
        in_reply_to=str(message.get("In-Reply-To", "")).strip(),
        references=tuple(str(message.get("References", "")).split()),
        sender_name=name,
        sender=address.lower(),
        to=tuple(a.lower() for _, a in getaddresses([str(v) for v in message.get_all("To", [])]) if a),
        subject=str(message.get("Subject", "")),
        sent_at=sent_at,
        text=body_text(message),
        unread=b"\\Seen" not in flags,
        calendars=calendar_parts(message),
    )


def calendar_parts(message: EmailMessage) -> tuple[bytes, ...]:
    """The iCalendar parts of a message (``text/calendar``, ``application/ics`` or a ``.ics``
    file), decoded from their transfer encoding: what an invitation carries."""
    out: list[bytes] = []
    for part in message.walk():
        if part.is_multipart() or len(out) >= MAX_CALENDAR_PARTS:
            continue
        kind, name = part.get_content_type(), (part.get_filename() or "").lower()
        if kind not in ("text/calendar", "application/ics") and not name.endswith(".ics"):
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes) and 0 < len(payload) <= MAX_CALENDAR_BYTES:
            out.append(payload)
    return tuple(out)


def body_text(message: EmailMessage) -> str:
    """The message's text: its plain part, else its HTML part as text."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # an unknown charset or a broken encoding
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if part.get_content_type() == "text/html":
        content = html_to_text(content, drop_quotes=False)
    return content.strip()[:MAX_TEXT]


def _why(exc: BaseException) -> str:
    """What went wrong, in Pepper's words: the server's own text (which a model may read in a
    tool result) is left out; a socket error's reason is the operating system's."""
    if isinstance(exc, ssl.SSLError):
        return "the TLS handshake failed"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, TimeoutError):
        return "timed out"
    return "it answered as no IMAP server does"


def _open(account: ImapAccount) -> IMAPClient:
    try:
        client = IMAPClient(
            account.host, port=account.port, ssl=account.security == "ssl", timeout=account.timeout,
            ssl_context=ssl.create_default_context(),
        )  # fmt: skip
        if account.security == "starttls":
            client.starttls(ssl.create_default_context())
    except (OSError, IMAPClientError, imaplib.IMAP4.error) as exc:
        where = f"{account.host}:{account.port}"
        raise ImapError(f"the IMAP server {where} did not answer ({_why(exc)})", retryable=True) from exc
    try:
        client.login(account.username, account.password)
    except LoginError as exc:
        _close(client)
        raise ImapLoginRefused(f"the IMAP server refused the user name or password for {account.username}") from exc
    except (OSError, IMAPClientError, imaplib.IMAP4.error) as exc:
        _close(client)
        raise ImapError(f"the IMAP server {account.host} broke off the sign-in ({_why(exc)})", retryable=True) from exc
    return client


def _close(client: IMAPClient) -> None:
    try:
        client.logout()
    except (OSError, IMAPClientError, imaplib.IMAP4.error):
        try:
            client.shutdown()
        except OSError:
            pass


def _run(account: ImapAccount, work: Any) -> Any:
    client = _open(account)
    try:
        client.select_folder("INBOX", readonly=True)
        return work(client)
    except (OSError, IMAPClientError, imaplib.IMAP4.error) as exc:
        raise ImapError(f"the IMAP server {account.host} failed a request ({_why(exc)})", retryable=True) from exc
    finally:
        _close(client)


def _fetch(client: IMAPClient, uids: list[int]) -> list[Mail]:
    if not uids:
        return []
    found = client.fetch(uids, ["BODY.PEEK[]", "FLAGS"])
    out = []
    for uid in uids:
        data = found.get(uid)
        if data is None:
            continue
        out.append(parse_mail(uid, data[b"BODY[]"], tuple(data.get(b"FLAGS", ()))))
    return out


def _search(account: ImapAccount, criteria: Criteria, limit: int) -> tuple[list[Mail], int]:
    def work(client: IMAPClient) -> tuple[list[Mail], int]:
        uids = sorted(client.search(criteria.keys(), charset="UTF-8"))
        newest = list(reversed(uids[-min(limit, MAX_FETCH) :]))
        return _fetch(client, newest), len(uids)

    return _run(account, work)


def _recent(account: ImapAccount, since: date, limit: int, known: frozenset[tuple[int, int]]) -> Recent:
    def work(client: IMAPClient) -> Recent:
        # Selected again for its UIDVALIDITY (STATUS on the selected folder is discouraged, RFC 3501).
        validity = int(client.select_folder("INBOX", readonly=True).get(b"UIDVALIDITY", 0))
        uids = sorted(client.search(["SINCE", since]))[-min(limit, MAX_FETCH) :]
        fresh = [u for u in uids if (validity, u) not in known]
        return Recent(validity, tuple(uids), tuple(_fetch(client, fresh)))

    return _run(account, work)


def _thread(account: ImapAccount, uid: int) -> list[Mail]:
    """The message and every message of its conversation in INBOX (by Message-ID and References)."""

    def work(client: IMAPClient) -> list[Mail]:
        fetched = _fetch(client, [uid])
        if not fetched:
            return []
        first = fetched[0]
        root = (first.references[0] if first.references else first.in_reply_to) or first.message_id
        if not root:
            return [first]
        uids = set(client.search(["HEADER", "Message-ID", root]))
        uids |= set(client.search(["HEADER", "References", root]))
        uids |= set(client.search(["HEADER", "In-Reply-To", root]))
        uids.add(uid)
        mails = _fetch(client, sorted(uids)[-MAX_FETCH:])
        return sorted(mails, key=lambda m: (m.sent_at or datetime.min.replace(tzinfo=UTC), m.uid))

    return _run(account, work)


def _count(account: ImapAccount) -> int:
    client = _open(account)
    try:
        return int(client.select_folder("INBOX", readonly=True).get(b"EXISTS", 0))
    except (OSError, IMAPClientError, imaplib.IMAP4.error) as exc:
        raise ImapError(f"the IMAP server {account.host} has no readable INBOX ({_why(exc)})") from exc
    finally:
        _close(client)


async def check(account: ImapAccount) -> int:
    """Sign in and open INBOX read-only; how many messages it holds. Raises ``ImapLoginRefused``
    for wrong credentials, ``ImapError`` when the server cannot be reached or read."""
    return await asyncio.to_thread(_count, account)


async def search(account: ImapAccount, criteria: Criteria, limit: int = 20) -> tuple[list[Mail], int]:
    """The newest ``limit`` messages of INBOX matching, newest first, and how many matched."""
    return await asyncio.to_thread(_search, account, criteria, limit)


@dataclass(frozen=True)
class Recent:
    """INBOX's newest messages since a day: every UID (under ``validity``, the folder's
    UIDVALIDITY) and the messages fetched, those not already ``known``."""

    validity: int
    uids: tuple[int, ...]
    fetched: tuple[Mail, ...]


async def recent(
    account: ImapAccount, since: date, limit: int, known: frozenset[tuple[int, int]] = frozenset()
) -> Recent:
    """The newest ``limit`` messages of INBOX received since ``since``; a message whose
    (UIDVALIDITY, UID) is in ``known`` is listed but not fetched again."""
    return await asyncio.to_thread(_recent, account, since, limit, known)


async def thread(account: ImapAccount, uid: int) -> list[Mail]:
    """The conversation of message ``uid``, oldest first; empty when there is no such message."""
    return await asyncio.to_thread(_thread, account, uid)
