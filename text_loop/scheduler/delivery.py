"""Where a scheduled run's result goes: the ``Deliverer`` protocol the gateway implements.

The scheduler owns idempotency: every delivery carries a key made of the task, the occurrence
and the channel, recorded in ``task_deliveries`` before the send. A re-run after a crash finds
the key already delivered and does not post again. A deliverer should also use the key where
its channel can (the chat deliverer stores it as the message's provider id, which is unique).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol
from uuid import UUID

# delivered: the person can see it now (chat). queued: the provider accepted it (SMS, WhatsApp);
# its delivery receipt settles the turn later. failed: tried and it did not work.
# unavailable: this channel cannot reach the person (not set up, opted out, no number): the
# scheduler falls back to chat.
DeliveryStatus = Literal["delivered", "queued", "failed", "unavailable"]


@dataclass(frozen=True)
class DeliveryRequest:
    key: str
    account_id: UUID
    channel: str  # chat, sms, whatsapp, email or room:<room id>
    body: str
    task_id: int
    occurrence_at: datetime
    turn_id: UUID | None = None
    run_id: int | None = None
    seq: int = 0  # the channel's place in the run's channels: with the run, a room post's transaction id


@dataclass(frozen=True)
class DeliveryResult:
    status: DeliveryStatus
    detail: str = ""
    provider_message_id: str | None = None

    @property
    def reached(self) -> bool:
        return self.status in ("delivered", "queued")


class Deliverer(Protocol):
    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Send ``request.body`` to the account on ``request.channel``.

        Returns a result for every channel outcome; raising is treated as ``failed``. Must be
        safe to call again with the same key after a crash (at worst a duplicate SMS when the
        process died between the provider accepting it and the scheduler recording that).
        """
        ...


def delivery_key(task_id: int, occurrence_at: datetime, channel: str) -> str:
    return f"task-{task_id}@{occurrence_at.isoformat()}#{channel}"
