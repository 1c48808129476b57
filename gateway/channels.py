"""The text channels (SMS and WhatsApp, email, web chat) and the one pipeline they share.

A channel's inbound side (a webhook, a web post) checks the request and records the message with
:func:`receive`: queued for a turn, or skipped when it needs none; a retried delivery (the same
provider id) finds its message and queues nothing. A turn worker (``gateway.worker``) claims the
queued messages and :class:`Pipeline` answers them, the same way on every channel:

claimed -> (opted out: skipped, no turn) -> run the turn -> the reply, split to the channel's
limit -> (opted out meanwhile: not sent) -> the channel delivers it (:meth:`Channel.deliver`) ->
delivered: the turn's staged writes commit; failed: they are dropped; pending: the channel
settles it later (:func:`settle_delivery`) on the provider's receipt or the client's
acknowledgement -> the messages are marked answered.

No channel retries a reply that failed: the turn's writes are dropped and the person can write
again (the providers retry their own hops). A turn that crashes still answers, with an apology.

A new text channel is a :class:`Channel` (its name, limits, whether a claimed message can be
answered, how a reply goes out) listed in ``gateway.composition.text_channels``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from core import identity
from core.conversation import Message, announce_message, finish_handling, record_inbound
from core.errors import PepperError
from core.records.turns import turn_status, unsent_reply
from core.store.queries import Queries
from gateway.segments import split_message
from gateway.services import Services
from text_loop import deliver, run_turn

log = logging.getLogger(__name__)

APOLOGY_TEXT = "Sorry, something went wrong on my side and I couldn't answer that. Please try again."

DELIVERED, PENDING, FAILED = "delivered", "pending", "failed"


@dataclass(frozen=True)
class Limits:
    """What a channel carries: the longest text of a message from the person it takes (longer:
    the web refuses it, email cuts it; None: no limit of ours), and the longest reply message it
    sends (None: one message, however long; a longer reply goes out in parts of at most this many
    characters). ``streams``: an open page watches the reply as it is made (the text as the model
    streams it, each tool as it starts), announced through ``gateway.live.ProgressPublisher``."""

    inbound_chars: int | None = None
    reply_part_chars: int | None = None
    streams: bool = False


@dataclass(frozen=True)
class Delivery:
    """What became of a reply: ``delivered`` (commit the turn's writes), ``failed`` (drop them),
    or ``pending`` (the channel settles it later with :func:`settle_delivery`). ``detail`` goes
    into the turn record's delivery."""

    state: str
    detail: dict[str, Any] = field(default_factory=dict)


def delivered(**detail: Any) -> Delivery:
    return Delivery(DELIVERED, detail)


def failed(reason: str, **detail: Any) -> Delivery:
    return Delivery(FAILED, {"reason": reason, **detail})


AWAITING_RECEIPT = Delivery(PENDING)


@dataclass(frozen=True)
class Claimed:
    """The messages one turn answers, as a turn worker claimed them (several only for a burst of
    texts from one sender). ``interrupted``: the turn a worker that died mid-turn left for them."""

    channel: str
    account_id: UUID
    handle_id: UUID | None
    message_ids: tuple[int, ...]
    text: str  # what the person wrote: the texts of a burst reach the model as one message, a line each
    meta: dict[str, Any]  # the channel's details a reply needs, recorded with the first message
    interrupted: UUID | None

    @classmethod
    def of(cls, rows: Sequence[Any]) -> Claimed:
        row = rows[0]
        meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"] or "{}")
        return cls(
            row["channel"], row["account_id"], row["handle_id"], tuple(r["id"] for r in rows),
            "\n".join(r["body"] for r in rows), meta, row["turn_id"],
        )  # fmt: skip

    @property
    def consent_applies(self) -> bool:
        return self.handle_id is not None and self.channel in identity.CONSENT_CHANNELS


class Channel(Protocol):
    """One text channel, as the pipeline sees it."""

    @property
    def name(self) -> str:
        """The channel recorded on its messages and turns (``core.conversation.MESSAGE_CHANNELS``)."""
        ...

    @property
    def limits(self) -> Limits: ...

    def can_reply(self, claimed: Claimed) -> bool:
        """Whether the claimed messages carry what a reply needs (an address to send it to)."""
        ...

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        """Send the reply (in ``parts``, already split to ``limits``) and record it in the
        conversation. ``turn_id`` is None for an apology that belongs to no turn."""
        ...

    # Optional: ``async def resume_unsent(services, claimed, turn_id) -> Delivery | None``, for a
    # channel that records a reply before sending it: what became of the parts a dead worker left
    # recorded but unconfirmed (None: it left none). ``gateway.messaging.TwilioChannel`` has it.


async def receive(
    db: Queries, channel: str, account_id: UUID, text: str, *, key: str | None, handle_id: UUID | None = None,
    meta: dict[str, Any] | None = None, queued: bool = True, announce: bool = False,
) -> tuple[Message, bool]:  # fmt: skip
    """Record a message from the person on ``channel``; return it and whether this call created it.

    ``key`` is the provider's id for it: a second delivery with the same key returns the first
    message and ``False``, and nothing is queued again. ``queued``: a turn worker answers it;
    otherwise it is recorded as needing no turn (a keyword, an automatic mail). ``announce``:
    ``db`` is a session that announces after the commit (``core.conversation.ANNOUNCE_LATER``).
    """
    message, created = await record_inbound(
        db, account_id, channel, text, provider_message_id=key, handle_id=handle_id,
        handling="queued" if queued else "skipped", meta=meta,
    )  # fmt: skip
    if not created:
        log.info("duplicate delivery of a %s message; already handled", channel)
    elif announce:
        # Lost only if this process dies right here: the workers' sweep finds it anyway.
        await announce_message(db, message, queued=queued)
    return message, created


async def settle_delivery(services: Services, turn_id: UUID | None, *, ok: bool, detail: dict[str, Any]) -> None:
    """Tell the harness whether a turn's reply reached the person (commit or drop its staged writes)."""
    if turn_id is None or services.harness is None:
        return
    await deliver(services.harness, turn_id, ok, detail=detail)


class Pipeline:
    """Answers claimed messages on their channel."""

    def __init__(
        self, services: Services, channels: Iterable[Channel], progress: Callable[[dict[str, str]], None] | None = None
    ) -> None:
        self._services = services
        self._channels = {channel.name: channel for channel in channels}
        self._progress = progress

    async def answer(self, rows: Sequence[Any]) -> None:
        services, claimed = self._services, Claimed.of(rows)
        ids = list(claimed.message_ids)
        if claimed.consent_applies:
            assert claimed.handle_id is not None
            if await identity.is_blocked(services.db, claimed.handle_id, claimed.channel):
                # Checked here, not when recording: the acknowledgement stays one statement.
                log.info("message recorded from an opted-out handle; no turn, no reply")
                await finish_handling(services.db, ids, handling="skipped")
                return
        channel = self._channels.get(claimed.channel)
        if channel is None or not channel.can_reply(claimed):
            log.error("messages %s on %s cannot be answered (missing reply details)", ids, claimed.channel)
            await finish_handling(services.db, ids)
            return
        await self._run(channel, claimed)

    async def _run(self, channel: Channel, claimed: Claimed) -> None:
        """Run the turn and deliver its reply.

        The person always hears back: a turn that crashes sends an apology (no turn) instead of
        silence. A turn a dead worker left ``running`` is not run again (that could repeat what it
        already did): the person gets the apology and that turn's staged writes are dropped; one it
        left finished, with its reply never recorded, has that reply sent now. The messages are
        marked answered once the reply's delivery was attempted.
        """
        services, ids = self._services, list(claimed.message_ids)
        turn_id: UUID | None = None
        try:
            if claimed.interrupted is not None:
                status = await turn_status(services.db, claimed.interrupted)
                resume = getattr(channel, "resume_unsent", None)
                replied = status == "replied"
                resumed = await resume(services, claimed, claimed.interrupted) if resume and replied else None
                unsent = await unsent_reply(services.db, claimed.interrupted) if replied and not resumed else None
                if resumed is not None:
                    # The worker died while sending: its parts recorded ``sending`` were looked up at
                    # the provider (found: taken as sent; not found: sent now), never simply sent again.
                    if resumed.state != PENDING:
                        await settle_delivery(services, claimed.interrupted, ok=resumed.state == DELIVERED,
                                              detail=resumed.detail)  # fmt: skip
                    await finish_handling(services.db, ids)
                    return
                if unsent is not None:
                    # The worker died after the turn and before its reply was recorded (found by
                    # scripts/suite-two-servers): send it now, as the turn's.
                    log.warning("a worker stopped before sending a %s reply; sending it", channel.name)
                    turn_id, reply = claimed.interrupted, unsent
                elif status != "running":
                    # The worker died after the reply went out: nothing to add.
                    await finish_handling(services.db, ids)
                    return
                else:
                    log.warning("a worker stopped in the middle of a %s turn; apologising", channel.name)
                    await settle_delivery(services, claimed.interrupted, ok=False, detail={"reason": "worker-died"})
                    reply = APOLOGY_TEXT
            else:
                if services.harness is None:
                    raise PepperError("the text harness is not configured")
                progress = self._progress if channel.limits.streams else None
                outcome = await run_turn(
                    services.harness, claimed.account_id, channel.name, claimed.text, inbound_message_ids=ids,
                    progress=progress,
                )  # fmt: skip
                turn_id, reply = outcome.turn_id, outcome.reply
        except Exception:
            log.exception("turn failed on %s", channel.name)
            reply = APOLOGY_TEXT
        try:
            await self._deliver(channel, claimed, turn_id, reply)
        finally:
            await finish_handling(services.db, ids, durable=turn_id is None)

    async def _deliver(self, channel: Channel, claimed: Claimed, turn_id: UUID | None, reply: str) -> None:
        services = self._services
        if claimed.consent_applies:
            assert claimed.handle_id is not None
            if await identity.is_blocked(services.db, claimed.handle_id, claimed.channel):  # a STOP meanwhile
                await settle_delivery(services, turn_id, ok=False, detail={"reason": "opted-out"})
                return
        limit = channel.limits.reply_part_chars
        parts = split_message(reply, limit) if limit else [reply]
        outcome = await channel.deliver(services, claimed, turn_id, parts)
        if outcome.state != PENDING:
            await settle_delivery(services, turn_id, ok=outcome.state == DELIVERED, detail=outcome.detail)
