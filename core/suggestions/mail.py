"""Where the detectors read mail: behind one small interface, so the mail-reading sources
(Gmail, IMAP) plug in beside Pepper's own inbox.

A :class:`MailSource` lists recent mail as :class:`MailItem`s. Today's source is
:class:`PepperInbox`: mail that arrived at Pepper's own address (the email channel records it in
the conversation). Mail text is untrusted: the detectors read it with code (dates, iCalendar
parts) and never hand it to a model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from core.records import inbox
from core.store.queries import Queries


@dataclass(frozen=True)
class MailItem:
    source: str  # "pepper-inbox", later "gmail", "imap"
    id: str  # stable within the source
    received_at: datetime
    sender: str
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


DEFAULT_SOURCES: tuple[MailSource, ...] = (PepperInbox(),)
