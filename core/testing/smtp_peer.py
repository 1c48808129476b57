"""A loopback SMTP server for tests (aiosmtpd): keeps every message it accepts.

``async with SmtpPeer() as smtp:`` then point ``Connectors(smtp_host="127.0.0.1",
smtp_port=smtp.port, smtp_security="none", ...)`` at it; ``smtp.messages`` holds
``email.message.EmailMessage`` objects with ``envelope_to`` set. ``smtp.refuse = 554`` makes it
refuse the next messages with that code.
"""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from core.testing.radicale_server import free_port


@dataclass
class Received:
    mail_from: str
    rcpt_to: list[str]
    message: EmailMessage


class _Handler:
    def __init__(self, peer: SmtpPeer):
        self.peer = peer

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.peer.refuse:
            return f"{self.peer.refuse} refused by the test"
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.peer.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))  # type: ignore[arg-type]
        return "250 OK"


class SmtpPeer:
    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[Received] = []
        self.refuse: int | None = None
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port)

    async def __aenter__(self) -> SmtpPeer:
        self._controller.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._controller.stop()
