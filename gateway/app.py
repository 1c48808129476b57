"""The Quart application: routes only; start-up and shutdown live in ``gateway.server``."""

from __future__ import annotations

import logging

from quart import Quart, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from core.conversation import ANNOUNCE_LATER
from core.errors import DatabaseUnavailable
from core.settings import Settings
from core.store import unreachable
from gateway import (
    answering_routes,
    browser_calls,
    connect_routes,
    dashboard,
    email_channel,
    messaging,
    metrics_route,
    openapi,
    outbound_routes,
    pages,
    voice_routes,
    web_api,
    webchat,
)
from gateway.limits import PathLimitedRequest
from gateway.live import LiveFeed
from gateway.media_procs import stop_calls, stop_taking_calls
from gateway.messaging_asgi import MessagingWebhooks
from gateway.plugin_routes import mount_plugin_routes
from gateway.services import ACK_POOL_SIZE, Services
from gateway.tasks import BackgroundTasks
from gateway.worker import start_in_process

log = logging.getLogger(__name__)

# Twilio's webhooks are small forms; anything far larger is not from Twilio.
MAX_BODY_BYTES = 256 * 1024


def create_app(settings: Settings, db, *, turns_in_process: bool = True, media_in_process: bool = True,  # type: ignore[no-untyped-def]
               **services) -> Quart:  # fmt: skip
    """The app over an open store. ``db=None`` builds it only to list its routes (``pepper doctor``).

    Keyword arguments become fields of :class:`gateway.services.Services` (``harness``, ``messenger``).
    ``turns_in_process`` runs a turn worker in this event loop; ``pepper serve`` normally runs
    them in their own processes instead (see ``gateway.worker``). ``media_in_process`` serves the
    Twilio media socket (the calls) in this event loop too; with ``PEPPER_MEDIA_PROCESSES`` >= 2,
    media processes hold the calls (``gateway.media_procs``) and this app only answers webhooks.
    """
    app = Quart("pepper", static_folder=None)  # gateway.pages serves the static files
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.request_class = PathLimitedRequest  # inbound mail may be larger
    services.setdefault("tasks", BackgroundTasks(settings.max_concurrent_turns))
    if db is not None:
        services.setdefault("live", LiveFeed(db.dsn))
    shared = Services(settings=settings, db=db, **services)
    worker = start_in_process(shared) if turns_in_process and db is not None else None
    app.extensions["pepper"] = shared
    app.register_blueprint(messaging.blueprint)
    app.register_blueprint(webchat.blueprint)
    app.register_blueprint(email_channel.blueprint)
    app.register_blueprint(voice_routes.blueprint)
    app.register_blueprint(outbound_routes.blueprint)
    app.register_blueprint(answering_routes.blueprint)
    app.register_blueprint(connect_routes.blueprint)
    app.register_blueprint(browser_calls.blueprint)
    app.register_blueprint(pages.blueprint)
    app.register_blueprint(dashboard.blueprint)
    app.register_blueprint(web_api.blueprint)
    mount_plugin_routes(app, db)

    @app.before_serving
    async def start_live_feed() -> None:
        if shared.live is not None:
            await shared.live.start()
        if db is not None and shared.ack_db is None:
            # Every connection opened before serving: opening one (a backend forked, the vector
            # type looked up) during a burst of webhooks held their acknowledgements up.
            shared.ack_db = await db.side_pool(min_size=ACK_POOL_SIZE, max_size=ACK_POOL_SIZE, settings=ANNOUNCE_LATER)
        if worker is not None:
            await worker.start()

    control = None

    @app.before_serving
    async def start_media() -> None:
        nonlocal control
        if shared.calls is not None:
            from voice.control import CallControl

            # Browser calls (gateway.browser_calls) are held here even when media processes hold
            # the phone calls: recorded under this process's session, swept if it dies.
            control = CallControl(shared.calls, db.dsn, name="pepper-web")
            await control.start()
            if media_in_process:
                from gateway.media_server import start_media_server

                shared.media = await start_media_server(shared, settings.host, settings.media_port,
                                                        shared.media_listener)  # fmt: skip

    metrics_route.register(app, settings)
    openapi.register(app)

    @app.errorhandler(Exception)
    async def database_out_of_reach(error: Exception):  # type: ignore[no-untyped-def]
        # A request that found the database restarting or out of reach recorded nothing: 503 and
        # Retry-After, so Twilio (and a browser's retry) sends it again. Anything else is a 500.
        if isinstance(error, HTTPException):
            return error
        if not unreachable(error):
            raise error
        log.warning("%s %s found the database out of reach: %s", request.method, request.path, type(error).__name__)
        return Response("temporarily unavailable; retry\n", status=503, content_type="text/plain",
                        headers={"Retry-After": "1"})  # fmt: skip

    @app.get("/healthz")
    async def health():  # type: ignore[no-untyped-def]
        if db is None:
            return jsonify(status="unhealthy", database="not opened"), 503
        try:
            detail = await db.health()
        except DatabaseUnavailable:
            log.warning("health check: database unavailable", exc_info=True)
            return jsonify(status="unhealthy", database="unavailable"), 503
        status = "ok" if detail["pending_migrations"] == 0 else "migrating"
        return jsonify(status=status, database="ok", **detail), 200 if status == "ok" else 503

    @app.after_serving
    async def drain() -> None:
        # Turns started by webhooks that were already acknowledged: let them finish and reply.
        stop_taking_calls(shared)  # before the turn workers' drain, which may take the whole grace
        if worker is not None:
            await worker.stop(settings.graceful_timeout)
        await stop_calls(shared, settings.graceful_timeout)  # and the turns' tasks
        if control is not None:
            await control.stop()
        if shared.messenger is not None:
            await shared.messenger.close()
        if shared.live is not None:
            await shared.live.stop()
        if shared.ack_db is not None:
            await shared.ack_db.close()

    return app


def asgi_app(app: Quart) -> MessagingWebhooks:
    """What the HTTP server serves: the inbound message webhooks' thin layer in front of ``app``."""
    return MessagingWebhooks(app, MAX_BODY_BYTES)
