"""Rooms: a message that mentions Pepper -> Pepper's reply posted, and the sync loop at rest.

On a real Synapse (``core.testing.matrix``: in-memory SQLite, 127.0.0.1) and the test Postgres,
with a scripted model (its time is what the turn record says the model took: next to nothing):

* **mention -> reply**, as a member's client sees it: the member posts a mention and long-polls
  ``/sync`` until Pepper's reply arrives (end to end). Beside it, **one homeserver hop**: a post
  by one client until another client's long poll gets it (a reply needs two: the mention to
  Pepper, the reply back). **Pepper's part**: from Pepper's ``/sync`` returning with the mention
  to the reply going out (store the event, decide, read the room, run the turn, record the post),
  and, apart, the homeserver's time to accept the post.
* **idle CPU**: the follower's process CPU over an idle period with Pepper in ``--idle-rooms``
  rooms (long polls of 30 s), and Synapse's over the same period.

    PYTHONPATH=. .venv/bin/python bench/rooms.py [--mentions 100] [--idle-rooms 100] [--idle-seconds 65]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from core import identity
from core.records import rooms
from core.store import Database
from core.testing.figures import p99
from core.testing.matrix import running_homeserver
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, reply
from gateway.rooms.follow import RoomFollower
from text_loop import HarnessDeps


def _stats(label: str, ms: list[float]) -> None:
    print(f"{label}: median {statistics.median(ms):.1f} ms, p99 {p99(ms):.1f} ms ({len(ms)} runs)")


class TimedFollower(RoomFollower):
    """The follower, noting when each sync batch arrived, when its post went to the homeserver and
    how long the homeserver took to accept it."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.batch_at = 0.0
        self.parts: list[float] = []
        self.posts: list[float] = []
        send = self._client.send_text

        async def timed_send(*args, **kwargs):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            self.parts.append((start - self.batch_at) * 1000)
            try:
                return await send(*args, **kwargs)
            finally:
                self.posts.append((time.perf_counter() - start) * 1000)

        self._client.send_text = timed_send  # type: ignore[method-assign]

    async def store(self, batch, *, history=False):  # type: ignore[no-untyped-def]
        self.batch_at = time.perf_counter()
        return await super().store(batch, history=history)


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until_reply(client, room_id: str, pepper: str, since: str) -> str:  # type: ignore[no-untyped-def]
    while True:
        batch = await client.sync(since, timeout_ms=30_000)
        since = batch.next_batch
        if any(e.room_id == room_id and e.sender == pepper for e in batch.events):
            return since


async def bench(mentions: int, idle_rooms: int, idle_seconds: float) -> None:
    with test_server() as dsn, tempfile.TemporaryDirectory(prefix="pepper-bench-rooms-") as tmp:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        db = await Database.open(await factory.create(), max_size=6)
        async with running_homeserver(Path(tmp)) as server:
            pepper = await server.pepper()
            ada_client, bob_client = await server.user("ada"), await server.user("bob")
            ada = await identity.create_account(db, "Ada")
            await identity.add_handle(db, ada.id, "matrix", ada_client.user_id, verified=True)
            room_id = await pepper.create_room("Bench", [ada_client.user_id, bob_client.user_id])
            await ada_client.join(room_id)
            await bob_client.join(room_id)
            room = await rooms.create_room(db, room_id, "Bench")
            await rooms.add_member(db, room.id, ada.id)
            models = ScriptedModels(default=reply("Noted."))
            follower = TimedFollower(db, pepper, HarnessDeps(db=db, models=models))
            await follower.step(timeout_ms=0)
            stop = asyncio.Event()
            loop_task = asyncio.create_task(follower.run(stop), name="bench-rooms-follower")

            # One homeserver hop: Ada posts, Bob's long poll gets it.
            since = (await bob_client.sync(None, timeout_ms=0)).next_batch
            hops = []
            for i in range(mentions):
                start = time.perf_counter()
                await ada_client.send_text(room_id, f"plain {i}", f"hop{i}")
                while True:
                    batch = await bob_client.sync(since, timeout_ms=30_000)
                    since = batch.next_batch
                    if any(e.body == f"plain {i}" for e in batch.events):
                        break
                hops.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0.5)  # let Pepper's loop store the plain messages

            ada_since = (await ada_client.sync(None, timeout_ms=0)).next_batch
            ends, follower.parts, follower.posts = [], [], []
            for i in range(mentions):
                start = time.perf_counter()
                await ada_client.send_text(room_id, f"question {i}", f"ask{i}", mention=pepper.user_id)
                ada_since = await _until_reply(ada_client, room_id, pepper.user_id, ada_since)
                ends.append((time.perf_counter() - start) * 1000)
            rows = await db.fetch("SELECT (timings->>'model_ms')::float AS ms FROM turns WHERE kind = 'room'")
            model_ms = [r["ms"] for r in rows]
            print(f"rooms: {mentions} mentions answered on Synapse at {server.url}")
            _stats("  end to end (mention posted -> reply seen by the member)", ends)
            _stats("  one homeserver hop (a post -> another client's /sync)", hops)
            _stats("  Pepper's part (its /sync returned -> its reply sent to the homeserver)", follower.parts)
            _stats("  the homeserver accepting the reply (the send request)", follower.posts)
            _stats("  the scripted model's time inside Pepper's part", model_ms)

            # At rest: Pepper in many rooms, nothing happening.
            for i in range(idle_rooms - 1):
                extra = await pepper.create_room(f"Idle {i}", [ada_client.user_id])
                await rooms.create_room(db, extra, f"Idle {i}")
            await asyncio.sleep(1.0)
            synapse_pid = next(p for p in _children(os.getpid()) if b"synapse" in _cmdline(p))
            cpu0, syn0, wall0 = time.process_time(), _cpu_of(synapse_pid), time.perf_counter()
            await asyncio.sleep(idle_seconds)
            wall = time.perf_counter() - wall0
            ours, theirs = time.process_time() - cpu0, _cpu_of(synapse_pid) - syn0
            print(f"idle, {idle_rooms} rooms, {wall:.0f} s: sync loop CPU {100 * ours / wall:.2f} % of a core;"
                  f" Synapse {100 * theirs / wall:.2f} %")  # fmt: skip
            stop.set()
            await loop_task
        await db.close()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mentions", type=int, default=100)
    parser.add_argument("--idle-rooms", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=65.0)  # two long polls and more
    args = parser.parse_args()
    asyncio.run(bench(args.mentions, args.idle_rooms, args.idle_seconds))


if __name__ == "__main__":
    main()
