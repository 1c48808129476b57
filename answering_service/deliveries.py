"""Sending what answering calls promised: the callers' confirmation texts and the owner's notices.

A call never sends these itself. Each is recorded in ``answering_deliveries`` in the same
transaction as the write it is about (a booking's confirmation text with the booking, the owner's
notice with the message or booking), so once the caller has heard "you're booked" the text is on
record whatever happens to the call next. The turn workers (``gateway.worker``), which own
Pepper's outgoing deliveries, claim due rows with ``FOR UPDATE SKIP LOCKED`` (each row goes to one
worker) and send them:

* ``caller_text``: the fixed text recorded with the booking, to the caller ID it was recorded for,
  from the line the caller rang;
* ``owner_notice``: :meth:`~answering_service.notify.OwnerNotifier.after_call` for the call, which
  announces the call's message and bookings once each (its own claims), on the owner's channel.

A failed caller text is tried again a little later, up to ``MAX_ATTEMPTS`` times. A row left
``sending`` by a worker that died mid-send is taken up again after ``STALE_SENDING``: a text may
then go twice, which is better than never.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from answering_service.notify import OwnerNotifier
from core.records import answering
from core.store.queries import Queries

log = logging.getLogger(__name__)

SendSms = Callable[[str, str, str], Awaitable[None]]  # (to, from_, body)

MAX_ATTEMPTS = 3
RETRY_AFTER = timedelta(seconds=30)
STALE_SENDING = timedelta(minutes=2)
BATCH = 20


async def deliver_due(db: Queries, notifier: OwnerNotifier, send_sms: SendSms | None) -> int:
    """Send every delivery due now (in batches); returns how many were claimed."""
    total = 0
    while rows := await answering.claim_due_deliveries(db, stale=STALE_SENDING, limit=BATCH):
        total += len(rows)
        for row in rows:
            await _deliver_one(db, notifier, send_sms, row)
    return total


async def _deliver_one(db: Queries, notifier: OwnerNotifier, send_sms: SendSms | None, row: Any) -> None:
    try:
        if row["kind"] == "caller_text":
            if send_sms is None:
                raise _NotSetUp("sending SMS is not configured")
            await send_sms(row["to_number"], row["from_number"], row["body"])
        else:
            await notifier.after_call(row["call_sid"])
    except Exception as exc:  # CancelledError passes: the row stays 'sending' and is taken up again
        log.warning("an answering-service delivery failed: kind=%s attempt=%s", row["kind"], row["attempts"],
                    exc_info=not isinstance(exc, _NotSetUp))  # fmt: skip
        final = row["kind"] != "caller_text" or row["attempts"] >= MAX_ATTEMPTS or isinstance(exc, _NotSetUp)
        await answering.delivery_failed(
            db, row["id"], final=final, error=str(exc)[:300] or type(exc).__name__, retry_after=RETRY_AFTER
        )
        return
    await answering.delivery_sent(db, row["id"])


class _NotSetUp(Exception):
    pass
