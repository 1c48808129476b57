"""The Twilio media socket on its own listener, served by ``picows`` (a WebSocket stack in Cython).

Every call sends a frame each 20 ms and receives one each 20 ms, so the per-frame cost of the
WebSocket stack decides how many calls one process holds. Measured on the 2-core build machine
(server CPU per relayed Twilio frame, caller -> model, including the model-side send):
Quart on Hypercorn (wsproto, pure-Python unmasking, ASGI queues) ~125 us; a bare ASGI app on
Hypercorn ~85 us; ``websockets`` ~45 us. So the media socket has its own port
(``PEPPER_MEDIA_PORT``); the reverse proxy routes ``/twilio/media`` there. Everything else
(webhooks, chat) stays on Quart.

Why picows rather than ``websockets``: with ``websockets`` a third of the server's time under load
was its Python framing, reading and the wake-up of one task per frame (py-spy, 100 calls). picows
parses in Cython and hands each frame to a plain callback, so a frame that needs no waiting is
relayed without a task switch (this bridge costs ~0.8 us a frame). With the relay's other
shortcuts (voice/adapters/openai_realtime.py) the server's CPU per relayed 20 ms frame fell from
89-132 us to 54-80 us at 25-50 calls, A/B on the same machine (docs/voice.md, issue 6).

Admission is the same as ever: ``X-Twilio-Signature`` over the public ``wss://`` URL and the
one-time token, else close 1008 with only a security event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from picows import (
    WSCloseCode,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    WSUpgradeRequest,
    ws_create_server,
)

from core.adapters.twilio.signatures import twilio_signature_ok
from gateway.services import Services
from gateway.webhooks import MEDIA_STREAM, public_url_for
from voice.ws_frames import text_frame_head

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
# Twilio frames are ~300 bytes; anything near this is not from Twilio (picows closes with 1009).
MAX_FRAME_BYTES = 64 * 1024
# Frames of one call held while an earlier one waits (the model's socket is full): past this, the
# caller's socket is no longer read, so TCP pushes back on Twilio instead of memory growing here.
BACKLOG_PAUSE = 16
_TEXT, _BINARY, _CONTINUATION, _CLOSE = WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.CONTINUATION, WSMsgType.CLOSE
_MEDIA_PATH = MEDIA_STREAM.path.encode()


class _Gone(Exception):
    """The caller's socket closed before the stream was admitted."""


def _server_frame(data: bytes) -> bytes:
    """One final, unmasked text frame carrying ``data``."""
    return text_frame_head(len(data), masked=False) + data


class _Link:
    """The session's view of the socket (``voice.engine.TwilioLink``). Sends are written at once; a
    send on a socket the caller already closed is dropped (``on_ws_disconnected`` hangs the call
    up). While the socket's buffer is over its high-water mark ``backed_up`` is set and the model's
    stream waits in ``drained``, so a caller who stops reading holds the model back rather than
    filling memory here."""

    __slots__ = ("_drained", "_t", "backed_up", "closed")

    def __init__(self, transport: WSTransport):
        self._t = transport
        self._drained: asyncio.Future[None] | None = None
        self.backed_up = False
        self.closed = False

    def send(self, text: str) -> None:
        if not self.closed:
            self._t.send(_TEXT, text)

    def send_many(self, texts: Sequence[str]) -> None:
        # Framed here (a server's frames are unmasked, RFC 6455 5.1) and written to the transport
        # picows writes to, which keeps the order with its own sends: picows writes straight to
        # the socket only while that transport has nothing buffered.
        if not self.closed:
            self._t.underlying_transport.write(b"".join(_server_frame(text.encode()) for text in texts))

    async def drained(self) -> None:
        while self.backed_up and self._drained is not None:
            await asyncio.shield(self._drained)

    async def close(self, code: int = 1000) -> None:
        self.close_now(code)

    def close_now(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            self._t.send_close(WSCloseCode(code))
            self._t.disconnect()  # after what is buffered, the close frame included
        self.writable()

    def paused(self) -> None:
        self.backed_up = True
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def writable(self) -> None:
        self.backed_up = False
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _MediaSocket(WSListener):  # type: ignore[misc]
    """One Twilio media socket: admission, then every frame to the call session's ``feed``.

    Frames of one call are handled strictly in order. ``CallEngine.feed`` is synchronous for what
    needs no waiting (nearly every frame: the audio append is written straight to the model's
    socket), so most frames are relayed inside picows' frame callback with no task at all. When a
    frame has to wait (the model's socket is full, an adapter that awaits), ``feed`` returns what
    is left; a task awaits it and then works through the frames that queued behind it
    (``_backlog``), and past ``BACKLOG_PAUSE`` queued frames the socket stops being read.
    """

    # Without slots an attribute of a picows listener's subclass is ~5x slower to read (the generic
    # lookup, not the specialised one), and every frame reads several.
    __slots__ = ("_backlog", "_early", "_feed", "_fragments", "_paused", "_worker", "link", "media", "request",
                 "session", "t")  # fmt: skip

    def __init__(self, media: MediaServer, request: WSUpgradeRequest):
        self.media = media
        self.request = request
        self.t: WSTransport | None = None
        self.link: _Link | None = None
        self.session: Any = None
        self._feed: Callable[[bytes], Awaitable[None] | None] | None = None
        self._early: asyncio.Queue[bytes | None] = asyncio.Queue()  # frames before admission
        self._backlog: deque[bytes] | None = None  # not None while a frame is being waited on
        self._worker: asyncio.Task[None] | None = None
        self._paused = False
        self._fragments: bytearray | None = None

    # --- picows callbacks (synchronous) ------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.t = transport
        self.link = _Link(transport)
        self.media.opened(self)
        self.media.services.tasks.spawn("media-admit", self._admit(), limited=False)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if (kind is _TEXT or kind is _BINARY) and frame.fin and self._fragments is None:
            raw = frame.get_payload_as_bytes()
        elif kind is _CLOSE:
            if self.link is not None:
                # Echo the caller's code; a close without one is answered with 1000.
                code = frame.get_close_code()
                self.link.close_now(1000 if code == WSCloseCode.NO_INFO else code)
            return
        else:
            raw = self._reassemble(transport, frame)
            if raw is None:
                return
        feed = self._feed
        if feed is None:
            self._early.put_nowait(raw)
        elif self._backlog is None:
            # _deliver and _feed_now, inline for the common frame: nothing waits, so it is handled now.
            try:
                rest = feed(raw)
            except Exception:
                log.exception("a media frame could not be handled")
                return
            if rest is not None:
                self._wait_on(rest)
            elif self.session.ended:
                self._ended()
        else:
            self._deliver(raw)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        link = self.link
        if link is not None:
            link.closed = True
            link.writable()
        self._early.put_nowait(None)
        session = self.session
        if session is not None and not session.ended:
            session.hang_up("hangup")  # the caller's side closed the socket
        self.media.closed(self)

    def pause_writing(self) -> None:
        if self.link is not None:
            self.link.paused()

    def resume_writing(self) -> None:
        if self.link is not None:
            self.link.writable()

    # --- Frames ------------------------------------------------------------------------------

    def _reassemble(self, transport: WSTransport, frame: WSFrame) -> bytes | None:
        """Fragmented messages (Twilio sends none, but the protocol allows them), joined."""
        kind = frame.msg_type
        if kind is _TEXT or kind is _BINARY:
            self._fragments = bytearray(frame.get_payload_as_memoryview())
        elif kind is _CONTINUATION and self._fragments is not None:
            self._fragments += frame.get_payload_as_memoryview()
        else:
            return None  # ping/pong (answered by picows), or a stray continuation
        if len(self._fragments) > MAX_FRAME_BYTES:
            self._fragments = None
            transport.send_close(WSCloseCode.MESSAGE_TOO_BIG)
            transport.disconnect()
            return None
        if not frame.fin:
            return None
        raw, self._fragments = bytes(self._fragments), None
        return raw

    def _deliver(self, raw: bytes) -> None:
        backlog = self._backlog
        if backlog is None:
            self._feed_now(raw)
            return
        backlog.append(raw)
        if len(backlog) >= BACKLOG_PAUSE and not self._paused and self.t is not None:
            self._paused = True
            self.t.underlying_transport.pause_reading()

    def _feed_now(self, raw: bytes) -> None:
        assert self._feed is not None
        try:
            rest = self._feed(raw)
        except Exception:
            log.exception("a media frame could not be handled")
            return
        if rest is None:
            if self.session.ended:
                self._ended()
            return
        self._wait_on(rest)

    def _wait_on(self, rest: Awaitable[None]) -> None:
        """A frame has to wait: later frames queue behind it and a task works through them."""
        self._backlog = deque()
        self._worker = asyncio.get_running_loop().create_task(self._work_through(rest))

    async def _work_through(self, first: Awaitable[None]) -> None:
        backlog, feed = self._backlog, self._feed
        assert backlog is not None and feed is not None
        try:
            await first
            while backlog and not self.session.ended:
                rest = feed(backlog.popleft())
                if rest is not None:
                    await rest
        except Exception:
            log.exception("a media frame could not be handled")
        finally:
            self._backlog = None
            self._worker = None
            if self._paused and self.t is not None and not self.t.is_disconnected:
                self._paused = False
                self.t.underlying_transport.resume_reading()
        if self.session.ended:
            self._ended()

    def _ended(self) -> None:
        """The call ended while reading (``stop``, or the session ended): close the socket now."""
        if self.link is not None:
            self.link.close_now(1000)

    # --- Admission ---------------------------------------------------------------------------

    async def _receive(self) -> bytes:
        raw = await self._early.get()
        if raw is None:
            raise _Gone
        return raw

    async def _admit(self) -> None:
        from voice.service import StreamRefused

        services, link = self.media.services, self.link
        assert link is not None
        settings = services.settings
        # Twilio signs the upgrade over the public wss:// URL with no parameters.
        signature_ok = twilio_signature_ok(settings, public_url_for(settings, MEDIA_STREAM), {}, self.request.headers)
        calls = services.calls
        if calls is None or self.media.closing:
            link.close_now(POLICY_VIOLATION if calls is None else 1001)
            return
        try:
            start = await calls.read_start(self._receive)
            admission = await calls.admit(start, signature_ok=signature_ok)
        except StreamRefused:
            link.close_now(POLICY_VIOLATION)
            return
        except _Gone:
            return
        except BaseException:
            # A store that failed, or the drain cancelling us: no session will ever read this
            # socket, so close it (frames would otherwise queue in ``_early`` until the caller left).
            if not self.media.closing:
                log.exception("admitting a media stream failed")
            link.close_now(1001 if self.media.closing else 1011)
            raise
        session = calls.open_session(link, admission)
        self.session = session
        # Not behind the turn limit (PEPPER_MAX_CONCURRENT_TURNS): every admitted call runs at once.
        services.tasks.spawn(f"call-{admission.call.call_sid[-8:]}", calls.run_session(session), limited=False)
        if link.closed or self.media.closing:  # the caller left, or Pepper began to stop, meanwhile
            session.hang_up("hangup" if link.closed else "shutdown")
            return
        self._feed = session.feed
        # What came after ``start`` while admission ran, in order, then frames go straight to feed.
        while not self._early.empty():
            raw = self._early.get_nowait()
            if raw is None:
                break
            self._deliver(raw)


class MediaServer:
    """The listener and its open sockets (``close``/``wait_closed`` as the app's drain uses them)."""

    def __init__(self, services: Services):
        self.services = services
        self.server: asyncio.Server | None = None
        self.closing = False
        self._open: set[_MediaSocket] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        assert self.server is not None
        return tuple(self.server.sockets)

    def listener(self, request: WSUpgradeRequest) -> WSListener | None:
        if request.path.split(b"?", 1)[0] != _MEDIA_PATH:
            return None  # picows answers 404
        return _MediaSocket(self, request)

    def opened(self, sock: _MediaSocket) -> None:
        self._open.add(sock)
        self._all_closed.clear()

    def closed(self, sock: _MediaSocket) -> None:
        self._open.discard(sock)
        if not self._open:
            self._all_closed.set()

    def close(self, close_connections: bool = True) -> None:
        """Stop listening; with ``close_connections``, close every open socket too (1001)."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        if close_connections:
            for sock in list(self._open):
                if sock.link is not None:
                    sock.link.close_now(1001)

    async def wait_closed(self) -> None:
        """Until every media socket is closed (the calls' own shutdown closes theirs)."""
        await self._all_closed.wait()


async def start_media_server(
    services: Services, host: str, port: int, sock: socket.socket | None = None
) -> MediaServer:
    """Listen for Twilio media sockets on ``sock`` if bound already, else on ``host:port`` (0: a free port)."""
    media = MediaServer(services)
    where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": host, "port": port}
    # No permessage-deflate (picows offers none): base64 audio barely compresses and zlib per 20 ms
    # frame costs CPU. A socket silent for 20 s is pinged; one that does not answer in 20 s is closed
    # (as the ``websockets`` server did; a live call sends every 20 ms, so this costs nothing).
    media.server = await ws_create_server(
        media.listener,
        **where,
        max_frame_size=MAX_FRAME_BYTES,
        enable_auto_ping=True,
        auto_ping_idle_timeout=20,
        auto_ping_reply_timeout=20,
        websocket_handshake_timeout=10,
    )
    return media


def media_port(server: Any) -> int:
    return int(next(iter(server.sockets)).getsockname()[1])
