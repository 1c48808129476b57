"""The rooms process of ``pepper serve``: Pepper's ``/sync`` loop (``gateway.rooms.follow``) in a
child process of its own, supervised like the turn workers (started after start-up recovery,
restarted when it dies, stopped with SIGTERM and a drain). It waits for the homeserver (the
embedded one may still be starting), logs in once and follows until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core.adapters.matrix import MatrixError
from core.errors import ConfigError
from core.settings import Settings
from gateway.children import ChildProcesses, ChildStop

log = logging.getLogger(__name__)

# The sync loop handles one room event at a time (a turn takes a connection only while it needs one,
# never two at once): two connections leave the defaults inside a stock server's 100.
POOL_SIZE = 2
LOGIN_RETRY_SECONDS = 1.0


class RoomProcesses(ChildProcesses):
    label = "rooms"
    name = "pepper-rooms"

    @staticmethod
    def target(settings: Settings, index: int) -> None:
        rooms_process_main(settings)


def rooms_process_main(settings: Settings) -> None:
    from gateway.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format, process="rooms")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_rooms_process(settings))


async def _rooms_process(settings: Settings) -> None:
    from core.store import Database
    from gateway.composition import build_turn_services
    from gateway.rooms.follow import RoomFollower
    from gateway.rooms.homeserver import pepper_client

    stop = ChildStop()
    watch = asyncio.ensure_future(stop.stopped("rooms"))
    assert settings.database_url is not None
    db = await Database.open(settings.database_url.get_secret_value(), min_size=1, max_size=POOL_SIZE)
    try:
        client = None
        while client is None and not watch.done():
            try:
                client = await pepper_client(settings)
            except ConfigError as exc:
                log.error("rooms are off: %s", exc.message)
                await watch
                return
            except MatrixError as exc:
                log.info("rooms: waiting for the homeserver (%s)", exc.message)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(watch), LOGIN_RETRY_SECONDS)
        if client is None:
            return
        try:
            async with build_turn_services(settings, db) as services:
                done = asyncio.Event()
                watch.add_done_callback(lambda _: done.set())
                log.info("rooms: following as %s", client.user_id)
                await RoomFollower(db, client, services.harness).run(done)
        finally:
            await client.close()
    finally:
        watch.cancel()
        await db.close()
