"""The egress relay reaches the public internet and nothing inside the house (core.web.egress)."""

from __future__ import annotations

import time

import pytest

from core.testing.web_peer import WebPeer
from core.web.egress import Egress, EgressError, EgressPolicy, EgressRefused, refusal


def _egress(web: WebPeer, **kw) -> Egress:
    return Egress(EgressPolicy(loopback_ports=frozenset({web.port}), **kw))


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "100.127.255.254",
        "169.254.169.254", "169.254.10.10", "fe80::1", "fd00:ec2::254", "fc00::5", "224.0.0.1", "ff02::1",
        "0.0.0.0", "::", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "240.0.0.1", "198.18.0.1",
    ],
)  # fmt: skip
def test_every_address_inside_the_house_is_refused(address: str) -> None:
    assert refusal(address, 80, EgressPolicy()) is not None


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(address, 443, EgressPolicy()) is None


def test_metadata_addresses_are_named() -> None:
    assert "metadata" in (refusal("169.254.169.254", 80, EgressPolicy()) or "")
    assert "metadata" in (refusal("fd00:ec2::254", 80, EgressPolicy()) or "")


def test_the_test_allowance_opens_only_its_ports_on_loopback() -> None:
    policy = EgressPolicy(loopback_ports=frozenset({4321}))
    assert refusal("127.0.0.1", 4321, policy) is None
    assert refusal("127.0.0.1", 8080, policy) is not None
    assert refusal("10.0.0.1", 4321, policy) is not None  # never a private address


async def test_a_loopback_peer_is_refused_by_default() -> None:
    async with WebPeer() as web:
        web.page("/p", "<p>hi</p>")
        with pytest.raises(EgressRefused, match="loopback"):
            await Egress().fetch(web.url + "/p")
        assert web.requests == []


async def test_a_page_is_fetched_without_cookies_or_proxies() -> None:
    async with WebPeer() as web:
        web.page("/p", "<p>hello</p>")
        response = await _egress(web).fetch(web.url + "/p")
        assert response.status == 200 and "hello" in response.text
        headers = web.requests[-1][3]
        assert "Cookie" not in headers and "Authorization" not in headers


@pytest.mark.parametrize("target", ["http://127.0.0.1:{other}/secret", "http://169.254.169.254/latest/meta-data/"])
async def test_a_redirect_inside_the_house_is_refused(target: str) -> None:
    async with WebPeer() as web, WebPeer() as inside:
        inside.page("/secret", "private")
        url = f"{web.url}/redirect?to={target.format(other=inside.port)}"
        with pytest.raises(EgressRefused, match="not on the public internet"):
            await _egress(web).fetch(url)
        assert inside.requests == []


async def test_a_name_that_resolves_inside_is_refused_before_connecting() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return {"shop.example": ["93.184.215.14", "10.0.0.7"]}[host]

    with pytest.raises(EgressRefused, match=r"10\.0\.0\.7 is a private"):
        await Egress(resolver=resolver).fetch("https://shop.example/gpu")


async def test_a_redirect_by_name_is_resolved_and_checked_again() -> None:
    async with WebPeer() as web:
        web.page("/final", "<p>arrived</p>")
        names = {"public.example": "127.0.0.1", "internal.example": "192.168.0.10"}

        async def resolver(host: str, port: int) -> list[str]:
            return [names[host]]

        egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port})), resolver=resolver)
        ok = await egress.fetch(f"http://public.example:{web.port}/redirect?to=/final")
        assert ok.text == "<p>arrived</p>" and ok.redirects == (f"http://public.example:{web.port}/final",)
        assert web.requests[-1][3]["Host"] == f"public.example:{web.port}"  # pinned address, original name
        with pytest.raises(EgressRefused, match=r"192\.168\.0\.10"):
            await egress.fetch(f"http://public.example:{web.port}/redirect?to=http://internal.example/admin")


async def test_redirects_are_capped() -> None:
    async with WebPeer() as web:
        url = web.url + "/p"
        for _ in range(4):
            url = f"{web.url}/redirect?to={url}"
        web.page("/p", "end")
        assert (await _egress(web, max_redirects=4).fetch(url)).text == "end"
        with pytest.raises(EgressError, match="more than 3 redirects"):
            await _egress(web, max_redirects=3).fetch(url)


async def test_an_api_key_never_follows_a_redirect_to_another_host() -> None:
    async with WebPeer() as web, WebPeer() as other:
        other.page("/p", "ok")
        egress = Egress(EgressPolicy(loopback_ports=frozenset({web.port, other.port})))
        url = f"{web.url}/redirect?to=http://localhost:{other.port}/p"

        async def resolver(host: str, port: int) -> list[str]:
            return ["127.0.0.1"]

        egress.resolver = resolver
        await egress.fetch(url, headers={"X-Subscription-Token": "secret"})
        assert web.requests[-1][3]["X-Subscription-Token"] == "secret"
        assert "X-Subscription-Token" not in other.requests[-1][3]


async def test_a_50_mb_page_is_cut_off_at_the_cap() -> None:
    async with WebPeer() as web:
        started = time.monotonic()
        with pytest.raises(EgressError, match=r"over the 5.0 MB limit; reading stopped") as caught:
            await _egress(web).fetch(web.url + "/huge?mb=50")
        assert caught.value.code == "egress-too-large" and not caught.value.retryable
        assert time.monotonic() - started < 10


async def test_a_declared_length_over_the_cap_is_not_read() -> None:
    async with WebPeer() as web:
        web.page("/big", b"x" * (2 * 1024 * 1024))
        with pytest.raises(EgressError, match="not read") as caught:
            await _egress(web, max_bytes=1024 * 1024).fetch(web.url + "/big")
        assert caught.value.code == "egress-too-large"


async def test_a_slow_server_times_out() -> None:
    async with WebPeer() as web:
        started = time.monotonic()
        with pytest.raises(EgressError, match=r"did not answer within 0\.5 s|in time") as caught:
            await _egress(web, timeout=0.5).fetch(web.url + "/slow?seconds=30")
        assert caught.value.code == "egress-timeout" and caught.value.retryable
        assert time.monotonic() - started < 3


async def test_credentials_in_a_url_and_other_schemes_are_refused() -> None:
    with pytest.raises(EgressRefused, match="user name or password"):
        await Egress().fetch("https://user:pw@example.com/")
    with pytest.raises(EgressRefused, match="only http and https"):
        await Egress().fetch("file:///etc/passwd")


@pytest.fixture
async def tls_server(tmp_path):
    """A loopback HTTPS server with a certificate no public CA signed; yields (port, its CA file)."""
    import asyncio
    import ssl

    from voice.testing.gemini_live_peer import self_signed

    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], cert
    finally:
        server.close()


async def test_the_relay_checks_certificates_with_one_shared_tls_context(tls_server, monkeypatch) -> None:
    from core.web.tls import tls_context

    port, ca = tls_server
    egress = Egress(EgressPolicy(loopback_ports=frozenset({port})))
    tls_context.cache_clear()
    try:
        with pytest.raises(EgressError, match="could not reach"):  # not signed by a CA we trust
            await egress.fetch(f"https://127.0.0.1:{port}/")
        assert tls_context() is tls_context()  # built once, not per client
        # Trusting the test CA (as an operator would with SSL_CERT_FILE): the same relay gets through.
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        tls_context.cache_clear()
        fetched = await egress.fetch(f"https://127.0.0.1:{port}/")
        assert fetched.status == 200 and fetched.content == b"ok"
    finally:
        tls_context.cache_clear()
