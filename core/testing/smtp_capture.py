"""A loopback SMTP server for tests (aiosmtpd) that keeps every message it accepts.

    async with SmtpCapture() as smtp:
        Settings(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", ...)
        [mail] = await smtp.wait_for(1)   # mail.message is an email.message.EmailMessage

``smtp.refuse = 554`` makes it refuse the messages that follow with that code (at DATA);
``smtp.refuse_limit = 2`` then makes it accept again after two refusals.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class CapturedMail:
    mail_from: str
    rcpt_to: list[str]
    message: EmailMessage


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Authenticator:
    def __init__(self, login: tuple[str, str]) -> None:
        self.login = login

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == self.login
        return AuthResult(success=ok, handled=False)


class _Handler:
    def __init__(self, capture: SmtpCapture) -> None:
        self.capture = capture

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        limit = self.capture.refuse_limit
        if self.capture.refuse and (limit is None or self.capture.refused < limit):
            self.capture.refused += 1
            return f"{self.capture.refuse} refused by the test server"
        message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        with self.capture._lock:
            self.capture.received.append(CapturedMail(envelope.mail_from, list(envelope.rcpt_tos), message))  # type: ignore[arg-type]
        return "250 Message accepted for delivery"


class SmtpCapture:
    def __init__(self, *, login: tuple[str, str] | None = None) -> None:
        """``login=(user, password)`` offers AUTH (over plain text, loopback only) and accepts only that."""
        self.port = _free_port()  # aiosmtpd's Controller cannot bind port 0
        self.received: list[CapturedMail] = []
        self.refuse: int | None = None
        self.refused = 0
        self.refuse_limit: int | None = None
        self._lock = threading.Lock()
        auth: dict[str, Any] = {}
        if login is not None:
            auth = {"authenticator": _Authenticator(login), "auth_require_tls": False}
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port, **auth)

    async def __aenter__(self) -> SmtpCapture:
        await asyncio.to_thread(self._controller.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self._controller.stop)

    async def wait_for(self, count: int, within: float = 30.0) -> list[CapturedMail]:
        """The first ``count`` messages, once that many arrived (``AssertionError`` after ``within`` s).

        The bound is for a machine under load: a turn's model calls and durable commits, a second
        on an idle machine, can take many times that when other work shares the cores and disk.
        """
        try:
            async with asyncio.timeout(within):
                while True:
                    with self._lock:
                        if len(self.received) >= count:
                            return list(self.received[:count])
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"expected {count} message(s), the SMTP server got {len(self.received)}") from None


class MuteAfterData:
    """An SMTP server that takes a whole message and then drops the connection instead of
    answering: the sender cannot know whether the mail went. ``received`` holds what it took.

        async with MuteAfterData() as server:
            Settings(smtp_host="127.0.0.1", smtp_port=server.port, smtp_security="none", ...)
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 test ESMTP\r\n")
        while line := await reader.readline():
            if line.upper().startswith(b"DATA"):
                writer.write(b"354 go on\r\n")
                self.received.append(await reader.readuntil(b"\r\n.\r\n"))
                break  # no answer: the connection just ends
            writer.write(b"250 ok\r\n")
            await writer.drain()
        writer.close()

    async def __aenter__(self) -> MuteAfterData:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
