"""Twilio SMS and WhatsApp: inbound webhooks, consent keywords, replies and delivery receipts.

One inbound message: check the signature -> resolve the sender to an account -> record the message
as queued (``gateway.channels.receive``, idempotent on ``MessageSid``) -> acknowledge with empty
TwiML. A turn worker (``gateway.worker``) then claims it and runs the turn (``gateway.channels``);
``TwilioChannel`` sends the reply through the REST API with a status callback. A reply too long
for one message goes out in parts, all recorded before the first is sent: once every part is
``sent``, ``delivered`` or ``read``, the turn's staged writes commit; a ``failed``,
``undelivered`` or ``canceled`` part drops them.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from quart import Blueprint, Response, current_app, request

from core import identity
from core.adapters.twilio import twiml
from core.adapters.twilio.signatures import public_request_url, twilio_signature_ok
from core.conversation import (
    UNSENT,
    conversation_for,
    known_provider_ids,
    mark_part_sent,
    mark_parts_failed,
    mark_parts_unknown,
    record_outbound,
    unsent_parts,
)
from core.errors import InvalidInput, PepperError
from core.records import messages, texts
from core.records.turns import SETTLED
from core.security import record_security_event
from core.store import when_reachable
from gateway.channels import (
    AWAITING_RECEIPT,
    PENDING,
    Claimed,
    Delivery,
    Limits,
    delivered,
    failed,
    receive,
    settle_delivery,
)
from gateway.segments import MESSAGE_LIMIT
from gateway.services import Services
from gateway.webhooks import MESSAGE_STATUS, SMS, WHATSAPP

log = logging.getLogger(__name__)

# Twilio's default single-word keywords (case-insensitive, whole message), current list.
OPT_OUT_WORDS = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"})
OPT_IN_WORDS = frozenset({"START", "YES", "UNSTOP"})
HELP_WORDS = frozenset({"HELP", "INFO"})

HELP_TEXT = (
    "Pepper, your personal assistant. Text anything to talk to it. Reply STOP to stop all messages "
    "and calls, START to resume."
)
UNKNOWN_SENDER_TEXT = "Sorry, this number only answers the people it works for."

# A part counts as delivered once Twilio reports it sent (handed to the carrier: not every carrier
# confirms delivery), delivered or read (WhatsApp); a turn's reply is delivered when every part is.
DELIVERED = frozenset({"sent", "delivered", "read"})
NOT_DELIVERED = frozenset({"failed", "undelivered", "canceled"})

blueprint = Blueprint("messaging", __name__)


@dataclass(frozen=True)
class Inbound:
    channel: str  # "sms" or "whatsapp"
    sid: str
    sender: str  # as Twilio sent it, e.g. "whatsapp:+14155550100": replies go back here
    recipient: str  # our number as Twilio sent it
    body: str
    opt_out_type: str | None


def _services() -> Services:
    return current_app.extensions["pepper"]


@dataclass(frozen=True)
class Answer:
    """A webhook's answer, independent of the web framework (Quart or ``gateway.messaging_asgi``)."""

    status: int
    body: bytes
    content_type: str
    duplicate: bool = False  # a delivery already recorded (counted as such in ``pepper_webhooks``)


def twiml_answer(text: str | None = None) -> Answer:
    if not text:
        return EMPTY_TWIML
    return Answer(200, twiml.message_reply(text).encode(), "application/xml")


# Built once: the acknowledgement almost every webhook gets.
EMPTY_TWIML = Answer(200, twiml.message_reply().encode(), "application/xml")
DUPLICATE = Answer(EMPTY_TWIML.status, EMPTY_TWIML.body, EMPTY_TWIML.content_type, duplicate=True)
REFUSED = Answer(403, b"invalid signature\n", "text/plain")
INCOMPLETE = Answer(400, b"MessageSid, From and To are required\n", "text/plain")


def response(answer: Answer) -> Response:
    return Response(answer.body, status=answer.status, content_type=answer.content_type or None)


def keyword(body: str) -> str | None:
    word = body.strip().upper()
    if word in OPT_OUT_WORDS:
        return "STOP"
    if word in OPT_IN_WORDS:
        return "START"
    if word in HELP_WORDS:
        return "HELP"
    return None


async def signed(services: Services, path: str, query_string: bytes, form: Any, headers: Any) -> bool:
    """True for a form Twilio signed; a refusal is logged and recorded as a security event."""
    url = public_request_url(services.settings, path, query_string)
    if twilio_signature_ok(services.settings, url, form, headers):
        return True
    log.warning("refused a webhook with a missing or invalid Twilio signature")
    await record_security_event(services.db, "twilio-signature-invalid", path=path)
    return False


def _inbound(form: Any, channel: str) -> Inbound | None:
    sid = form.get("MessageSid") or form.get("SmsMessageSid")
    sender, recipient = form.get("From"), form.get("To")
    if not sid or not sender or not recipient:
        return None
    return Inbound(channel, sid, sender, recipient, form.get("Body", ""), form.get("OptOutType"))


@blueprint.post(SMS.path)
async def sms_webhook() -> Response:
    return await _handle_inbound("sms")


@blueprint.post(WHATSAPP.path)
async def whatsapp_webhook() -> Response:
    return await _handle_inbound("whatsapp")


async def _handle_inbound(channel: str) -> Response:
    form = await request.form
    answer = await answer_inbound(_services(), channel, request.path, request.query_string, form, request.headers)
    return response(answer)


async def answer_inbound(
    services: Services, channel: str, path: str, query_string: bytes, form: Any, headers: Any
) -> Answer:
    """One inbound SMS or WhatsApp webhook, from its parsed form to its answer (Quart's route and
    the thin ASGI layer in ``gateway.messaging_asgi`` both end here)."""
    if not await signed(services, path, query_string, form, headers):
        return REFUSED
    inbound = _inbound(form, channel)
    if inbound is None:
        return INCOMPLETE
    settings, db = services.settings, services.db

    ack_db = services.ack_db  # the hot path: its pool skips the reset round trip (``Database.side_pool``)
    handle = await identity.find_handle(ack_db, "phone", inbound.sender, default_region=settings.default_region)
    if handle is None or not handle.verified:
        # A number that belongs to no account (or is not verified) never reaches anyone's agent.
        if channel == "sms" and keyword(inbound.body) is None:
            reply = await _answering_reply(services, inbound)
            if reply is not None:
                return twiml_answer(reply)
        word = (inbound.opt_out_type or "").upper() or keyword(inbound.body)
        if word in ("STOP", "START"):
            if handle is None:  # a contact Pepper texted for someone
                with contextlib.suppress(PepperError):
                    number = identity.normalize_phone(inbound.sender, settings.default_region)
                    await texts.set_opt_out(db, number, stopped=word == "STOP")
            await _line_consent(services, inbound, opted_out=word == "STOP")  # their calls to this line too
        log.info("message from a number with no verified account on %s", channel)
        if settings.unknown_sender == "reply" and keyword(inbound.body) is None:
            return twiml_answer(UNKNOWN_SENDER_TEXT)
        return twiml_answer()

    word = (inbound.opt_out_type or "").upper() or keyword(inbound.body)
    meta = {"from": inbound.sender, "to": inbound.recipient}
    if word is None:
        # The common case, kept to one durable statement: an opted-out sender's message is queued
        # too, and the turn worker records it as skipped without a turn (``gateway.channels``).
        _, created = await receive(
            ack_db, channel, handle.account_id, inbound.body, key=inbound.sid, handle_id=handle.id, meta=meta,
            announce=True,
        )  # fmt: skip
        return twiml_answer() if created else DUPLICATE
    async with db.transaction() as conn:
        # A keyword's consent change commits with the message, so a retried STOP after a crash
        # is never recorded-but-not-applied.
        _, created = await receive(
            conn, channel, handle.account_id, inbound.body, key=inbound.sid, handle_id=handle.id, meta=meta,
            queued=False,
        )  # fmt: skip
        if created and word in ("STOP", "START"):
            # One STOP blocks every channel that reaches the number: SMS, WhatsApp and calls.
            await identity.set_consent(
                conn, handle.id, identity.PHONE_CHANNELS, opted_out=word == "STOP", source=f"{channel} {word}"
            )
    if not created:
        return DUPLICATE
    if word == "HELP" and not inbound.opt_out_type:
        return twiml_answer(HELP_TEXT)  # with Advanced Opt-Out (OptOutType present) Twilio has already answered
    return twiml_answer()  # Twilio confirms opt-outs itself; nothing more is ever sent after STOP


async def _line_consent(services: Services, inbound: Inbound, *, opted_out: bool) -> None:
    """A stranger's STOP (or START) to a line: recorded for that line, so their calls to it are
    refused too (``voice.routing``). Twilio stops the texts itself."""
    from core.records.outbound import set_line_opt_out

    region = services.settings.default_region
    try:
        number = identity.normalize_phone(inbound.sender.removeprefix("whatsapp:"), region)
        line = identity.normalize_phone(inbound.recipient.removeprefix("whatsapp:"), region)
    except InvalidInput:
        return
    await set_line_opt_out(services.db, line, number, opted_out=opted_out)
    log.info("a stranger's %s to a line was recorded", "STOP" if opted_out else "START")


async def _answering_reply(services: Services, inbound: Inbound) -> str | None:
    """A caller who booked through the answering service, cancelling or moving by text: fixed
    rules in ``answering_service.sms``, never the owner's agent. None when it is not that."""
    from answering_service.sms import handle_caller_text

    region = services.settings.default_region
    try:
        number = identity.normalize_phone(inbound.sender, region)
        line = identity.normalize_phone(inbound.recipient, region)
    except PepperError:
        return None
    return await handle_caller_text(
        services.db, number, inbound.body, line=line, notifier=getattr(services.calls, "notifier", None)
    )


class TwilioChannel:
    """SMS or WhatsApp through Twilio (``gateway.channels.Channel``): a reply goes back from the
    number the person wrote to, with a status callback; Twilio's receipts settle it
    (:func:`answer_status`)."""

    limits = Limits(reply_part_chars=MESSAGE_LIMIT)

    def __init__(self, name: str) -> None:
        self.name = name  # "sms" or "whatsapp"

    def can_reply(self, claimed: Claimed) -> bool:
        return bool(claimed.meta.get("from") and claimed.meta.get("to") and claimed.handle_id)

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        db, channel = services.db, self.name
        conversation_id = await conversation_for(db, claimed.account_id)
        if services.messenger is None:
            log.error("cannot reply on %s: Twilio credentials are not configured", channel)
            return failed("twilio-not-configured")
        callback = public_request_url(services.settings, MESSAGE_STATUS.path)
        # Every part is recorded (``sending``) before the first goes out: a receipt for part 1 (which
        # may come back before part 2 is even sent) sees parts still unsent and settles nothing, and
        # a process killed between Twilio taking a part and Pepper recording its MessageSid leaves a
        # row that says so (:meth:`resume_unsent` finds out what became of it, instead of resending).
        recorded = [
            await record_outbound(db, conversation_id, channel, part, turn_id=turn_id, delivery_status=UNSENT)
            for part in parts
        ]
        return await self._send(services, claimed, recorded, callback)

    async def _send(self, services: Services, claimed: Claimed, recorded: list[Any], callback: str | None) -> Delivery:
        """Send the recorded parts in order, each marked with its MessageSid once Twilio took it."""
        messenger, sender, recipient = services.messenger, claimed.meta["from"], claimed.meta["to"]
        assert messenger is not None
        for index, part in enumerate(recorded):
            try:
                sid = await messenger.send(to=sender, from_=recipient, body=part.body, status_callback=callback)
            except PepperError as exc:
                log.error("sending a %s reply failed: %s", self.name, exc.code)
                await mark_parts_failed(services.db, [m.id for m in recorded[index:]])  # never went out
                return failed("send-failed", code=exc.code)
            # It went out: its record follows, through a restart of the database too (else the
            # recovery of the turn finds it still sending and has to look it up at Twilio).
            await when_reachable(mark_part_sent, services.db, part.id, sid, what="a sent reply")
        return AWAITING_RECEIPT

    async def resume_unsent(self, services: Services, claimed: Claimed, turn_id: UUID) -> Delivery | None:
        """The parts of a turn's reply a dead worker left ``sending`` (recorded, then killed before it
        heard back from Twilio): each found in Twilio's message list takes its MessageSid and status
        from there, each not found is sent now; when the list cannot be read they are marked
        ``sent-unknown`` and not sent again (a second copy is worse than a doubt). None when the
        turn left no such part."""
        db = services.db
        unsent = await unsent_parts(db, turn_id)
        if not unsent:
            return None
        if services.messenger is None:
            await mark_parts_unknown(db, [m["id"] for m in unsent])
            return failed("sent-unknown")
        sender, recipient = claimed.meta["from"], claimed.meta["to"]
        to_send: list[Any] = []
        for index, row in enumerate(unsent):
            try:
                found = await services.messenger.find_sent(to=sender, from_=recipient, body=row["body"],
                                                           since=row["created_at"])  # fmt: skip
            except PepperError as exc:
                log.error("cannot tell whether a %s reply cut short by a crash went out: %s", self.name, exc.code)
                await mark_parts_unknown(db, [m["id"] for m in (*to_send, *unsent[index:])])
                return failed("sent-unknown", code=exc.code)
            known = await known_provider_ids(db, self.name, [sid for sid, _ in found])
            fresh = [(sid, status) for sid, status in found if sid not in known]
            if fresh:
                sid, status = fresh[-1]  # the oldest after the row: the one this row was sent as
                await mark_part_sent(db, row["id"], sid, status)
            else:
                to_send.append(row)
        log.warning("a %s reply cut short by a crash: %d part(s) found at Twilio, %d sent now", self.name,
                    len(unsent) - len(to_send), len(to_send))  # fmt: skip
        if to_send:
            callback = public_request_url(services.settings, MESSAGE_STATUS.path)
            parts = [_Part(r["id"], r["body"]) for r in to_send]
            outcome = await self._send(services, claimed, parts, callback)
            if outcome.state != PENDING:
                return outcome
        statuses = await messages.reply_statuses(db, turn_id)
        if any(s in NOT_DELIVERED for s in statuses):
            return failed("not-delivered")
        if all(s in DELIVERED for s in statuses):
            return delivered(resumed=True)
        return AWAITING_RECEIPT


@dataclass(frozen=True)
class _Part:
    id: int
    body: str


SMS_CHANNEL, WHATSAPP_CHANNEL = TwilioChannel("sms"), TwilioChannel("whatsapp")


@blueprint.post(MESSAGE_STATUS.path)
async def message_status() -> Response:
    """Twilio's delivery receipts for the replies Pepper sent (usually served by
    ``gateway.messaging_asgi``; Quart gets only what that layer passes on)."""
    form = await request.form
    return response(await answer_status(_services(), request.path, request.query_string, form, request.headers))


NO_CONTENT = Answer(204, b"", "")
STATUS_INCOMPLETE = Answer(400, b"MessageSid and MessageStatus are required\n", "text/plain")


async def answer_status(services: Services, path: str, query_string: bytes, form: Any, headers: Any) -> Answer:
    """One delivery receipt: record the reply's status; once every part of a turn's reply is
    delivered (or one failed), commit (or drop) the turn's staged writes."""
    if not await signed(services, path, query_string, form, headers):
        return REFUSED
    sid, status = form.get("MessageSid"), (form.get("MessageStatus") or "").lower()
    if not sid or not status:
        return STATUS_INCOMPLETE
    ack_db = services.ack_db or services.db
    row = await messages.record_receipt(ack_db, sid, status)
    if row is None and await texts.record_receipt(ack_db, sid, status):
        return NO_CONTENT  # a text Pepper sent for the person (the messages area)
    if row is None or row["turn_id"] is None or row["turn_status"] in SETTLED:
        return NO_CONTENT  # not ours, or already settled: a late receipt changes nothing
    turn_id = row["turn_id"]
    # A statement of its own, after the update committed: of two parts' receipts racing, the later
    # one sees both statuses (one statement's snapshot could miss the other's and neither settle).
    statuses = await messages.reply_statuses(ack_db, turn_id)
    if any(s in NOT_DELIVERED for s in statuses):
        await settle_delivery(services, turn_id, ok=False, detail={"status": status})
    elif all(s in DELIVERED for s in statuses):
        await settle_delivery(services, turn_id, ok=True, detail={"status": status})
    return NO_CONTENT
