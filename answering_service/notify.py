"""Telling the owner what a caller left: on the owner's preferred channel, within seconds.

A caller's words reach the owner only quoted and labelled as a caller's (they may hold text meant
to steer the owner's own assistant). Each message is claimed before it is sent, so a message is
announced once even when the end of a call and a VIP's immediate notice race. When the preferred
channel cannot be used (no verified address, SMTP not set up, sending failed) the next one is
tried: SMS, then web chat, which always works (a message in the owner's conversation).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core import identity
from core.conversation import conversation_for, record_outbound
from core.records import answering, answering_bookings, calls
from core.store.queries import Queries
from core.untrusted import CALLER_LABEL, quoted

log = logging.getLogger(__name__)

SendSms = Callable[[str, str, str], Awaitable[None]]  # (to, from_, body)
SendEmail = Callable[[str, str, str], Awaitable[None]]  # (to, subject, body)


@dataclass
class OwnerNotifier:
    db: Queries
    send_sms: SendSms | None = None
    send_email: SendEmail | None = None
    public_url: str | None = None
    # Twilio Lookup v2 (``PEPPER_TWILIO_LOOKUP``): (number) -> an object with ``line_type`` and
    # ``caller_name``; shown with each message. None: not configured.
    lookup: Callable[[str], Awaitable[Any]] | None = None

    def transcript_link(self, call_sid: str) -> str:
        base = (self.public_url or "").rstrip("/")
        return f"{base}/answering/calls/{call_sid}" if base else f"pepper answering transcript {call_sid}"

    async def after_call(self, call_sid: str) -> None:
        """Everything the call left for the owner that was not announced yet."""
        await self.message(call_sid)
        await self.bookings(call_sid)

    async def message(self, call_sid: str) -> bool:
        """Announce the call's message once; True when this call sent it."""
        db = self.db
        row = await answering.claim_message_notice(db, call_sid)
        if row is None:
            return False
        urgent = row["urgency"] == "urgent" or row["vip"]
        head = ("URGENT: " if urgent else "") + "a caller left a message" + (" (VIP)" if row["vip"] else "") + "."
        body = "\n".join([
            f"Pepper answering service: {head}",
            CALLER_LABEL,
            f"Name: {quoted(row['caller_name'])}",
            f"Reason: {quoted(row['reason'])}",
            f"Call back: {row['callback_number']}"
            + (" (Pepper said you would: it is on your todos)" if row["callback_promised"] else ""),
            *await self._signals(call_sid),
            f"Transcript: {self.transcript_link(call_sid)}",
        ])  # fmt: skip
        subject = ("URGENT: " if urgent else "") + f"Message from {quoted(row['caller_name'])}"

        async def trying(channel: str) -> None:
            # Recorded before the attempt: a notice the owner can see is always on record.
            await answering.notice_trying(db, row["id"], channel)

        channel, error = await self._deliver(row["account_id"], call_sid, subject, body, trying=trying)
        await answering.notice_result(db, row["id"], channel, error)
        return True

    async def _signals(self, call_sid: str) -> list[str]:
        """What Twilio Lookup says of the caller ID (looked up once per call, kept with it)."""
        if self.lookup is None:
            return []
        row = await answering.caller_signals(self.db, call_sid)
        if row is None or not row["caller"]:
            return []
        line_type, name = row["line_type"], row["caller_name_lookup"]
        if line_type is None:
            try:
                async with asyncio.timeout(5):
                    found = await self.lookup(row["caller"])
                line_type, name = found.line_type, found.caller_name
            except Exception as exc:  # a lookup that fails leaves the notice as it was
                log.warning("Twilio Lookup failed for an answering caller: error=%s", type(exc).__name__)
                return []
            await answering.store_lookup(self.db, call_sid, line_type, name)
        lines = [f"Line type (Twilio Lookup): {line_type or 'unknown'}"]
        if name:
            lines.append(f"Registered name (Twilio Lookup): {quoted(name)}")
        return lines

    async def bookings(self, call_sid: str) -> None:
        for row in await answering_bookings.claim_owner_notices(self.db, call_sid):
            owner = await answering.owner(self.db, row["account_id"])
            when = row["starts_at"].astimezone(ZoneInfo((owner["timezone"] if owner else None) or "UTC"))
            body = "\n".join([
                f"Pepper answering service: a caller booked a {row['appointment_type']} on {when:%a %d %b at %H:%M}.",
                f"Name (as the caller said it): {quoted(row['caller_name'])}",
                f"Number: {row['caller_number']}",
                f"Transcript: {self.transcript_link(call_sid)}",
            ])  # fmt: skip
            await self._deliver(row["account_id"], call_sid, f"New booking: {when:%a %d %b %H:%M}", body)

    async def text(self, account_id: UUID, subject: str, body: str) -> None:
        """Any other notice for the owner (a caller cancelled or moved by text)."""
        await self._deliver(account_id, None, subject, body)

    async def _deliver(
        self, account_id: UUID, call_sid: str | None, subject: str, body: str,
        *, trying: Callable[[str], Awaitable[None]] | None = None,
    ) -> tuple[str, str | None]:  # fmt: skip
        """Send on the owner's channel, falling back; ``trying(channel)`` runs before each attempt."""
        db = self.db
        preferred = await answering.notify_channel(db, account_id)
        order = [preferred or "sms"] + [c for c in ("sms", "web") if c != (preferred or "sms")]
        errors: list[str] = []
        for channel in order:
            if trying is not None:
                await trying(channel)
            try:
                if channel == "sms" and await self._sms(account_id, call_sid, body):
                    return "sms", "; ".join(errors) or None
                if channel == "email" and await self._email(account_id, subject, body):
                    return "email", "; ".join(errors) or None
                if channel == "web":
                    conversation = await conversation_for(db, account_id)
                    await record_outbound(db, conversation, "answering", body)
                    return "web", "; ".join(errors) or None
                errors.append(f"{channel}: not set up")
            except Exception as exc:  # try the next channel; CancelledError passes
                log.exception("notifying the owner failed: channel=%s", channel)
                errors.append(f"{channel}: {type(exc).__name__}")
        return "none", "; ".join(errors)

    async def _sms(self, account_id: UUID, call_sid: str | None, body: str) -> bool:
        if self.send_sms is None:
            return False
        db = self.db
        handle = await identity.first_verified_handle(db, account_id, "phone")
        if handle is None or await identity.is_blocked(db, handle.id, "sms"):
            return False
        line = None
        if call_sid is not None:
            line = await calls.line_of(db, call_sid)
        if line is None:
            line = await identity.line_number_of(db, account_id)
        if line is None:
            return False
        await self.send_sms(handle.value, line, body)
        return True

    async def _email(self, account_id: UUID, subject: str, body: str) -> bool:
        if self.send_email is None:
            return False
        handle = await identity.first_verified_handle(self.db, account_id, "email")
        if handle is None:
            return False
        await self.send_email(handle.value, subject, body)
        return True
