"""Start an aiohttp app on a free loopback port: what every HTTP peer in core/testing does first."""

from __future__ import annotations

from typing import Any, Self

from aiohttp import web


async def serve_loopback(app: web.Application) -> tuple[web.AppRunner, int]:
    """The started runner (``await runner.cleanup()`` stops it) and the port it listens on."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


class HttpPeer:
    """An HTTP peer on 127.0.0.1: ``async with Peer() as peer:``, then ``peer.url``.

    Subclasses give their :meth:`routes` (and :meth:`middlewares`, if they record or fault requests).
    """

    port: int = 0
    _runner: web.AppRunner | None = None
    # aiohttp's default (1 MiB) refuses the large bodies some peers must take (audio, attachments).
    client_max_size: int = 1024**2

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def middlewares(self) -> list[Any]:
        return []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(middlewares=self.middlewares(), client_max_size=self.client_max_size)
        app.add_routes(self.routes())
        self._runner, self.port = await serve_loopback(app)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
