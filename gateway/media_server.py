"""The Twilio media socket on its own listener, served by the ``websockets`` library.

Every call sends a frame each 20 ms and receives one each 20 ms, so the per-frame cost of the
WebSocket stack decides how many calls one process holds. Measured on the 2-core build machine
(server CPU per relayed Twilio frame, caller -> model, including the model-side send):
Quart on Hypercorn (wsproto, pure-Python unmasking, ASGI queues) ~125 us; a bare ASGI app on
Hypercorn ~85 us; ``websockets`` ~45 us. So the media socket has its own port
(``PEPPER_MEDIA_PORT``); the reverse proxy routes ``/twilio/media`` there. Everything else
(webhooks, chat) stays on Quart. Admission is the same as ever: ``X-Twilio-Signature`` over the
public ``wss://`` URL and the one-time token, else close 1008 with only a security event.
"""

from __future__ import annotations

import http
import logging
import socket
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.services import Services
from gateway.signatures import twilio_signature_ok
from gateway.webhooks import MEDIA_STREAM, public_url_for

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
# Twilio frames are ~300 bytes; anything near this is not from Twilio.
MAX_FRAME_BYTES = 64 * 1024


class _Link:
    """The session's view of the socket. A send on a socket the caller already closed is dropped
    (the read loop sees the close and hangs the call up)."""

    __slots__ = ("_ws", "closed")

    def __init__(self, ws: ServerConnection):
        self._ws = ws
        self.closed = False

    async def send(self, text: str) -> None:
        if not self.closed:
            try:
                await self._ws.send(text)
            except ConnectionClosed:
                self.closed = True

    async def close(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            await self._ws.close(code)


def _only_the_media_path(connection: ServerConnection, request: Request) -> Response | None:
    if request.path.split("?", 1)[0] != MEDIA_STREAM.path:
        return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
    return None


async def _media_stream(services: Services, ws: ServerConnection) -> None:
    from voice.service import StreamRefused

    settings = services.settings
    assert ws.request is not None
    # Twilio signs the upgrade over the public wss:// URL with no parameters.
    signature_ok = twilio_signature_ok(settings, public_url_for(settings, MEDIA_STREAM), {}, ws.request.headers)
    calls = services.calls
    if calls is None:
        await ws.close(POLICY_VIOLATION)
        return
    try:
        frames = await calls.read_first_frames(ws.recv)
        start, call = await calls.admit(frames, signature_ok=signature_ok)
    except StreamRefused:
        await ws.close(POLICY_VIOLATION)
        return
    except ConnectionClosed:
        return
    link = _Link(ws)
    session = calls.open_session(link, start, call)
    # Not behind the turn limit (PEPPER_MAX_CONCURRENT_TURNS): every admitted call runs at once.
    task = services.tasks.spawn(f"call-{call.call_sid[-8:]}", calls.run_session(session), limited=False)
    feed = session.feed
    try:
        # The hot path: one text frame in, one ``feed`` (parse, then a send to the model).
        async for raw in ws:
            await feed(raw)
            if session.ended:
                break
    except ConnectionClosed:
        pass
    finally:
        if not session.ended:
            # The caller's side closed the socket.
            link.closed = True
            session.hang_up("hangup")
    # Returning closes the socket now; the call task (owned by services.tasks, drained at shutdown)
    # writes the records after. Twilio's call is over either way.
    del task


async def start_media_server(services: Services, host: str, port: int, sock: socket.socket | None = None) -> Server:
    """Listen for Twilio media sockets on ``sock`` if bound already, else on ``host:port`` (0: a free port)."""

    async def handler(ws: ServerConnection) -> None:
        await _media_stream(services, ws)

    # No permessage-deflate: base64 audio barely compresses and zlib per 20 ms frame costs CPU.
    where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": host, "port": port}
    return await serve(
        handler,
        **where,
        process_request=_only_the_media_path,
        compression=None,
        max_size=MAX_FRAME_BYTES,
        server_header=None,
    )


def media_port(server: Any) -> int:
    return int(next(iter(server.sockets)).getsockname()[1])
