"""Listening sockets, bound before anything slow starts so a busy port fails at once."""

from __future__ import annotations

import errno
import socket

from core.errors import StartupError


def bind_listener(host: str, port: int, setting: str = "PEPPER_PORT", *, reuse_port: bool = False) -> socket.socket:
    """Bind the listening socket before anything slow starts, so a busy port fails at once.

    ``reuse_port``: several processes bind the port, each its own socket (``gateway.media_procs``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"port {port} on {host} is already in use; set {setting} to another") from exc
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def bind_shared(host: str, port: int) -> socket.socket:
    """A ``SO_REUSEPORT`` socket on ``host:port`` (0: a free port), bound, not listening.

    Bound before anything slow starts so a busy port fails at once, as ``gateway.sockets.bind_listener`` does.
    """
    if not hasattr(socket, "SO_REUSEPORT"):
        raise StartupError("PEPPER_MEDIA_PROCESSES above 1 needs SO_REUSEPORT (Linux); set it to 1 here")
    return bind_listener(host, port, "PEPPER_MEDIA_PORT", reuse_port=True)
