"""Fixtures for the phone-call tests; the shared constants and helpers live in phone_support."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from phone_support import ANSWERING_LINE, LINE, NOTICE, OWNER, TOKEN, Phone, _set_pin, call_settings, caller_for

from core import identity
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.smtp_capture import SmtpCapture
from core.testing.twilio_peer import TwilioPeer
from core.testing.web_peer import WebPeer
from gateway.server import running_app
from voice.testing.realtime_peer import RealtimePeer, speak


@asynccontextmanager
async def _phone(db: Database, db_url: str, smtp: SmtpCapture | None = None, **extra: Any) -> AsyncIterator[Phone]:
    ada = await identity.create_account(db, "Ada")
    handle = await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await _set_pin(db, ada.id)
    await identity.assign_line(db, LINE, "personal", ada.id)
    await identity.assign_line(db, ANSWERING_LINE, "answering", ada.id)
    mail: dict[str, Any] = dict(extra)
    if smtp is not None:
        mail |= {"smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_security": "none",
                "smtp_from": "pepper@pepper.example.org"}  # fmt: skip
    async with TwilioPeer(auth_token=TOKEN) as twilio, RealtimePeer() as model:
        settings = call_settings(db_url, twilio, openai_realtime_url=model.websocket_url, **mail)
        async with running_app(settings, db) as (app, port):
            caller = caller_for(app, port, twilio)
            phone = Phone(db, twilio, model, caller, app.extensions["pepper"], ada.id, handle.id, smtp)
            phone.tune(notice_timeout=5.0, closing_grace=3.0, filler_after=1.0)
            model.script(speak(NOTICE, ms=300))
            yield phone


@pytest.fixture
async def phone(db: Database, db_url: str) -> AsyncIterator[Phone]:
    async with _phone(db, db_url) as phone:
        yield phone


@pytest.fixture
async def phone_mail(db: Database, db_url: str) -> AsyncIterator[Phone]:
    """``phone`` with Pepper's SMTP account pointed at a loopback SMTP server (``phone.smtp``)."""
    async with SmtpCapture() as smtp, _phone(db, db_url, smtp) as phone:
        yield phone


@pytest.fixture
async def phone_web(db: Database, db_url: str) -> AsyncIterator[tuple[Phone, WebPeer, OpenAIPeer]]:
    """``phone`` with web research: the research helper process started as ``pepper serve`` starts
    it, searching a loopback SearXNG and reading pages of a loopback web (``WebPeer``), its own
    model a loopback OpenAI peer."""
    async with WebPeer() as web, OpenAIPeer() as helper_model:
        research = {"openai_base_url": helper_model.base_url, "web_search_provider": "searxng",
                    "searxng_url": web.url, "web_test_loopback_ports": (web.port,), "web_research_seconds": 20,
                    "memory_jobs_interval": 0}  # fmt: skip
        async with _phone(db, db_url, **research) as phone:
            yield phone, web, helper_model


@pytest.fixture
async def phone_out(db: Database, db_url: str) -> AsyncIterator[Phone]:
    """``phone`` for calls Pepper places: no scheduler of its own (the test runs one on a scripted
    model and a clock it moves), an unanswered call's retry due at once."""
    async with _phone(db, db_url, outbound_retry_seconds=0, scheduler_enabled=False) as phone:
        yield phone


@pytest.fixture
async def phone_lookup(db: Database, db_url: str) -> AsyncIterator[Phone]:
    """``phone`` with Twilio Lookup v2 on (the loopback Twilio answers it: ``twilio.lookup_answers``)."""
    async with _phone(db, db_url, twilio_lookup=True) as phone:
        yield phone
