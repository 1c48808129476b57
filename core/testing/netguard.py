"""A pytest plugin that keeps tests off the network.

Any attempt to resolve or connect to a host outside the loopback range fails at once with
:class:`NetworkBlocked`, whose message names the host. Unix sockets and 127.0.0.0/8 / ::1 work
as usual, so tests can run every peer they need on this machine.

Enabled for the whole suite by ``-p core.testing.netguard`` in ``pyproject.toml``.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_original_connect = socket.socket.connect
_original_connect_ex = socket.socket.connect_ex
_original_getaddrinfo = socket.getaddrinfo


class NetworkBlocked(ConnectionRefusedError):
    """Raised instead of reaching a non-loopback host from a test."""

    def __init__(self, host: object):
        super().__init__(f"tests may not reach the network: blocked connection to {host}")
        self.host = host


def is_loopback(host: object) -> bool:
    if host is None:
        return True  # getaddrinfo(None, port) means the local host
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    text = str(host).strip("[]").split("%", 1)[0].lower()
    if text in _LOOPBACK_NAMES or text == "":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _check_address(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
        if not is_loopback(address[0]):
            raise NetworkBlocked(address[0])


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check_address(self, address)
    return _original_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check_address(self, address)
    return _original_connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not is_loopback(host):
        raise NetworkBlocked(host)
    return _original_getaddrinfo(host, *args, **kwargs)


def install() -> None:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = _guarded_getaddrinfo


def uninstall() -> None:
    socket.socket.connect = _original_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _original_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = _original_getaddrinfo


def pytest_configure(config: Any) -> None:
    install()


def pytest_unconfigure(config: Any) -> None:
    uninstall()
