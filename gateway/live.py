"""New messages and turn progress, pushed to the person's open chats, from whichever process.

A trigger announces every new message with ``pg_notify('pepper_messages', ...)``. A turn on the
web channel announces its progress on ``pepper_progress``: the reply's text as the model streams
it, and each tool as it starts (:class:`ProgressPublisher`). Each process keeps one listening
connection per channel and fans the announcements out to its subscribers, so a reply recorded by
any process (or a text arriving by SMS) and a reply streaming in a turn worker reach every open
browser tab. Progress is best effort: a tab that opens mid-reply sees the rest of it, and the
recorded message replaces whatever streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

from core.store.sessions import DRIVER_ERRORS, Announcer, Listener

log = logging.getLogger(__name__)

CHANNEL = "pepper_messages"
PROGRESS_CHANNEL = "pepper_progress"
PROGRESS_KINDS = ("delta", "tool")
# A NOTIFY payload holds under 8000 bytes: text goes out in pieces of at most this many characters
# (4 bytes each in UTF-8 at most, plus the JSON around it).
PIECE_CHARS = 1000
# Progress waiting to be announced, per process; past it, pieces are dropped (the final message
# still arrives whole).
MAX_WAITING = 10_000

# What a subscriber's queue carries: a new message's id, or a progress event.
Event = int | dict[str, str]


class LiveFeed:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._listeners: list[Listener] = []
        self._subscribers: dict[UUID, set[asyncio.Queue[Event]]] = defaultdict(set)

    async def start(self) -> None:
        self._listeners = [
            await Listener.open(self._dsn, CHANNEL, self._announced),
            await Listener.open(self._dsn, PROGRESS_CHANNEL, self._progressed),
        ]

    async def stop(self) -> None:
        for listener in self._listeners:
            await listener.close()
        self._listeners = []

    def _announced(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            conversation_id, message_id = UUID(event["conversation_id"]), int(event["id"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed message announcement")
            return
        for queue in self._subscribers.get(conversation_id, ()):
            queue.put_nowait(message_id)

    def _progressed(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            conversation_id = UUID(event["conversation_id"])
            progress = {"turn_id": str(UUID(event["turn_id"])), "kind": event["kind"], "text": event["text"]}
            if progress["kind"] not in PROGRESS_KINDS or not isinstance(progress["text"], str):
                raise ValueError(progress["kind"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed progress announcement")
            return
        for queue in self._subscribers.get(conversation_id, ()):
            queue.put_nowait(progress)

    @asynccontextmanager
    async def subscribe(self, conversation_id: UUID) -> AsyncIterator[asyncio.Queue[Event]]:
        """A queue of what happens in this conversation from now on: ids of new messages and
        progress events (``{"turn_id", "kind", "text"}``)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers[conversation_id].add(queue)
        try:
            yield queue
        finally:
            self._subscribers[conversation_id].discard(queue)
            if not self._subscribers[conversation_id]:
                del self._subscribers[conversation_id]


class ProgressPublisher:
    """Announces turns' progress (``text_loop.run_turn``'s ``progress``) on ``pepper_progress``.

    :meth:`publish` never waits: events queue in this process and one task sends them, joining
    the deltas of one turn that queued meanwhile into one announcement, over a connection of its
    own (a turn in its tool round holds a pool connection already)."""

    def __init__(self, dsn: str) -> None:
        self._announcer = Announcer(dsn)
        self._waiting: asyncio.Queue[dict[str, str]] = asyncio.Queue(MAX_WAITING)
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0

    def publish(self, event: dict[str, str]) -> None:
        try:
            self._waiting.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="progress-publisher")

    async def _send(self) -> None:
        while True:
            batch = [await self._waiting.get()]
            while not self._waiting.empty():
                batch.append(self._waiting.get_nowait())
            for event in _joined(batch):
                text = event["text"]
                for start in range(0, max(len(text), 1), PIECE_CHARS):
                    payload = json.dumps({**event, "text": text[start : start + PIECE_CHARS]}, ensure_ascii=False)
                    try:
                        await self._announcer.announce(PROGRESS_CHANNEL, payload)
                    except DRIVER_ERRORS:
                        log.warning("could not announce a turn's progress", exc_info=True)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._announcer.close()


def _joined(batch: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Consecutive deltas of one turn as one delta, in order; everything else as it came."""
    out: list[dict[str, str]] = []
    for event in batch:
        last = out[-1] if out else None
        if last is not None and event["kind"] == last["kind"] == "delta" and event["turn_id"] == last["turn_id"]:
            out[-1] = {**last, "text": last["text"] + event["text"]}
        else:
            out.append(dict(event))
    return out
