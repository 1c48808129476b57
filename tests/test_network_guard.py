import asyncio
import socket

import httpx
import pytest

from core.testing.netguard import NetworkBlocked, is_loopback


def test_connecting_to_a_public_address_fails_at_once_and_names_it():
    with pytest.raises(NetworkBlocked, match=r"203\.0\.113\.9"):
        socket.create_connection(("203.0.113.9", 443), timeout=30)


def test_resolving_a_public_name_fails_and_names_the_host():
    with pytest.raises(NetworkBlocked, match=r"api\.openai\.com"):
        socket.getaddrinfo("api.openai.com", 443)


def test_an_sdk_style_http_client_is_refused_with_the_host_named():
    with pytest.raises(httpx.ConnectError, match=r"example\.com"):
        httpx.get("https://example.com/", timeout=30)


async def test_asyncio_connections_are_guarded_too():
    with pytest.raises(NetworkBlocked, match=r"198\.51\.100\.7"):
        await asyncio.open_connection("198.51.100.7", 80)


async def test_loopback_still_works():
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("localhost", port)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()


@pytest.mark.parametrize(
    ("host", "expected"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("localhost", True), ("10.0.0.1", False),
     ("192.168.1.1", False), ("example.com", False), ("0.0.0.0", False)],
)  # fmt: skip
def test_only_loopback_counts_as_local(host, expected):
    assert is_loopback(host) is expected
