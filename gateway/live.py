"""New messages, pushed to the person's open chats as they are recorded, on any channel.

A trigger announces every new message with ``pg_notify('pepper_messages', ...)``. Each process
keeps one listening connection and fans the announcements out to its subscribers, so a reply
recorded by any process (or a text arriving by SMS) reaches every open browser tab.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

from core.store.sessions import Listener

log = logging.getLogger(__name__)

CHANNEL = "pepper_messages"


class LiveFeed:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._listener: Listener | None = None
        self._subscribers: dict[UUID, set[asyncio.Queue[int]]] = defaultdict(set)

    async def start(self) -> None:
        self._listener = await Listener.open(self._dsn, CHANNEL, self._announced)

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None

    def _announced(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            conversation_id, message_id = UUID(event["conversation_id"]), int(event["id"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed message announcement")
            return
        for queue in self._subscribers.get(conversation_id, ()):
            queue.put_nowait(message_id)

    @asynccontextmanager
    async def subscribe(self, conversation_id: UUID) -> AsyncIterator[asyncio.Queue[int]]:
        """A queue of ids of messages recorded in this conversation from now on."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        self._subscribers[conversation_id].add(queue)
        try:
            yield queue
        finally:
            self._subscribers[conversation_id].discard(queue)
            if not self._subscribers[conversation_id]:
                del self._subscribers[conversation_id]
