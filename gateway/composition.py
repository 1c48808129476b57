"""The composition root: what each process of ``pepper serve`` is made of.

The web server (``gateway.server.build_app``), every turn worker (``gateway.worker``) and every
media process (``gateway.media_procs``) build their services here, from settings and the store,
so none of them imports another to borrow its wiring.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from core.errors import PepperError
from core.settings import Settings
from core.store import Database
from gateway.services import Services
from gateway.tasks import BackgroundTasks

if TYPE_CHECKING:  # imported where used: a turn worker need not load what only the web server uses
    from answering_service.notify import OwnerNotifier
    from core.adapters.twilio.rest import TwilioMessenger
    from core.memory.worker import MemoryWorker
    from core.models.router import ModelRouter
    from core.store.queries import Queries
    from gateway.channels import Channel
    from gateway.mailer import SmtpMailer
    from text_loop import HarnessDeps
    from voice.digits import KeyPresses
    from voice.live_call import Delegate, Settle
    from voice.outbound import OutboundCalls
    from voice.service import CallService
    from voice.transfer import Transfers

log = logging.getLogger(__name__)

SendSms = Callable[[str, str, str], Awaitable[None]]  # (to, from_, body)
SendEmail = Callable[[str, str, str], Awaitable[None]]  # (to, subject, body)


def turn_parts(
    settings: Settings, db: Database
) -> tuple[ModelRouter, HarnessDeps, TwilioMessenger | None, SmtpMailer | None]:
    """What running a turn and sending its reply needs: the model router, the harness on it,
    Twilio (if set up) and Pepper's SMTP account (if set up). The web server and every turn
    worker build the same.

    The router is built even with no provider configured: a turn then tells the person plainly
    that no model is configured.
    """
    from core.models.router import ModelRouter
    from core.tools.connectors import Connectors
    from core.tools.mcp import McpHub
    from core.tools.starter import starter_registry
    from gateway.mailer import SmtpMailer, smtp_configured
    from text_loop import HarnessDeps
    from text_loop.skills.catalog import SkillCatalog

    router = ModelRouter.from_settings(settings)
    messenger: TwilioMessenger | None = None
    if settings.twilio_account_sid and settings.twilio_auth_token is not None:
        from core.adapters.twilio.rest import TwilioMessenger

        messenger = TwilioMessenger(settings)
    from dataclasses import replace

    connectors = replace(Connectors.from_settings(settings), models=router)
    if messenger is not None:  # the messages area texts from the person's line through the same Twilio
        from core.adapters.twilio.signatures import public_request_url
        from gateway.webhooks import MESSAGE_STATUS

        status = public_request_url(settings, MESSAGE_STATUS.path)
        connectors = replace(connectors, texter=messenger, text_status_url=status)
    harness = HarnessDeps(
        db=db, models=router, registry=starter_registry(connectors), skills=SkillCatalog.load_builtin(),
        connectors=connectors, usage=settings.usage, mcp=McpHub(connectors, timeout=settings.mcp_call_seconds),
    )  # fmt: skip
    mailer = SmtpMailer(settings) if smtp_configured(settings) else None
    use_embedder(settings)
    return router, harness, messenger, mailer


@asynccontextmanager
async def build_turn_services(settings: Settings, db: Database, *, calls: bool = False) -> AsyncIterator[Services]:
    """The services of a turn-worker process (no routes, no calls, no scheduler); with ``calls``,
    of a media process (``gateway.media_procs``): the same plus the call service, its one-time
    codes going out by SMS through the same messenger."""
    router, harness, messenger, mailer = turn_parts(settings, db)
    services = Services(
        settings=settings, db=db, harness=harness, messenger=messenger, mailer=mailer,
        tasks=BackgroundTasks(settings.max_concurrent_turns),
        calls=build_calls(settings, db, harness, messenger) if calls else None,
    )  # fmt: skip
    try:
        yield services
    finally:
        if messenger is not None:
            await messenger.close()
        if harness.mcp is not None:
            await harness.mcp.close()
        await router.aclose()


def build_media_services(settings: Settings, db: Database) -> AbstractAsyncContextManager[Services]:
    """The services of a media process: what a call needs, and nothing that answers messages."""
    return build_turn_services(settings, db, calls=True)


async def check_connection_secrets(db: Database, connectors: Any) -> None:
    """Seal secrets left in plaintext by an older Pepper; say loudly when the key opens none of
    the sealed ones (those accounts stay connected, their tools fail with the reason)."""
    from core.tools.connectors import seal_plaintext_secrets, unopenable_secrets

    vault = connectors.require_vault()
    try:
        await seal_plaintext_secrets(db, vault)
        bad = await unopenable_secrets(db, vault)
    except PepperError as exc:
        log.error("connection secrets: %s", exc.message)
        return
    if bad:
        log.error("connection secrets: %s of them do not open: %s", len(bad), vault.mismatch_message())


def text_channels() -> tuple[Channel, ...]:
    """The text channels the turn workers answer on, all through ``gateway.channels.Pipeline``."""
    from gateway.email_channel import EMAIL_CHANNEL
    from gateway.messaging import SMS_CHANNEL, WHATSAPP_CHANNEL
    from gateway.plugin_channels import PluginChannel, channel_plugins
    from gateway.webchat import WEB_CHANNEL

    return (SMS_CHANNEL, WHATSAPP_CHANNEL, EMAIL_CHANNEL, WEB_CHANNEL, PluginChannel(channel_plugins()))


def plain_sms(messenger: TwilioMessenger | None) -> SendSms | None:
    """``send_sms(to, from_, body)`` through Twilio with no status callback, or None without Twilio."""
    if messenger is None:
        return None
    twilio = messenger

    async def send_sms(to: str, from_: str, body: str) -> None:
        await twilio.send(to=to, from_=from_, body=body, status_callback=None)

    return send_sms


def answering_notifier(settings: Settings, db: Database, messenger: TwilioMessenger | None) -> OwnerNotifier:
    """The answering service's owner notices, as the turn workers send them."""
    from answering_service.notify import OwnerNotifier

    return OwnerNotifier(db, send_sms=plain_sms(messenger), send_email=_owner_mail(settings),
                         public_url=settings.public_url, lookup=twilio_lookup(settings))  # fmt: skip


def twilio_lookup(settings: Settings) -> Callable[[str], Awaitable[Any]] | None:
    """Twilio Lookup v2 of one number (line type, caller name) when ``PEPPER_TWILIO_LOOKUP`` is on:
    a client per lookup (one per answering message), closed at once."""
    if not settings.twilio_lookup or not settings.twilio_account_sid or settings.twilio_auth_token is None:
        return None
    from core.adapters.twilio.voice_rest import TwilioVoice

    async def lookup(number: str) -> Any:
        client = TwilioVoice(settings)
        try:
            return await client.lookup(number)
        finally:
            await client.close()

    return lookup


def build_calls(
    settings: Settings, db: Database, harness: HarnessDeps, messenger: TwilioMessenger | None
) -> CallService:
    """Phone calls on the same registry and gate as text; the one-time code goes out by SMS."""
    from answering_service.service import AnsweringService, call_service_from_settings

    send_sms: SendSms | None = None
    if messenger is not None:
        twilio = messenger

        async def send_sms_now(to: str, from_: str, body: str) -> None:
            await twilio.send(to=to, from_=from_, body=body, status_callback=None)

        send_sms = send_sms_now

    from voice.sip import sip_calls_from_settings

    delegate, settle = delegated_turns(harness)
    service = call_service_from_settings(
        settings, db, registry=harness.registry, gate=harness.gate, send_sms=send_sms,
        connectors=harness.connectors, models=harness.models, delegate=delegate, settle=settle,
    )  # fmt: skip
    service.outbound = outbound_from_settings(settings, db)
    service.transfers = transfers_from_settings(settings, db)
    service.digits = digits_from_settings(settings, db)
    if isinstance(service.answering, AnsweringService):
        service.answering.transfers = service.transfers
    service.sip = sip_calls_from_settings(settings, service)
    service.deps.transfers = service.transfers  # the owner's line and placed calls offer it too (voice.transfer)
    return service


def transfers_from_settings(settings: Settings, db: Database) -> Transfers | None:
    """Putting callers through to the owner (``voice.transfer``): needs the public URLs Twilio calls."""
    from gateway.webhooks import TRANSFER_AFTER, TRANSFER_WHISPER, public_url_for
    from voice.transfer import Transfers

    whisper, after = public_url_for(settings, TRANSFER_WHISPER), public_url_for(settings, TRANSFER_AFTER)
    if whisper is None or after is None:
        return None
    return Transfers(db, whisper_url=whisper, after_url=after, ring_seconds=settings.transfer_ring_seconds)


def digits_from_settings(settings: Settings, db: Database) -> KeyPresses | None:
    """Keys pressed on calls Pepper places (``voice.digits``): needs the public URLs Twilio calls."""
    from gateway.webhooks import MEDIA_STREAM, VOICE_AFTER_STREAM, public_url_for
    from voice.digits import KeyPresses

    stream, after = public_url_for(settings, MEDIA_STREAM), public_url_for(settings, VOICE_AFTER_STREAM)
    if stream is None or after is None:
        return None
    return KeyPresses(db, stream_url=stream, action_url=after)


def outbound_from_settings(settings: Settings, db: Queries) -> OutboundCalls:
    """Calls Pepper places (``voice.outbound``): through Twilio's REST API when it is set up, with
    the public URLs Twilio calls back on; without them, every phone delivery is ``unavailable``."""
    from datetime import timedelta

    from gateway.webhooks import OUTBOUND_ANSWER, OUTBOUND_STATUS, public_url_for
    from voice.outbound import OutboundCalls, OutboundConfig

    telephony = None
    if settings.twilio_account_sid and settings.twilio_auth_token is not None:
        from core.adapters.twilio.voice_rest import TwilioVoice

        telephony = TwilioVoice(settings)
    retry = timedelta(seconds=settings.outbound_retry_seconds)
    config = OutboundConfig(retry_after=retry, poll=settings.outbound_poll_seconds,
                            ring_seconds=settings.outbound_ring_seconds)  # fmt: skip
    return OutboundCalls(db, telephony, answer_url=public_url_for(settings, OUTBOUND_ANSWER),
                         status_url=public_url_for(settings, OUTBOUND_STATUS), config=config)  # fmt: skip


def delegated_turns(harness: HarnessDeps) -> tuple[Delegate, Settle]:
    """A full-duplex call model's delegated tasks as Pepper turns (``voice.live_call``): the text
    harness with its gate, tools, skills, caps and records, as a turn of the call's session kind
    and trust; its staged writes committed or dropped when the call says whether the caller heard
    them confirmed."""
    from text_loop import deliver, run_turn
    from voice.live_call import DelegatedResult, DelegatedTask

    async def delegate(task: DelegatedTask) -> DelegatedResult:
        outcome = await run_turn(harness, task.account_id, "voice", task.text, kind=task.kind, trust=task.trust)
        return DelegatedResult(outcome.reply, outcome.turn_id, outcome.staged_writes, outcome.status)

    async def settle(turn_id: UUID, ok: bool) -> list[dict[str, Any]]:
        return [w.as_record() for w in await deliver(harness, turn_id, ok, detail={"channel": "call"})]

    return delegate, settle


def _owner_mail(settings: Settings) -> SendEmail | None:
    """Plain mail to the owner (answering-service notices) through Pepper's SMTP account, if set up."""
    from gateway.mailer import SmtpMailer, smtp_configured

    if not smtp_configured(settings):
        return None
    mailer = SmtpMailer(settings)

    async def send_email(to: str, subject: str, body: str) -> None:
        from email.message import EmailMessage
        from email.utils import formatdate, make_msgid

        message = EmailMessage()
        message["Message-ID"] = make_msgid(domain=mailer.from_address.rsplit("@", 1)[-1])
        message["Date"] = formatdate(localtime=False)
        message["From"] = f"{mailer.from_name} <{mailer.from_address}>"
        message["To"] = to
        message["Subject"] = subject
        message.set_content(body)
        await mailer.send(message, [to])

    return send_email


def use_embedder(settings: Settings) -> None:
    """The configured embedder for search (in this process)."""
    from core.memory.index import EMBEDDERS
    from core.models.embeddings import embedder_from_settings

    try:
        EMBEDDERS.use(embedder_from_settings(settings))
    except PepperError as exc:
        log.error("the configured embedding model cannot be used; search keeps the local one: %s", exc.message)


def start_memory(settings: Settings, db: Database, models: Any) -> MemoryWorker | None:
    """The memory jobs loop (None when turned off)."""
    from core.memory.worker import MemoryWorker

    if settings.memory_jobs_interval <= 0:
        return None
    return MemoryWorker(db, models, interval=settings.memory_jobs_interval)


async def freeze_startup_objects() -> None:
    """Once start-up is done, move what it made (~150k objects: imports, registries, the app) out
    of the cyclic collector's reach. A full collection otherwise scans them all, 70-125 ms on the
    build machine, and on a call that is a stall of every audio stream the process relays."""
    gc.collect()
    gc.freeze()
