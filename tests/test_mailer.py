"""Pepper's SMTP sender: transient refusals are tried again, permanent ones are not."""

from __future__ import annotations

from email.message import EmailMessage

import pytest

from core.settings import Settings
from core.testing.smtp_capture import SmtpCapture
from gateway import mailer
from gateway.mailer import MailRefused, SmtpMailer


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(mailer, "RETRY_DELAYS", (0.01, 0.01))


def _mailer(smtp: SmtpCapture) -> SmtpMailer:
    return SmtpMailer(Settings(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none",
                               smtp_from="Pepper <pepper@example.org>"))  # fmt: skip


def _message() -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "pepper@example.org", "ada@example.org", "hello"
    message.set_content("hello")
    return message


async def test_a_try_later_refusal_is_sent_again_and_arrives_once():
    async with SmtpCapture() as smtp:
        smtp.refuse, smtp.refuse_limit = 451, 2
        await _mailer(smtp).send(_message(), ["Ada@Example.org", "ada@example.org"])
        [mail] = await smtp.wait_for(1)
        assert smtp.refused == 2 and mail.rcpt_to == ["ada@example.org"]


async def test_a_server_that_keeps_saying_try_later_is_given_up_after_three_attempts():
    async with SmtpCapture() as smtp:
        smtp.refuse = 451
        with pytest.raises(MailRefused) as refused:
            await _mailer(smtp).send(_message(), ["ada@example.org"])
        assert refused.value.code == "smtp-451" and refused.value.retryable and smtp.refused == 3


async def test_a_permanent_refusal_is_not_tried_again():
    async with SmtpCapture() as smtp:
        smtp.refuse = 554
        with pytest.raises(MailRefused) as refused:
            await _mailer(smtp).send(_message(), ["ada@example.org"])
        assert refused.value.code == "smtp-554" and not refused.value.retryable and smtp.refused == 1
