"""The gateway side of scheduled runs: delivering their results, and starting the scheduler.

Channels:

* ``chat``: the message is recorded in the person's conversation (outbound, channel ``web``),
  with the delivery key as its provider id, so the unique ``(channel, provider_message_id)``
  makes a repeat a no-op;
* ``sms`` / ``whatsapp``: sent through Twilio from the account's personal line to its verified
  phone number, with the status callback; a STOP, no number or no Twilio answers ``unavailable``
  and the scheduler falls back to chat;
* ``room:<room id>``: posted in the room once (``gateway.rooms.posting``: recorded under a
  transaction id made of the run and the channel's place, then sent under it), when the account is
  still a member; otherwise ``unavailable``, so chat;
* ``call``: a phone call to the owner's verified number, or the number the owner approved for the
  task (``voice.outbound``): ``queued`` while it rings; its receipt settles the delivery (a person
  heard the brief after proving who they are, a voicemail with no details, or no answer twice);
  refused or not set up answers ``unavailable``, so chat;
* ``email``: sent by SMTP from Pepper's own address to the account's verified email address;
  the delivery key is recorded with the message, so a re-run after a crash finds it sent; no SMTP
  account, no verified address or an opt-out answers ``unavailable``, so chat.
"""

from __future__ import annotations

import logging
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from typing import Any
from uuid import UUID

from core import identity
from core.adapters.twilio.signatures import public_request_url
from core.conversation import (
    conversation_for,
    mark_part_sent,
    mark_parts_failed,
    record_sent_once,
    record_unsent_parts,
    was_sent,
)
from core.errors import PepperError
from core.following.checks import FollowConfig, Following
from core.records import outbound as outbound_records
from core.scheduling.tasks import ROOM_PREFIX
from core.settings import Settings
from core.store.queries import Queries
from core.tools.connectors import Connectors
from gateway.segments import split_message
from gateway.webhooks import MESSAGE_STATUS
from text_loop import HarnessDeps
from text_loop.scheduler import DeliveryRequest, DeliveryResult, Scheduler, SchedulerConfig

log = logging.getLogger(__name__)


class GatewayDeliverer:
    """Implements ``text_loop.scheduler.Deliverer`` over the store and Twilio."""

    def __init__(
        self, settings: Settings, db: Queries, messenger: Any = None, mailer: Any = None, rooms: Any = None,
        outbound: Any = None,
    ):  # fmt: skip
        self.settings = settings
        self.db = db
        self.messenger = messenger
        self.mailer = mailer
        self.rooms = rooms  # a ``gateway.rooms.posting.RoomPoster``; None: rooms are off
        self.outbound = outbound  # voice.outbound.OutboundCalls

    async def aclose(self) -> None:
        if self.rooms is not None:
            await self.rooms.close()
        if self.outbound is not None:
            await self.outbound.aclose()

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        if request.channel == "chat":
            return await self._chat(request)
        if request.channel in ("sms", "whatsapp"):
            return await self._phone(request)
        if request.channel == "email":
            return await self._email(request)
        if request.channel.startswith(ROOM_PREFIX):
            return await self._room(request)
        if request.channel == "call":
            return await self._call(request)
        return DeliveryResult("unavailable", f"the {request.channel} channel is not available in this version")

    async def _chat(self, request: DeliveryRequest) -> DeliveryResult:
        conversation_id = await conversation_for(self.db, request.account_id)
        recorded = await record_sent_once(
            self.db, conversation_id, "web", request.body, provider_message_id=request.key,
            delivery_status="delivered", turn_id=request.turn_id,
        )  # fmt: skip
        if not recorded:
            return DeliveryResult("delivered", "already in the conversation", request.key)
        return DeliveryResult("delivered", "", request.key)

    async def _room(self, request: DeliveryRequest) -> DeliveryResult:
        if self.rooms is None:
            return DeliveryResult("unavailable", "rooms are off (PEPPER_ROOMS_ENABLED)")
        try:
            room_id = UUID(request.channel.removeprefix(ROOM_PREFIX))
        except ValueError:
            return DeliveryResult("unavailable", "not a room id")
        if request.run_id is None:
            return DeliveryResult("unavailable", "a room post needs its run")
        status, detail = await self.rooms.post(
            room_id, request.account_id, request.body, run_id=request.run_id, seq=request.seq,
            turn_id=request.turn_id,
        )  # fmt: skip
        return DeliveryResult(status, detail, detail if status == "delivered" else None)

    async def _phone(self, request: DeliveryRequest) -> DeliveryResult:
        db = self.db
        handle = await identity.first_verified_handle(db, request.account_id, "phone")
        if handle is None:
            return DeliveryResult("unavailable", "no verified phone number")
        if await identity.is_blocked(db, handle.id, request.channel):
            return DeliveryResult("unavailable", "the person opted out on this channel")
        line = await identity.personal_line(db, request.account_id)
        if line is None:
            return DeliveryResult("unavailable", "the account has no personal line to send from")
        if self.messenger is None:
            return DeliveryResult("unavailable", "Twilio is not configured")
        prefix = "whatsapp:" if request.channel == "whatsapp" else ""
        callback = public_request_url(self.settings, MESSAGE_STATUS.path)
        conversation_id = await conversation_for(db, request.account_id)
        first_sid: str | None = None
        parts = split_message(request.body)
        # Every part recorded before the first goes out (as ``gateway.messaging.TwilioChannel`` does):
        # a receipt for part 1 then sees the rest unsent and does not settle the run's turn.
        ids = await record_unsent_parts(
            db, conversation_id, request.channel, parts, handle_id=handle.id, turn_id=request.turn_id
        )
        for index, (part, message_id) in enumerate(zip(parts, ids, strict=True)):
            try:
                sid = await self.messenger.send(
                    to=prefix + handle.value, from_=prefix + line.number, body=part, status_callback=callback
                )
            except PepperError as exc:
                log.error("sending a scheduled %s message failed: %s", request.channel, exc.code)
                await mark_parts_failed(db, ids[index:])
                return DeliveryResult("failed", exc.code)
            first_sid = first_sid or sid
            await mark_part_sent(db, message_id, sid)
        return DeliveryResult("queued", "", first_sid)

    async def _call(self, request: DeliveryRequest) -> DeliveryResult:
        if self.outbound is None:
            return DeliveryResult("unavailable", "phone calls are not set up")
        run_id = await outbound_records.run_of(self.db, request.task_id, request.occurrence_at)
        placed = await self.outbound.deliver(
            request.account_id, task_id=request.task_id, run_id=run_id, key=request.key, brief=request.body
        )
        return DeliveryResult(placed.status, placed.detail, placed.call_sid)

    async def _email(self, request: DeliveryRequest) -> DeliveryResult:
        db = self.db
        if self.mailer is None:
            return DeliveryResult("unavailable", "Pepper's mail account (SMTP) is not configured")
        handle = await identity.first_verified_handle(db, request.account_id, "email")
        if handle is None:
            return DeliveryResult("unavailable", "no verified email address")
        if await identity.is_blocked(db, handle.id, "email"):
            return DeliveryResult("unavailable", "the person opted out of email")
        if await was_sent(db, "email", request.key):
            return DeliveryResult("delivered", "already sent", request.key)
        message = EmailMessage()
        message["From"] = formataddr((self.mailer.from_name, self.mailer.from_address))
        message["To"] = handle.value
        message["Subject"] = _subject(request.body)
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = make_msgid(domain=self.mailer.from_address.rsplit("@", 1)[-1])
        message["Auto-Submitted"] = "auto-generated"  # RFC 3834: a scheduled message, not a reply
        message.set_content(request.body)
        try:
            await self.mailer.send(message, [handle.value])
        except PepperError as exc:
            log.error("sending a scheduled email failed: %s", exc.code)
            return DeliveryResult("failed", exc.code)
        conversation_id = await conversation_for(db, request.account_id)
        await record_sent_once(
            db, conversation_id, "email", request.body, provider_message_id=request.key, delivery_status="sent",
            handle_id=handle.id, turn_id=request.turn_id,
        )  # fmt: skip
        return DeliveryResult("delivered", "", request.key)


def _subject(body: str) -> str:
    first = next((line.strip() for line in body.splitlines() if line.strip()), "")
    return "Pepper: " + (first if len(first) <= 70 else first[:67].rstrip() + "...") if first else "Pepper"


def scheduler_config(settings: Settings) -> SchedulerConfig:
    from datetime import timedelta

    return SchedulerConfig(
        catch_up=timedelta(hours=settings.scheduler_catch_up_hours),
        lease=timedelta(seconds=settings.scheduler_lease_seconds),
        heartbeat=timedelta(seconds=max(1.0, settings.scheduler_lease_seconds / 4)),
        poll=settings.scheduler_poll_seconds,
        drain_grace=settings.graceful_timeout,
    )


def build_scheduler(settings: Settings, harness: HarnessDeps, messenger: Any = None, mailer: Any = None) -> Scheduler:
    """The scheduler with its deliverer; the deliverer's calls (``voice.outbound``) dial their due
    retries while the scheduler runs (``start_outbound``/``stop_outbound``)."""
    from gateway.composition import outbound_from_settings

    poster = None
    if settings.rooms_enabled:
        from gateway.rooms.homeserver import pepper_client
        from gateway.rooms.posting import RoomPoster

        poster = RoomPoster(harness.db, lambda: pepper_client(settings))
    outbound = outbound_from_settings(settings, harness.db)
    deliverer = GatewayDeliverer(settings, harness.db, messenger, mailer, poster, outbound)
    return Scheduler(harness, deliverer, scheduler_config(settings), follows=follow_checks(settings, harness))


def follow_config(settings: Settings) -> FollowConfig:
    from datetime import timedelta

    return FollowConfig(tier=settings.follow_tier, page_every=timedelta(hours=settings.follow_page_hours))


def follow_checks(settings: Settings, harness: HarnessDeps) -> Following:
    """The checks of followed sources, on the scheduler beside the runs, under the web relay's rules."""
    connectors = harness.connectors or Connectors.from_settings(settings)
    return Following.from_connectors(harness.db, connectors, harness.models, follow_config(settings))


def start_outbound(scheduler: Scheduler) -> None:
    outbound = getattr(scheduler.deliverer, "outbound", None)
    if outbound is not None:
        outbound.start()


async def stop_outbound(scheduler: Scheduler) -> None:
    close = getattr(scheduler.deliverer, "aclose", None)
    if close is not None:
        await close()


def attach_scheduler(
    app: Any, settings: Settings, harness: HarnessDeps, messenger: Any = None, mailer: Any = None
) -> Scheduler:
    """Start the scheduler when the app starts serving; stop it first when it stops (before the
    messenger and the model router close), letting runs in flight finish within the grace time."""
    scheduler = build_scheduler(settings, harness, messenger, mailer)
    app.extensions["pepper-scheduler"] = scheduler

    async def start() -> None:
        scheduler.start()
        start_outbound(scheduler)

    async def stop() -> None:
        await scheduler.stop(settings.graceful_timeout)
        await stop_outbound(scheduler)

    app.before_serving(start)
    app.after_serving_funcs.insert(0, stop)
    return scheduler
