"""``pepper serve``: bind, open the store, serve with uvicorn (httptools), drain and stop on a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn
from quart import Quart

from core.errors import StartupError
from core.metrics import use_directory as use_metrics_directory
from core.settings import Settings
from core.store import Database, open_store
from core.store.sessions import connection_limit, sessions_named
from gateway.app import asgi_app, create_app
from gateway.budget import FEWER_CONNECTIONS, connections_needed
from gateway.children import Supervised
from gateway.composition import build_calls, check_connection_secrets, freeze_startup_objects, start_memory, turn_parts
from gateway.media_procs import MediaProcesses
from gateway.port_lock import hold_media_port
from gateway.research import ResearchHelper
from gateway.sockets import bind_listener, bind_shared
from gateway.worker import TurnProcesses

log = logging.getLogger(__name__)


def build_app(
    settings: Settings, db: Database, media_listener: socket.socket | None = None, *, turns_in_process: bool = True,
    media_in_process: bool = True,
) -> Quart:  # fmt: skip
    """The app with everything it serves wired in: the harness on the model router, Twilio if set up.

    ``turns_in_process=False`` when turn-worker processes answer the messages (``pepper serve``);
    they then run the scheduler and the memory jobs too. ``media_in_process=False`` when media
    processes hold the calls (``gateway.media_procs``); the app still answers the voice webhooks.
    """
    from core.tools import recover_unresolved
    from text_loop.skills.catalog import log_problems

    router, harness, messenger, mailer = turn_parts(settings, db)
    log_problems(harness.skills.report(harness.registry))  # type: ignore[union-attr]
    calls = build_calls(settings, db, harness, messenger)
    app = create_app(
        settings, db, turns_in_process=turns_in_process, harness=harness, messenger=messenger, mailer=mailer,
        calls=calls, media_listener=media_listener, media_in_process=media_in_process,
    )  # fmt: skip

    @app.before_serving
    async def resolve_crashed_turns() -> None:
        # Writes a crash left staged: committed if the reply went out, dropped otherwise. Messages
        # a crash left unanswered are the turn workers' (``gateway.worker``).
        resolved = await recover_unresolved(db, harness.registry)
        if any(resolved.values()):
            log.info("resolved staged writes left by an earlier crash: %s", resolved)

    warming: set[asyncio.Task[Any]] = set()

    @app.before_serving
    async def record_the_call_notice() -> None:
        # The notice Pepper plays at each call's start (voice.notice), recorded now in the
        # background rather than on the first call (piper loads in about a second).
        notice = getattr(getattr(calls, "deps", None), "notice_audio", None)
        if notice is not None and media_in_process:
            task = asyncio.create_task(notice.mulaw(calls.deps.config.notice), name="pepper-notice-audio")
            warming.add(task)
            task.add_done_callback(warming.discard)

    @app.before_serving
    async def seal_connection_secrets() -> None:
        await check_connection_secrets(db, harness.connectors)

    @app.after_serving
    async def close_mcp_sessions() -> None:
        if harness.mcp is not None:
            await harness.mcp.close()

    # With turn-worker processes, the scheduler and the memory jobs run in the first of them
    # (``gateway.worker.BackgroundJobs``): scheduled runs are turns, indexing is throughput work.
    if settings.scheduler_enabled and turns_in_process:
        from gateway.scheduled import attach_scheduler

        attach_scheduler(app, settings, harness, messenger, mailer)

    memory = start_memory(settings, db, router) if turns_in_process else None

    @app.before_serving
    async def start_memory_jobs() -> None:
        if memory is not None:
            memory.start()

    @app.after_serving
    async def close_router() -> None:
        if memory is not None:
            await memory.stop()
        await router.aclose()

    return app


class _HttpServer(uvicorn.Server):
    """Uvicorn without its own signal handling: ``serve`` owns SIGINT/SIGTERM and sets ``stop``."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(app: Quart, sock: socket.socket, graceful_timeout: float, stop: asyncio.Event) -> None:
    """Serve the app's HTTP on ``sock`` until ``stop`` is set, then drain for up to ``graceful_timeout``.

    Uvicorn with the httptools parser: at 200 webhooks a second the pure-Python HTTP/1.1 parser
    Pepper used before (h11, under Hypercorn) was the largest CPU cost of an acknowledgement.
    """
    config = uvicorn.Config(
        asgi_app(app), http="httptools", ws="none", lifespan="on", loop="none", log_config=None,
        access_log=False, timeout_graceful_shutdown=graceful_timeout, server_header=False,
    )  # fmt: skip
    server = _HttpServer(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="pepper-http")
    stopping = asyncio.create_task(stop.wait(), name="pepper-http-stop")
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        server.should_exit = True
        await serving
    if server.lifespan is not None and server.lifespan.startup_failed:
        raise StartupError("the server could not start: see the log above")


@asynccontextmanager
async def running_app(
    settings: Settings, db: Database, *, media_processes: int = 1
) -> AsyncIterator[tuple[Quart, int]]:
    """Serve ``build_app`` on a real loopback socket in this event loop (for tests and benchmarks).

    With ``port=0`` the media listener takes a free port too (``gateway.media_server.media_port``).
    Calls are held in this event loop too, whatever ``settings.media_processes`` says, unless
    ``media_processes`` > 1: then that many media processes hold them, as ``pepper serve`` runs
    them (``gateway.media_procs``), on the port in the app's ``services.settings.media_port``;
    this returns once they all listen.
    """
    if settings.port == 0:
        settings = settings.model_copy(update={"media_port": 0})
    sock = bind_listener(settings.host, settings.port)
    port = sock.getsockname()[1]
    children: list[Supervised] = []
    research = ResearchHelper(settings) if ResearchHelper.wanted(settings) else None
    if research is not None:
        settings = settings.model_copy(update={"web_research_socket": str(research.socket_path)})
        children.append(research)
    if media_processes > 1:
        media_sock = bind_shared(settings.host, settings.media_port)
        settings = settings.model_copy(
            update={"media_port": media_sock.getsockname()[1], "media_processes": media_processes}
        )
        app = build_app(settings, db, media_in_process=False)
        children.append(MediaProcesses(settings, db.dsn, settings.media_processes))
    else:
        media_sock = bind_listener(settings.host, settings.media_port, "PEPPER_MEDIA_PORT")
        app = build_app(settings, db, media_sock)
    app.before_serving(_started(children))
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(
        serve_http(app, sock, settings.graceful_timeout, stop), name=f"pepper-server-{port}"
    )
    try:
        for _ in range(500):  # until it accepts connections
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.01)
        if media_processes > 1:
            await _media_processes_listening(db, settings.media_processes)
        if research is not None:
            await research.ready()
        yield app, port
    finally:
        stop.set()
        await asyncio.gather(*(processes.stop(settings.graceful_timeout) for processes in children))
        await task
        if media_processes > 1:
            media_sock.close()


async def _media_processes_listening(db: Database, count: int, within: float = 120.0) -> None:
    """Wait until ``count`` media processes listen (each then renames its call-control session)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while await sessions_named(db, "pepper-media-% ready") < count:
        if loop.time() > deadline:
            raise StartupError(f"{count} media processes did not start within {within:.0f} s")
        await asyncio.sleep(0.1)


def room_children(settings: Settings, dsn: str) -> list[Supervised]:
    """The rooms' children (docs/rooms.md): the embedded Synapse unless PEPPER_MATRIX_HOMESERVER
    names another homeserver, and the rooms process that follows them; none with rooms off."""
    if not settings.rooms_enabled:
        return []
    from gateway.rooms.homeserver import EmbeddedHomeserver
    from gateway.rooms.process import RoomProcesses

    found: list[Supervised] = [] if settings.matrix_homeserver else [EmbeddedHomeserver(settings)]
    return [*found, RoomProcesses(settings, dsn, 1)]


async def check_connection_budget(db: Database, settings: Settings) -> None:
    """Refuse to start when the pools could outgrow the server's connection limit: otherwise the
    shortfall shows only under load, as calls and messages failing with "too many clients"."""
    limit = await connection_limit(db)
    needed = connections_needed(settings)
    if needed > limit:
        raise StartupError(
            f"Pepper may open {needed} connections to Postgres with these settings but the server allows"
            f" {limit}; {FEWER_CONNECTIONS}"
        )


def _started(children: list[Supervised]):  # type: ignore[no-untyped-def]
    async def start_child_processes() -> None:
        for processes in children:
            processes.start()

    return start_child_processes


async def _stop_on(stop: asyncio.Event, children: list[Supervised], grace: float) -> None:
    await stop.wait()
    await asyncio.gather(*(processes.stop(grace) for processes in children))


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the new limit.

    Each call holds two sockets (Twilio's and the model's) besides the database's and the web
    requests', and Debian's default soft limit is 1,024: a few hundred calls in one process would
    hit it and new calls fail in ``accept``. The hard limit is the administrator's; the children
    (turn workers, media processes) inherit the raised one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard and hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            log.warning("could not raise the open files limit from %s to %s", soft, hard)
            return soft
        return hard
    return soft


async def serve(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or ``stop`` is set), then drain requests and stop Postgres."""
    stop = stop or asyncio.Event()
    log.info("open files limit: %s", raise_open_files_limit())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    media_port_lock = hold_media_port(settings.media_port, settings.data_dir)  # noqa: F841 (held until return)
    sock = bind_listener(settings.host, settings.port)
    port = sock.getsockname()[1]
    handed_over = False
    media_sock: socket.socket | None = None
    media_apart = settings.media_processes > 1
    try:
        if media_apart:
            # Each media process binds its own socket on the port; this one, never listening,
            # checks the port now and keeps it reserved (``gateway.media_procs``).
            media_sock = bind_shared(settings.host, settings.media_port)
            settings = settings.model_copy(update={"media_port": media_sock.getsockname()[1]})
        else:
            media_sock = bind_listener(settings.host, settings.media_port, "PEPPER_MEDIA_PORT")
        # The research helper's socket goes into the settings every process gets (its turns and calls use it).
        research = ResearchHelper(settings) if ResearchHelper.wanted(settings) else None
        if research is not None:
            settings = settings.model_copy(update={"web_research_socket": str(research.socket_path)})
        async with open_store(settings, serving=True) as db:
            # Every process of this server (the children inherit the environment) reports its
            # metrics here; set before any child starts, once the data dir is known to be usable.
            use_metrics_directory(settings.data_dir / "metrics")
            await check_connection_budget(db, settings)
            app = build_app(settings, db, None if media_apart else media_sock,
                            turns_in_process=settings.turn_workers == 0, media_in_process=not media_apart)  # fmt: skip
            children: list[Supervised] = [research] if research is not None else []
            if settings.turn_workers:
                children.append(TurnProcesses(settings, db.dsn, settings.turn_workers))
            if media_apart:
                children.append(MediaProcesses(settings, db.dsn, settings.media_processes))
            children += room_children(settings, db.dsn)
            # After start-up recovery (registered earlier), so no child races it.
            app.before_serving(_started(children))
            app.before_serving(freeze_startup_objects)
            log.info("pepper is serving on http://%s:%s (media sockets on port %s, in %s)", settings.host, port,
                     settings.media_port, f"{settings.media_processes} media processes" if media_apart
                     else "this process")  # fmt: skip
            handed_over = not media_apart
            # The children drain (calls hung up and recorded, turns finished) while the web server
            # drains its requests, all within the one graceful timeout.
            stopping = asyncio.create_task(_stop_on(stop, children, settings.graceful_timeout))
            try:
                await serve_http(app, sock, settings.graceful_timeout, stop)
            finally:
                stop.set()
                await stopping
            log.info("pepper stopped accepting requests; closing the store")
    finally:
        sock.close()  # uvicorn closes it when it stops serving; a second close does nothing
        if not handed_over and media_sock is not None:
            media_sock.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
