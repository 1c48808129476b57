"""Media processes: the phone calls of ``pepper serve``, spread over several processes.

Every call sends and receives a frame each 20 ms, so relaying its audio is CPU work that never
stops; one event loop holds only so many calls before each frame waits for the others (on the
2-core build machine: 79 % of a core and 49 ms p99 added per frame at 100 calls). With
``PEPPER_MEDIA_PROCESSES=N`` (N >= 2) the web server answers the voice webhook and the status
callbacks, and N media processes hold the calls, each with its own event loop, database pool,
tools and models, as a turn worker has (``gateway.composition.build_media_services``).

All of them accept on ``PEPPER_MEDIA_PORT`` with their own ``SO_REUSEPORT`` socket: the kernel
hands each new connection to one of them by a hash of its addresses, so calls spread evenly
(measured: 300 connections paced 5 ms apart over two processes split 132/168 to 149/151; one
listening socket inherited by both split as badly as 21/279, the process whose loop woke first
taking every connection pending). The web server binds the port first, also with
``SO_REUSEPORT`` but never listening, so a port in use fails at once and stays reserved.

A call is admitted by its one-time token, which the webhook stored in Postgres, so any process can
admit any call. A status callback reaches the holder through ``voice.control``. A media process
that dies is restarted (``gateway.children.ChildProcesses``) and the end of the calls it held is
written by the others (``voice.control.CallControl.end_orphans``); on SIGTERM a media process hangs
its calls up and writes their records within ``PEPPER_GRACEFUL_TIMEOUT``.

``PEPPER_MEDIA_PROCESSES=1`` serves the media socket inside the web server, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core.errors import StartupError
from core.settings import Settings
from gateway.children import ChildProcesses, ChildStop
from gateway.services import Services
from gateway.sockets import bind_shared

log = logging.getLogger(__name__)

# Connections for a media process's calls: a call uses one only to admit itself and to write a
# transcript line or a record, briefly; these are shared by the ~150 calls a process holds.
POOL_SIZE = 10


class MediaProcesses(ChildProcesses):
    """The media processes of ``pepper serve`` (``PEPPER_MEDIA_PROCESSES``)."""

    label = "media"
    name = "pepper-media"

    @staticmethod
    def target(settings: Settings, index: int) -> None:
        media_process_main(settings, index)


def media_process_main(settings: Settings, index: int) -> None:
    """Entry point of one media process (at the web server's priority: calls are latency work)."""
    from gateway.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format, process=f"media-{index}")
    import uvloop  # as the web server: less CPU per frame relayed

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_media_process(settings, index))


async def _media_process(settings: Settings, index: int) -> None:
    from core.store import Database
    from gateway.composition import build_media_services, freeze_startup_objects
    from gateway.media_server import start_media_server
    from voice.control import CallControl

    stop = ChildStop()
    assert settings.database_url is not None
    db = await Database.open(settings.database_url.get_secret_value(), max_size=POOL_SIZE)
    try:
        async with build_media_services(settings, db) as services:
            control = CallControl(services.calls, db.dsn, name=f"pepper-media-{index}")
            await control.start()
            try:
                sock = bind_shared(settings.host, settings.media_port)
            except StartupError as exc:
                log.error("media process cannot listen: %s", exc.message)
                await control.stop()
                raise SystemExit(1) from exc
            services.media = await start_media_server(services, settings.host, settings.media_port, sock=sock)
            await control.mark_ready()
            await freeze_startup_objects()
            log.info("media process ready on port %s (holds calls as %s)", settings.media_port, control.holder)
            await stop.stopped("media process")
            await stop_calls(services, settings.graceful_timeout)
            await control.stop()
    finally:
        await db.close()


def stop_taking_calls(services: Services) -> None:
    """Hang every call up and take no new one (their records are written by ``stop_calls``)."""
    if services.calls is not None:
        services.calls.hang_up_all()
    if services.media is not None:
        services.media.close(close_connections=False)


# After the grace, how long sockets still open (a call that never got a session) may take to close.
SOCKET_CLOSE_SECONDS = 5.0


async def stop_calls(services: Services, grace: float) -> None:
    """Hang every call up, take no new one, and write their records within ``grace`` seconds."""
    stop_taking_calls(services)
    await services.tasks.drain(grace)
    if services.media is not None:
        # A socket whose admission the drain cancelled, or a call hung up by its status callback
        # (its socket is Twilio's to close), may still be open: close what is left.
        services.media.close(close_connections=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(services.media.wait_closed(), SOCKET_CLOSE_SECONDS)
    if services.calls is not None:
        await services.calls.aclose()
