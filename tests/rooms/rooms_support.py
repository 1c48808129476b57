"""What the rooms tests share: members with linked Matrix IDs in a room Pepper created, and
syncing until something happened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core import identity
from core.adapters.matrix import MatrixClient
from core.records import rooms
from core.store import Database
from core.testing.matrix import TestHomeserver
from gateway.rooms.follow import RoomFollower


@dataclass
class Member:
    account: identity.Account
    client: MatrixClient
    txn: int = 0

    @property
    def matrix_id(self) -> str:
        return self.client.user_id

    async def say(self, room: rooms.Room, body: str, *, mention: str | None = None, reply_to: str | None = None) -> str:
        self.txn += 1
        return await self.client.send_text(room.matrix_id, body, f"t{self.txn}", mention=mention, reply_to=reply_to)

    async def send(self, room: rooms.Room, content: dict[str, Any]) -> str:
        self.txn += 1
        return await self.client.send_raw(room.matrix_id, content, f"r{self.txn}")


@dataclass
class RoomSetup:
    room: rooms.Room
    members: dict[str, Member] = field(default_factory=dict)


async def member(db: Database, homeserver: TestHomeserver, name: str, *, linked: bool = True) -> Member:
    account = await identity.create_account(db, name, timezone="UTC")
    client = await homeserver.user(name.lower())
    if linked:
        await identity.add_handle(db, account.id, "matrix", client.user_id, verified=True)
    return Member(account, client)


async def make_room(
    db: Database, homeserver: TestHomeserver, pepper: MatrixClient, follower: RoomFollower, *names: str,
    outsiders: tuple[str, ...] = (),
) -> RoomSetup:  # fmt: skip
    """A room Pepper created with members ``names`` (linked, joined) and ``outsiders`` (Matrix users
    in the room who are no member of it: other agents, bots); the follower synced past its start."""
    people = {n: await member(db, homeserver, n) for n in names}
    others = {n: await member(db, homeserver, n, linked=False) for n in outsiders}
    everyone = {**people, **others}
    matrix_id = await pepper.create_room("Test room", [m.matrix_id for m in everyone.values()])
    for m in everyone.values():
        await m.client.join(matrix_id)
    room = await rooms.create_room(db, matrix_id, f"room-{matrix_id[1:9]}")
    for m in people.values():
        await rooms.add_member(db, room.id, m.account.id)
    await follower.step(timeout_ms=0)
    return RoomSetup(room, everyone)


async def until(follower: RoomFollower, done: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    """Sync and answer until ``done()``; fails after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await done():
        assert loop.time() < deadline, "the follower did not get there in time"
        await follower.step(timeout_ms=300)


async def handling(db: Database, event_id: str) -> tuple[str, str | None] | None:
    row = await db.fetchrow("SELECT handling, reason FROM room_events WHERE event_id = $1", event_id)
    return (row["handling"], row["reason"]) if row else None


async def pepper_posts_seen_by(client: MatrixClient, room: rooms.Room, pepper_id: str) -> list[str]:
    """Pepper's messages in the room as another member's client gets them from the homeserver."""
    return [e.body for e in await client.history(room.matrix_id) if e.sender == pepper_id]
