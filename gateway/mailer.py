"""Pepper's own outgoing mail: one SMTP account (``PEPPER_SMTP_*``), sent with aiosmtplib.

The SMTP server accepting a message is the delivery; there is no later receipt to wait for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import parseaddr

import aiosmtplib
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_chain, wait_fixed

from core.errors import ConfigError, PepperError
from core.settings import Settings

log = logging.getLogger(__name__)

SMTP_TIMEOUT = 30.0
# Waits before the second and third attempt when the server could not be reached or said "try later".
RETRY_DELAYS: tuple[float, ...] = (1.0, 4.0)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("smtp send failed, trying again: attempt=%s code=%s", state.attempt_number, getattr(exc, "code", "?"))


class MailRefused(PepperError):
    """The SMTP server did not accept the message. ``retryable`` when it was a transient fault."""

    code = "mail-refused"


def smtp_configured(settings: Settings) -> bool:
    return bool(settings.smtp_host and settings.smtp_from)


class SmtpMailer:
    """Sends through the configured SMTP server as Pepper's own address (``smtp_from``)."""

    def __init__(self, settings: Settings) -> None:
        if not smtp_configured(settings):
            raise ConfigError("set PEPPER_SMTP_HOST and PEPPER_SMTP_FROM to send mail")
        name, address = parseaddr(settings.smtp_from or "")
        if "@" not in address:
            raise ConfigError("PEPPER_SMTP_FROM must be an email address, e.g. 'Pepper <pepper@example.org>'")
        self.settings = settings
        self.from_name = name or "Pepper"
        self.from_address = address

    async def send(self, message: EmailMessage, recipients: Sequence[str]) -> None:
        """Hand ``message`` to the SMTP server for ``recipients`` (the envelope, de-duplicated).

        Returns once the server accepted it. Transient faults (no connection, 4xx replies) are
        retried twice; then, or on a permanent refusal (5xx), raises :class:`MailRefused`.
        """
        envelope = list(dict.fromkeys(r.lower() for r in recipients))
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, MailRefused) and exc.retryable),
            stop=stop_after_attempt(len(RETRY_DELAYS) + 1),
            wait=wait_chain(*(wait_fixed(d) for d in RETRY_DELAYS)),
            before_sleep=_log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._send_once(message, envelope)

    async def _send_once(self, message: EmailMessage, envelope: list[str]) -> None:
        s = self.settings
        password = s.smtp_password.get_secret_value() if s.smtp_password is not None else None
        try:
            await aiosmtplib.send(
                message,
                sender=self.from_address,
                recipients=envelope,
                hostname=s.smtp_host,
                port=s.smtp_port,
                username=s.smtp_username or None,
                password=password if s.smtp_username else None,
                use_tls=s.smtp_security == "tls",
                start_tls=s.smtp_security == "starttls",
                timeout=SMTP_TIMEOUT,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise MailRefused("the mail server refused every recipient", code="mail-recipients-refused") from exc
        except aiosmtplib.SMTPResponseException as exc:
            transient = 400 <= exc.code < 500
            raise MailRefused(
                f"the mail server refused the message ({exc.code})", code=f"smtp-{exc.code}", retryable=transient
            ) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise MailRefused(
                f"the mail server could not be reached ({type(exc).__name__})", code="smtp-unreachable", retryable=True
            ) from exc


async def check_login(settings: Settings) -> None:
    """Connect to the configured SMTP server and log in (``pepper doctor --online``); send nothing.
    Raises ``MailRefused`` with why it failed."""
    s = settings
    password = s.smtp_password.get_secret_value() if s.smtp_password is not None else ""
    client = aiosmtplib.SMTP(
        hostname=s.smtp_host, port=s.smtp_port, use_tls=s.smtp_security == "tls",
        start_tls=s.smtp_security == "starttls", timeout=SMTP_TIMEOUT,
    )  # fmt: skip
    try:
        await client.connect()
        if s.smtp_username:
            await client.login(s.smtp_username, password)
        await client.quit()
    except aiosmtplib.SMTPAuthenticationError as exc:
        raise MailRefused(f"the mail server refused the login ({exc.code})", code=f"smtp-{exc.code}") from exc
    except aiosmtplib.SMTPResponseException as exc:
        raise MailRefused(f"the mail server answered {exc.code}", code=f"smtp-{exc.code}") from exc
    except (aiosmtplib.SMTPException, OSError) as exc:
        raise MailRefused(
            f"the mail server could not be reached ({type(exc).__name__})", code="smtp-unreachable"
        ) from exc
    finally:
        client.close()
