"""A scheduled task posting its result in a room, once, against a real Synapse: the post's
transaction id comes from the run and the channel's place, so a run that died after the homeserver
took its post and before Pepper recorded it posts nothing new when it runs again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rooms_support import make_room, pepper_posts_seen_by

from core.errors import InvalidInput, NotFound
from core.records import rooms
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.settings import Settings
from core.testing.scripted import reply
from gateway.rooms.posting import RoomPoster, run_txn_id
from gateway.scheduled import GatewayDeliverer
from text_loop.scheduler import Scheduler, SchedulerConfig


class DiesAfterSending:
    """Pepper's client in a process that dies right after the homeserver took a post, before the
    post is recorded as posted."""

    def __init__(self, client) -> None:
        self.client = client
        self.sent: list[str] = []

    async def send_text(self, room_id, body, txn_id, **kwargs) -> str:
        self.sent.append(await self.client.send_text(room_id, body, txn_id, **kwargs))
        raise RuntimeError("killed after the homeserver took the post")

    async def close(self) -> None:
        pass


def _scheduler(harness, client, clock, owner: str) -> Scheduler:
    async def make():
        return client

    deliverer = GatewayDeliverer(Settings(), harness.db, rooms=RoomPoster(harness.db, make))
    config = SchedulerConfig(lease=timedelta(seconds=60), heartbeat=timedelta(seconds=5))
    return Scheduler(harness, deliverer, config, owner=owner, clock=clock)


async def _task(db, account, clock, to):
    schedule = parse_schedule("in 1 minute", now=clock.now, timezone="UTC")
    async with db.transaction() as conn:
        return await create_task(conn, account.id, title="Shopping list", prompt="Post the shopping list",
                                 schedule=schedule, now=clock.now, deliver_to=to)  # fmt: skip


async def test_a_run_that_died_after_posting_posts_nothing_new_when_it_runs_again(
    db, homeserver, pepper, follower, models, harness, clock
):
    harness.clock = clock
    setup = await make_room(db, homeserver, pepper, follower, "Ada", "Bob")
    ada, bob, room = setup.members["Ada"], setup.members["Bob"], setup.room
    task = await _task(db, ada.account, clock, [f"room:{room.name}"])
    assert task.deliver_to == (f"room:{room.id}",)
    clock.advance(minutes=2)
    models.script(reply("Milk, eggs."), reply("Bread and milk."))
    dying = DiesAfterSending(pepper)
    assert await _scheduler(harness, dying, clock, "first").run_due() == 1
    assert len(dying.sent) == 1  # the homeserver took it; nothing recorded it as posted
    run_id = await db.fetchval("SELECT id FROM task_runs WHERE task_id = $1", task.id)
    unsent = await rooms.unsent_posts(db)
    assert [p.txn_id for p in unsent] == [run_txn_id(run_id, 0)]

    # The restarted process runs it again (a new model answer) and sends the recorded post under
    # the same transaction id: the homeserver gives back the first event; the room shows it once.
    clock.advance(minutes=5)
    again = _scheduler(harness, pepper, clock, "second")
    assert await again.run_due() == 1
    posted = await rooms.post(db, run_txn_id(run_id, 0))
    assert posted is not None and posted.event_id == dying.sent[0]
    assert await pepper_posts_seen_by(bob.client, room, pepper.user_id) == ["Milk, eggs."]
    assert await db.fetchval("SELECT status FROM task_runs WHERE id = $1", run_id) == "ran"
    # A duplicate delivery of the same run finds it posted and sends nothing.
    poster = RoomPoster(db, lambda: None)  # type: ignore[arg-type, return-value]
    assert await poster.post(room.id, ada.account.id, "other", run_id=run_id, seq=0, turn_id=None) == (
        "delivered",
        dying.sent[0],
    )
    assert await pepper_posts_seen_by(bob.client, room, pepper.user_id) == ["Milk, eggs."]


async def test_a_room_is_refused_unless_the_owner_is_a_member_and_a_leaver_gets_chat(
    db, homeserver, pepper, follower, models, harness, clock
):
    harness.clock = clock
    setup = await make_room(db, homeserver, pepper, follower, "Ada")
    ada, room = setup.members["Ada"], setup.room
    other = await make_room(db, homeserver, pepper, follower, "Cy")
    with pytest.raises(InvalidInput):
        await _task(db, ada.account, clock, [f"room:{other.room.name}"])  # not Ada's room
    with pytest.raises(NotFound):
        await _task(db, ada.account, clock, ["room:no-such-room"])
    with pytest.raises(InvalidInput):
        await _task(db, ada.account, clock, ["room:"])
    await _task(db, ada.account, clock, [f"room:{room.id}", f"room:{room.name}"])  # one room, once
    assert await db.fetchval("SELECT deliver_to FROM scheduled_tasks ORDER BY id DESC LIMIT 1") == [f"room:{room.id}"]
    # Ada leaves the room before the run: the result goes to her chat, nothing to the room.
    await db.execute("DELETE FROM room_members WHERE room_id = $1", room.id)
    clock.advance(minutes=2)
    models.script(reply("Done."))
    assert await _scheduler(harness, pepper, clock, "one").run_due() == 1
    assert await db.fetchval("SELECT count(*) FROM room_posts") == 0
    channels = await db.fetch("SELECT channel, status FROM task_deliveries ORDER BY channel")
    assert [(r["channel"], r["status"]) for r in channels] == [
        ("chat", "delivered"),
        (f"room:{room.id}", "unavailable"),
    ]
