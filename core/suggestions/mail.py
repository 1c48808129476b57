"""Where the detectors read mail: behind one small interface (:class:`MailSource`), the
person's own mailboxes beside Pepper's.

A :class:`MailSource` lists recent mail as :class:`MailItem`s. :func:`mail_sources` gives an
account's: :class:`PepperInbox` (mail that arrived at Pepper's own address, recorded by the email
channel), :class:`GmailMailbox` (a Google connection granted ``gmail.readonly``) and one
:class:`ImapMailbox` per connected IMAP mailbox. Mail text is untrusted: the detectors read it
with code (dates, iCalendar parts) and never hand it to a model.

Each mailbox is read in a bounded window: received since ``since`` (the detectors ask for 14
days) and at most :data:`MAX_PER_MAILBOX` messages, the newest. A message once read is kept in
this process (:class:`Seen`, bounded): a Gmail message and an IMAP UID under one UIDVALIDITY never
change, so the next run lists the window (one call) and fetches only the new ones.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from uuid import UUID

from core.adapters import imap
from core.errors import PepperError
from core.records import connections, inbox
from core.store.queries import Queries
from core.tools.areas.mail.reading import OneAtATime, gmail_mail, imap_account
from core.tools.connectors import GMAIL_READONLY, Connectors
from core.tools.google_api import GoogleClient, google_connection

log = logging.getLogger(__name__)

MAX_PER_MAILBOX = 50  # the newest messages of the window read from one mailbox
GMAIL_AT_ONCE = 8  # messages.get calls in flight at once (a first run reads up to 50)


@dataclass(frozen=True)
class MailItem:
    source: str  # "pepper-inbox", "gmail", "imap-<connection>"
    id: str  # stable within the source
    received_at: datetime
    sender: str  # the From address
    subject: str
    text: str
    calendars: tuple[bytes, ...] = ()  # text/calendar parts (an invitation's .ics), when the source has them


class MailSource(Protocol):
    name: str

    async def recent(self, db: Queries, account_id: UUID, since: datetime) -> Sequence[MailItem]: ...


class PepperInbox:
    """Mail the person (or someone who writes as them) sent to Pepper's own address."""

    name = "pepper-inbox"

    async def recent(self, db: Queries, account_id: UUID, since: datetime) -> list[MailItem]:
        out = []
        for row in await inbox.recent_inbound(db, account_id, since):
            meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"] or "{}")
            parts = tuple(p.encode() for p in meta.get("calendars", ()) if isinstance(p, str))
            sender, subject = str(meta.get("sender") or ""), str(meta.get("subject") or "")
            text = str(meta.get("text") or row["body"])
            out.append(MailItem(self.name, str(row["id"]), row["created_at"], sender, subject, text, parts))
        return out


DEFAULT_SOURCES: tuple[MailSource, ...] = (PepperInbox(),)  # what every account has


class Seen:
    """Messages already read, by (mailbox, message id), the least recently used dropped first
    once there are ``size`` of them or their text and parts pass ``budget`` bytes. In memory on
    purpose: what it saves is a refetch, and a restart costs one window's fetch."""

    def __init__(self, size: int = 5000, budget: int = 32 * 1024 * 1024):
        self.size, self.budget, self.used = size, budget, 0
        self._items: OrderedDict[tuple[str, str], MailItem] = OrderedDict()

    @staticmethod
    def _weight(item: MailItem) -> int:
        return len(item.text) + len(item.subject) + sum(len(p) for p in item.calendars)

    def get(self, mailbox: str, message: str) -> MailItem | None:
        item = self._items.get((mailbox, message))
        if item is not None:
            self._items.move_to_end((mailbox, message))
        return item

    def put(self, mailbox: str, message: str, item: MailItem) -> None:
        old = self._items.pop((mailbox, message), None)
        self.used -= self._weight(old) if old is not None else 0
        self._items[(mailbox, message)] = item
        self.used += self._weight(item)
        while len(self._items) > self.size or (self.used > self.budget and len(self._items) > 1):
            _, dropped = self._items.popitem(last=False)
            self.used -= self._weight(dropped)

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def known(self, mailbox: str) -> list[str]:
        return [m for (b, m) in self._items if b == mailbox]


SEEN = Seen()

_ICS_TYPES = ("text/calendar", "application/ics")


def _b64(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


class GmailMailbox:
    """The person's Gmail INBOX through the API (``users.messages.list`` with ``q``, then
    ``users.messages.get`` for the messages not seen before; an ``.ics`` sent as an attachment is
    fetched with ``users.messages.attachments.get``)."""

    name = "gmail"

    def __init__(self, client: GoogleClient, connection_id: UUID, seen: Seen = SEEN):
        self.client, self.key, self.seen = client, f"gmail-{connection_id}", seen

    async def recent(self, db: Queries, account_id: UUID, since: datetime) -> list[MailItem]:
        q = f"in:inbox after:{since.astimezone(UTC):%Y/%m/%d}"
        listed = await self.client.call(
            "GET", "/gmail/v1/users/me/messages", params={"q": q, "maxResults": MAX_PER_MAILBOX}
        )
        ids = [str(m["id"]) for m in listed.get("messages") or ()][:MAX_PER_MAILBOX]
        fresh = [i for i in ids if self.seen.get(self.key, i) is None]
        limit = asyncio.Semaphore(GMAIL_AT_ONCE)

        async def read(message_id: str) -> MailItem:
            async with limit:
                return await self._read(message_id)

        read_now = {item.id: item for item in await asyncio.gather(*(read(i) for i in fresh))}
        for item in read_now.values():
            self.seen.put(self.key, item.id, item)
        # What was read now is used as read, whether or not the cache keeps it.
        items = [read_now.get(i) or self.seen.get(self.key, i) for i in ids]
        return [i for i in items if i is not None and i.received_at >= since]

    async def _read(self, message_id: str) -> MailItem:
        message = await self.client.call("GET", f"/gmail/v1/users/me/messages/{message_id}", params={"format": "full"})
        mail = gmail_mail(message)
        received = (
            datetime.fromtimestamp(int(message["internalDate"]) / 1000, UTC)
            if message.get("internalDate") else mail.sent_at or datetime.now(UTC)
        )  # fmt: skip
        parts: list[bytes] = []
        for part in _walk(message.get("payload") or {}):
            if len(parts) >= imap.MAX_CALENDAR_PARTS:
                break
            kind, name = str(part.get("mimeType", "")).lower(), str(part.get("filename") or "").lower()
            if kind not in _ICS_TYPES and not name.endswith(".ics"):
                continue
            body = part.get("body") or {}
            if int(body.get("size") or 0) > imap.MAX_CALENDAR_BYTES:
                continue
            data = body.get("data")
            if not data and body.get("attachmentId"):
                found = await self.client.call(
                    "GET", f"/gmail/v1/users/me/messages/{message_id}/attachments/{body['attachmentId']}"
                )
                data = found.get("data")
            if not data:
                continue
            try:
                parts.append(_b64(str(data)))
            except ValueError:  # not base64: no invitation in it, and no reason to fail the mailbox
                continue
        return MailItem(self.name, message_id, received, mail.sender, mail.subject, mail.text[: imap.MAX_TEXT],
                        tuple(p for p in parts if len(p) <= imap.MAX_CALENDAR_BYTES))  # fmt: skip


def _walk(part: dict[str, Any]) -> list[dict[str, Any]]:
    out = [part]
    for child in part.get("parts") or ():
        out += _walk(child)
    return out


class ImapMailbox:
    """One connected IMAP mailbox's INBOX (read-only, ``core.adapters.imap.recent``): the UIDs
    received since the day, and only the messages not seen before fetched."""

    def __init__(self, connection_id: UUID, label: str, account: imap.ImapAccount, seen: Seen = SEEN):
        self.name = f"imap {label}"
        self.key, self.account, self.seen = f"imap-{connection_id}", account, seen

    async def recent(self, db: Queries, account_id: UUID, since: datetime) -> list[MailItem]:
        known = frozenset(
            (int(v), int(u)) for v, _, u in (k.partition(":") for k in self.seen.known(self.key))
        )  # fmt: skip
        found = await imap.recent(self.account, since.astimezone(UTC).date(), MAX_PER_MAILBOX, known)
        read_now: dict[str, MailItem] = {}
        for mail in found.fetched:
            ref = f"{found.validity}:{mail.uid}"
            item = MailItem(self.key, ref, mail.sent_at or datetime.now(UTC), mail.sender, mail.subject, mail.text,
                            mail.calendars)  # fmt: skip
            self.seen.put(self.key, ref, item)
            read_now[ref] = item
        refs = [f"{found.validity}:{u}" for u in found.uids]
        items = [read_now.get(r) or self.seen.get(self.key, r) for r in refs]
        return [i for i in items if i is not None]


async def mail_sources(db: Queries, connectors: Connectors, account_id: UUID) -> tuple[list[MailSource], list[str]]:
    """The account's mail sources (Pepper's inbox, Gmail when granted ``gmail.readonly``, each
    IMAP mailbox) and those that cannot even be opened, named (a secret that does not open)."""
    shared = OneAtATime(db)  # the Google client refreshes its token on the run's connection
    sources: list[MailSource] = list(DEFAULT_SOURCES)
    broken: list[str] = []
    gmail = await google_connection(db, account_id, GMAIL_READONLY)
    if gmail is not None:
        sources.append(GmailMailbox(GoogleClient(shared, connectors, gmail), gmail))
    for row in await connections.imap_connections(db, account_id):
        try:
            sources.append(ImapMailbox(row["id"], row["label"], await imap_account(db, connectors, row)))
        except (PepperError, KeyError, ValueError) as exc:
            log.warning("imap connection cannot be opened for the detectors: %s", type(exc).__name__)
            broken.append(f"imap {row['label']} (its stored settings do not open)")
    return sources, broken
