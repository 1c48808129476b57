"""Following Pepper's rooms: the ``/sync`` long poll, each message stored once, room turns, posts.

One pass (:meth:`RoomFollower.step`): ``/sync`` from the stored ``next_batch`` -> every text message
in a followed room stored once (idempotent on its event id), with the code's decision whether it
gets a turn (``gateway.rooms.speak``), and the new ``next_batch``, in one transaction -> each queued
message answered. A restart resumes from the stored ``next_batch``, so no message is missed and
none is stored twice. The first sync ever (no ``next_batch``) stores the recent history without
answering it.

A room turn (``kind="room"``) runs on behalf of the member who wrote (or, for a non-member, the
room's first member), sees the room's data only (``gateway.rooms.context``, the gate's
``room-scope`` policy) and answers :data:`~gateway.rooms.context.NO_REPLY` to say nothing.

A post is recorded (``room_posts``) before it is sent, under a transaction id made of the turn id
and the post's sequence in the turn, in the same transaction that marks the message answered. The
homeserver deduplicates transaction ids per device, so a post sent again after a crash (posted but
not yet recorded as posted) is the same post: :meth:`RoomFollower.resume` sends every post not yet
recorded as posted again, and the room shows it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID
from zoneinfo import ZoneInfo

from core import identity
from core.adapters.matrix import Invite, MatrixClient, MatrixError, RoomEvent, SyncBatch
from core.records import rooms
from core.store import Database
from core.store.sessions import DRIVER_ERRORS
from gateway.rooms import context
from gateway.rooms.posting import send_recorded
from gateway.rooms.speak import AGENT_EXCHANGE_CAP, FOLLOW_UP_WINDOW, Decision, decide
from text_loop import HarnessDeps, deliver, run_turn

log = logging.getLogger(__name__)

MAX_BODY = 4000  # characters of a room message Pepper keeps
RETRY_SECONDS = 2.0
# Turn outcomes whose reply is an apology, not an answer: nothing is posted for them in a room.
NOT_ANSWERED = frozenset({"no-model", "model-error", "empty"})


def txn_id(turn_id: UUID, seq: int) -> str:
    """The Matrix transaction id of a turn's ``seq``-th post: the same turn and post, the same id."""
    return f"pepper.{turn_id}.{seq}"


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RoomFollower:
    """Follows every room Pepper knows (``rooms``) as ``client``'s user and answers in them."""

    def __init__(
        self, db: Database, client: MatrixClient, harness: HarnessDeps | None, *,
        clock: Callable[[], datetime] = _utc_now, follow_up: timedelta = FOLLOW_UP_WINDOW,
        agent_cap: int = AGENT_EXCHANGE_CAP, timeout_ms: int = 30_000,
    ) -> None:  # fmt: skip
        self._db = db
        self._client = client
        self._harness = harness
        self._clock = clock
        self._follow_up = follow_up
        self._agent_cap = agent_cap
        self._timeout_ms = timeout_ms
        self.pepper = client.user_id

    async def run(self, stop: asyncio.Event) -> None:
        """Resume, then sync and answer until ``stop`` is set; a homeserver or database outage is
        waited out and the loop goes on."""
        resumed = False
        while not stop.is_set():
            try:
                if not resumed:
                    await self.resume()
                    resumed = True
                sync = asyncio.ensure_future(self.step())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({sync, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not sync.done():
                    sync.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sync
                    return
                sync.result()
            except MatrixError as exc:
                log.warning("rooms: the homeserver failed: %s", exc.message)
                resumed = False  # a post that failed to go out is sent again first
                await _pause(stop, RETRY_SECONDS)
            except DRIVER_ERRORS:
                log.warning("rooms: the database could not be reached; trying again", exc_info=True)
                await _pause(stop, RETRY_SECONDS)

    async def resume(self) -> None:
        """After a restart: send again what was recorded but not recorded as posted, then answer
        what was queued."""
        for post in await rooms.unsent_posts(self._db):
            # A scheduled task's post (it answers no message) is its run's to send again, from
            # the scheduler (``gateway.rooms.posting``), so one process sends each post.
            if post.reply_to is not None:
                await self._send(post)
        await self.answer_queued()

    async def step(self, timeout_ms: int | None = None) -> int:
        """One ``/sync`` and what follows from it; the number of messages stored."""
        since = await rooms.next_batch(self._db, self.pepper)
        wait = self._timeout_ms if timeout_ms is None else timeout_ms
        batch = await self._client.sync(since, timeout_ms=wait if since else 0)
        stored = await self.store(batch, history=since is None)
        await self.accept_invites(batch.invites)
        await self.answer_queued()
        return stored

    async def accept_invites(self, invites: list[Invite]) -> None:
        """Join a room a linked member invited Pepper to (recorded first, so a crash before the
        join joins at the next sync, where the invite still is); decline an invite from anyone
        else (an unknown user, an unverified Matrix ID, another bot). An invite the homeserver
        will not let Pepper act on (the room is gone) is logged and left: it must not stop the
        sync loop; an outage (retryable) is waited out like any other."""
        for invite in invites:
            try:
                inviter = await rooms.account_for_matrix_id(self._db, invite.inviter) if invite.inviter else None
                if inviter is None:
                    log.info("rooms: declining an invite from %s (not a linked member)", invite.inviter)
                    await self._client.leave(invite.room_id)
                    continue
                room = await rooms.follow_invited(self._db, invite.room_id, invite.name, inviter)
                await self._client.join(invite.room_id)
                log.info("rooms: joined %s (%s), invited by a member", room.name, room.matrix_id)
            except MatrixError as exc:
                if exc.retryable:
                    raise
                log.warning("rooms: an invite to %s could not be handled: %s", invite.room_id, exc.errcode)

    async def store(self, batch: SyncBatch, *, history: bool = False) -> int:
        """Store the batch's messages in followed rooms and its ``next_batch``, in one transaction."""
        followed = await rooms.followed_rooms(self._db)
        now = self._clock()
        stored = 0
        async with self._db.transaction() as conn:
            for event in batch.events:
                room = followed.get(event.room_id)
                if room is None or await rooms.known_event(conn, event.event_id):
                    continue
                member = (
                    None if event.sender == self.pepper else await rooms.member_for_sender(conn, room.id, event.sender)
                )
                # A message sent before Pepper followed the room is history: read, never answered.
                before = room.created_at is not None and _sent_at(event) < room.created_at
                decision = (Decision(False, "history") if history or before else
                            await decide(conn, room.id, event, self.pepper, member, now, follow_up=self._follow_up,
                                         agent_cap=self._agent_cap))  # fmt: skip
                kept = await rooms.record_event(
                    conn, room.id, event.event_id, event.sender, member, event.body[:MAX_BODY], _sent_at(event),
                    from_pepper=event.sender == self.pepper, reply_to=event.reply_to,
                    handling="queued" if decision.speak else "skipped", reason=decision.reason,
                )  # fmt: skip
                stored += kept is not None
            await rooms.save_next_batch(conn, self.pepper, batch.next_batch)
        return stored

    async def answer_queued(self) -> None:
        while queued := await rooms.queued_events(self._db):
            for event in queued:
                try:
                    await self._answer(event)
                except MatrixError:
                    raise  # an outage: the loop waits, and the message is still queued
                except DRIVER_ERRORS:
                    raise
                except Exception:
                    # A message whose turn cannot run must not stop the room, or come back after
                    # every restart: it is marked answered, with the reason.
                    log.exception("rooms: answering a message failed")
                    await rooms.finish_event(self._db, event.id, turn_id=None, reason="failed")

    async def _answer(self, event: rooms.StoredEvent) -> None:
        db = self._db
        room = await rooms.room_by_id(db, event.room_id)
        members = await rooms.members(db, room.id)
        to_agent = event.account_id is None or event.reason == "agent-mention"
        # Checked again here: several mentions from an agent can arrive in one batch.
        if to_agent and await rooms.agent_answers_since_member(db, room.id) >= self._agent_cap:
            await rooms.finish_event(db, event.id, turn_id=None, reason="agent-exchange-cap")
            return
        account_id = event.account_id or (members[0].account_id if members else None)
        if account_id is None or self._harness is None:
            log.error("rooms: a message cannot be answered (%s)", "no members" if account_id is None else "no harness")
            await rooms.finish_event(db, event.id, turn_id=None, reason="cannot-answer")
            return
        tz = ZoneInfo((await identity.get_account(db, account_id)).timezone)
        speaker = next((m.name for m in members if m.account_id == event.account_id), event.sender)
        recent = [m for m in await rooms.recent_messages(db, room.id, context.RECENT_MESSAGES)
                  if m["event_id"] != event.event_id]  # fmt: skip
        views = await context.calendar_views(db, self._harness.connectors, room.id, self._clock(), tz)
        notes = await rooms.notes(db, room.id)
        text = context.turn_text(
            room_name=room.name, speaker=speaker, message=event.body, recent=recent, notes=notes, views=views,
            pepper=self.pepper, tz=tz,
        )  # fmt: skip
        outcome = await run_turn(
            self._harness, account_id, "matrix", text, kind="room", connections=frozenset(), room_id=room.id
        )
        reply = outcome.reply.strip()
        if outcome.status in NOT_ANSWERED or not reply or reply.strip("\"'. ") == context.NO_REPLY:
            await rooms.finish_event(db, event.id, turn_id=outcome.turn_id, reason="silent")
            await deliver(self._harness, outcome.turn_id, outcome.status not in NOT_ANSWERED,
                          detail={"room": str(room.id), "silent": True})  # fmt: skip
            return
        txn = txn_id(outcome.turn_id, 0)
        async with db.transaction() as conn:
            await rooms.record_post(conn, txn, room.id, reply, turn_id=outcome.turn_id, answers=event.id,
                                    to_account=event.account_id, to_agent=to_agent)  # fmt: skip
            await rooms.finish_event(conn, event.id, turn_id=outcome.turn_id)
        post = await rooms.post(db, txn)
        assert post is not None
        await self._send(post)

    async def _send(self, post: rooms.Post) -> None:
        """Send a recorded post (again, after a crash: the same transaction id) and record it posted."""
        try:
            event_id = await send_recorded(self._db, self._client, post)
        except MatrixError as exc:
            if exc.retryable:
                raise  # the loop waits and ``resume`` sends it again
            if post.turn_id is not None and self._harness is not None:
                await deliver(self._harness, post.turn_id, False, detail={"errcode": exc.errcode})
            return
        if post.turn_id is not None and self._harness is not None:
            await deliver(self._harness, post.turn_id, True, detail={"event_id": event_id})


def _sent_at(event: RoomEvent) -> datetime:
    try:
        return datetime.fromtimestamp(event.origin_server_ts / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.now(UTC)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
