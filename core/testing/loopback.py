"""Start an aiohttp app on a free loopback port: what every HTTP peer in core/testing does first."""

from __future__ import annotations

from aiohttp import web


async def serve_loopback(app: web.Application) -> tuple[web.AppRunner, int]:
    """The started runner (``await runner.cleanup()`` stops it) and the port it listens on."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
