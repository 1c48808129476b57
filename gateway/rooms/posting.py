"""Posting in a room once: record the post, then send it under its transaction id.

Every post Pepper makes in a room (a room turn's reply, a scheduled task's result) is recorded in
``room_posts`` under a transaction id before it is sent. The homeserver deduplicates transaction
ids per device and Pepper keeps one device (``session.json``), so a post sent again after a crash
(the homeserver took it, Pepper died before recording it as posted) is the same post: the
homeserver answers with the first post's event id and the room shows it once.

A scheduled task's post (:class:`RoomPoster`, used by ``gateway.scheduled``) takes its
transaction id from the run and the channel's place among the run's channels
(:func:`run_txn_id`): a re-run of the same run after a crash makes the same id, finds the post
recorded, and sends the recorded text again (not the re-run's new text), or nothing when it is
recorded as posted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

from core.adapters.matrix import MatrixClient, MatrixError
from core.records import rooms
from core.store.queries import Queries

log = logging.getLogger(__name__)


def run_txn_id(run_id: int, seq: int) -> str:
    """The transaction id of a scheduled run's ``seq``-th room post: the same run, the same id."""
    return f"pepper.run{run_id}.{seq}"


async def send_recorded(db: Queries, client: MatrixClient, post: rooms.Post) -> str:
    """Send a recorded post (again, after a crash: the same transaction id) and record it posted.

    Returns the event id. ``MatrixError`` when the homeserver cannot take it now (retryable: the
    post stays unsent and is sent again later) or refuses it for good (recorded as failed)."""
    try:
        event_id = await client.send_text(post.room_matrix_id, post.body, post.txn_id, reply_to=post.reply_to)
    except MatrixError as exc:
        if not exc.retryable:
            log.error("rooms: the homeserver refused a post: %s", exc.errcode)
            await rooms.mark_post_failed(db, post.txn_id, exc.errcode or "refused")
        raise
    await rooms.mark_posted(db, post.txn_id, event_id)
    return event_id


class RoomPoster:
    """Posts a scheduled run's result in a room, once (see the module's docstring). ``client`` makes
    Pepper's Matrix client the first time one is needed (``gateway.rooms.homeserver.pepper_client``)."""

    def __init__(self, db: Queries, client: Callable[[], Awaitable[MatrixClient]]) -> None:
        self._db = db
        self._make = client
        self._client: MatrixClient | None = None

    async def _get_client(self) -> MatrixClient:
        if self._client is None:
            self._client = await self._make()
        return self._client

    async def post(
        self, room_id: UUID, account_id: UUID, body: str, *, run_id: int, seq: int, turn_id: UUID | None
    ) -> tuple[str, str]:
        """``(status, detail)`` as a ``DeliveryResult`` takes them; the detail is the event id
        when posted."""
        db = self._db
        if not await rooms.is_member(db, room_id, account_id):
            return "unavailable", "the account is no longer a member of that room"
        txn = run_txn_id(run_id, seq)
        await rooms.record_post(db, txn, room_id, body, turn_id=turn_id, answers=None, to_account=None, to_agent=False)
        recorded = await rooms.post(db, txn)
        assert recorded is not None
        if recorded.event_id is not None:
            return "delivered", recorded.event_id  # posted by an earlier attempt: not again
        if await rooms.post_failed(db, txn):
            return "failed", "the homeserver refused the post"
        try:
            event_id = await send_recorded(db, await self._get_client(), recorded)
        except MatrixError as exc:
            return "failed", exc.errcode or exc.message
        return "delivered", event_id

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
