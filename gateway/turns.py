"""Answering one recorded inbound message, the same way on every text channel."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

from core.conversation import finish_handling
from core.errors import PepperError
from gateway.services import Services
from text_loop import deliver, run_turn

log = logging.getLogger(__name__)

APOLOGY_TEXT = "Sorry, something went wrong on my side and I couldn't answer that. Please try again."

SendReply = Callable[[UUID | None, str], Awaitable[None]]


async def answer_message(
    services: Services,
    account_id: UUID,
    channel: str,
    text: str,
    message_ids: Sequence[int],
    send: SendReply,
    *,
    interrupted: UUID | None = None,
) -> None:
    """Run the turn of the messages this process claimed and ``send(turn_id, reply)``.

    ``text`` is what the person wrote: one message, or a burst of texts answered together.

    The person always hears back: a turn that crashes sends an apology (``turn_id`` None) instead
    of silence. ``interrupted`` is the turn a worker that died mid-turn left for this message:
    running it again could repeat what it already did, so the person gets the apology and that
    turn's staged writes are dropped. The messages are marked answered once the send was attempted.
    """
    turn_id: UUID | None = None
    try:
        if interrupted is not None:
            status = await services.db.fetchval("SELECT status FROM turns WHERE id = $1", interrupted)
            if status != "running":  # the worker died after the reply went out: nothing to add
                await finish_handling(services.db, message_ids)
                return
            log.warning("a worker stopped in the middle of a %s turn; apologising", channel)
            await report_delivery(services, interrupted, ok=False, detail={"reason": "worker-died"})
            reply = APOLOGY_TEXT
        else:
            if services.harness is None:
                raise PepperError("the text harness is not configured")
            outcome = await run_turn(services.harness, account_id, channel, text, inbound_message_ids=message_ids)
            turn_id, reply = outcome.turn_id, outcome.reply
    except Exception:
        log.exception("turn failed on %s", channel)
        reply = APOLOGY_TEXT
    try:
        await send(turn_id, reply)
    finally:
        await finish_handling(services.db, message_ids, durable=turn_id is None)


async def report_delivery(services: Services, turn_id: UUID | None, *, ok: bool, detail: dict[str, Any]) -> None:
    """Tell the harness whether a turn's reply reached the person (commit or drop its staged writes)."""
    if turn_id is None or services.harness is None:
        return
    await deliver(services.harness, turn_id, ok, detail=detail)
