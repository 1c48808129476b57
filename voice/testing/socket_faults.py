"""Faults the loopback voice model peers inject at their socket, shared by each of them.

``refuse`` answers the next N WebSocket handshakes with HTTP 503 (the provider down when a call
starts), ``hold`` keeps the next one waiting that many seconds (the provider hanging); :func:`cut`
ends one connection without a close frame (the network or the upstream gone mid-call). Each
peer's ``drop`` closes with 1011, and ``server_error`` sends its protocol's error event (the
provider's 5xx as an event), where its protocol has one.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response


class Refusals:
    """``refuse`` handshakes to go; ``refused_at``: when each refusal went out (``time.monotonic``).
    ``hold``: seconds the next handshake waits before it is answered (a provider that hangs)."""

    def __init__(self) -> None:
        self.refuse = 0
        self.refused_at: list[float] = []
        self.hold = 0.0
        self.held_at: list[float] = []

    async def check(self, connection: ServerConnection, request: Request) -> Response | None:
        """A ``process_request`` hook: 503 while refusals are due, else the handshake goes on."""
        if self.hold > 0:
            hold, self.hold = self.hold, 0.0
            self.held_at.append(time.monotonic())
            await asyncio.sleep(hold)
        if self.refuse <= 0:
            return None
        self.refuse -= 1
        self.refused_at.append(time.monotonic())
        return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "upstream unavailable\n")


def cut(ws: ServerConnection) -> float:
    """End the connection at once, without a close frame; returns when (``time.monotonic``)."""
    at = time.monotonic()
    ws.transport.abort()
    return at
