"""The egress relay: HTTP to the public internet, and nothing inside the house.

Everything the research helper fetches (search APIs, pages) goes through :class:`Egress`. Before
each connection the host name is resolved and every address it resolves to is checked: loopback,
private, link-local, CGNAT (100.64.0.0/10), multicast, unspecified, reserved and cloud metadata
addresses (169.254.169.254, fd00:ec2::254) are refused. The connection then goes to the checked
address itself (the host name stays in the ``Host`` header and the TLS server name), so a second
DNS answer cannot point it elsewhere. Redirects are followed here, by hand, each hop checked the
same way, up to :attr:`EgressPolicy.max_redirects`.

Each fetch has a total time limit and a body cap (read as a stream and stopped at the cap). No
cookies are kept or sent, no proxy or ``.netrc`` from the environment is used, a URL with a user
name or password is refused, and the caller's headers (an API key) never follow a redirect to
another host.

Tests reach loopback peers only through :attr:`EgressPolicy.loopback_ports`, a test-only setting
that names the ports of those peers; it is empty by default, and even then no other loopback port,
and no private address, is reachable.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from core.errors import PepperError
from core.web.tls import tls_context

# Resolves (host, port) to the IP addresses a connection could reach.
Resolver = Callable[[str, int], Awaitable[list[str]]]

MB = 1024 * 1024
REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "Pepper-research/0.1 (+https://github.com/pepper)"
# Cloud metadata services, named in the refusal (they are link-local or private anyway).
METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
CGNAT = ipaddress.ip_network("100.64.0.0/10")


class EgressError(PepperError):
    """A fetch that did not complete; the message says why, in words a model can repeat.

    ``code`` tells the kinds apart: ``egress-too-large``, ``egress-timeout`` (retryable), or the
    refusal below.
    """

    code = "egress-failed"


class EgressRefused(EgressError):
    """The destination is not on the public internet."""

    code = "egress-refused"


def _too_large(message: str) -> EgressError:
    return EgressError(message, code="egress-too-large")


def _timeout(message: str) -> EgressError:
    return EgressError(message, code="egress-timeout", retryable=True)


@dataclass(frozen=True)
class EgressPolicy:
    max_bytes: int = 5 * MB
    timeout: float = 15.0  # seconds for the whole fetch, redirects included
    max_redirects: int = 5
    # Tests only: loopback ports the relay may reach (the tests' own peers). Never set in production.
    loopback_ports: frozenset[int] = frozenset()


@dataclass(frozen=True)
class WebResponse:
    status: int
    url: str  # after redirects
    headers: httpx.Headers
    content: bytes
    redirects: tuple[str, ...] = ()

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def text(self) -> str:
        return httpx.Response(self.status, headers=self.headers, content=self.content).text

    def json(self) -> Any:
        return httpx.Response(self.status, headers=self.headers, content=self.content).json()


def refusal(address: str, port: int, policy: EgressPolicy) -> str | None:
    """Why ``address`` may not be reached, or None when it is a public internet address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA:
        return f"{ip} is a cloud metadata address"
    if ip.is_loopback:
        if port in policy.loopback_ports:
            return None
        return f"{ip} is a loopback address (this machine)"
    if ip.is_unspecified:
        return f"{ip} is the unspecified address"
    if ip.is_link_local:
        return f"{ip} is a link-local address"
    if ip.is_multicast:
        return f"{ip} is a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT:
        return f"{ip} is a carrier-grade NAT address (100.64.0.0/10)"
    if ip.is_private:
        return f"{ip} is a private network address"
    if not ip.is_global:
        return f"{ip} is not a public internet address"
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


@dataclass
class Egress:
    """The relay. One ``httpx`` client per fetch, so no connection or cookie outlives it."""

    policy: EgressPolicy = field(default_factory=EgressPolicy)
    resolver: Resolver = system_resolver
    transport: httpx.AsyncBaseTransport | None = None  # tests only

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
    ) -> WebResponse:
        """Fetch ``url``; raises :class:`EgressError` (refused, too large, timed out, unreachable)."""
        deadline = time.monotonic() + self.policy.timeout
        try:
            async with asyncio.timeout(self.policy.timeout):
                target = httpx.URL(url) if params is None else httpx.URL(url).copy_merge_params(dict(params))
                return await self._fetch(target, method, dict(headers or {}), json, deadline)
        except TimeoutError:
            raise _timeout(f"{_short(url)} did not answer within {self.policy.timeout:g} s") from None

    async def _fetch(
        self, url: httpx.URL, method: str, headers: dict[str, str], body: Any, deadline: float
    ) -> WebResponse:
        hops: list[str] = []
        first_host = url.host
        async with httpx.AsyncClient(
            follow_redirects=False, trust_env=False, transport=self.transport, timeout=self.policy.timeout,
            verify=tls_context(),
        ) as client:  # fmt: skip
            while True:
                pinned, extensions = await self._pin(url)
                sent = {"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate"}
                if url.host == first_host:
                    sent.update(headers)  # an API key goes only to the host it was meant for
                sent["Host"] = url.netloc.decode("ascii")
                request = client.build_request(
                    method, pinned, headers=sent, json=body, extensions=extensions, timeout=self._left(deadline)
                )
                try:
                    response = await client.send(request, stream=True)
                except httpx.TimeoutException:
                    raise _timeout(f"{_short(str(url))} did not answer in time") from None
                except httpx.HTTPError as exc:
                    raise EgressError(f"could not reach {url.host} ({type(exc).__name__})") from None
                try:
                    if response.status_code in REDIRECTS and "location" in response.headers:
                        if len(hops) >= self.policy.max_redirects:
                            raise EgressError(
                                f"more than {self.policy.max_redirects} redirects from {_short(str(url))}"
                            )
                        target = url.join(response.headers["location"])
                        hops.append(str(target))
                        if response.status_code == 303 or (response.status_code in (301, 302) and method != "GET"):
                            method, body = "GET", None
                        url = target
                        continue
                    content = await self._read(response, url)
                finally:
                    await response.aclose()
                return WebResponse(response.status_code, str(url), response.headers, content, tuple(hops))

    async def _pin(self, url: httpx.URL) -> tuple[httpx.URL, dict[str, Any]]:
        """The URL with its host replaced by a checked address, and the TLS name to use."""
        if url.scheme not in ("http", "https"):
            raise EgressRefused(f"only http and https URLs can be fetched, not {url.scheme or 'this'}:")
        if url.userinfo:
            raise EgressRefused("a URL with a user name or password is not fetched")
        host = url.host
        if not host:
            raise EgressRefused("the URL has no host")
        port = url.port or (443 if url.scheme == "https" else 80)
        literal = _literal(host)
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = await self.resolver(host, port)
            except OSError as exc:
                raise EgressError(f"{host} could not be resolved ({exc.strerror or type(exc).__name__})") from None
            if not addresses:
                raise EgressError(f"{host} could not be resolved")
        for address in addresses:  # every answer must be public: a name is not trusted for its first one
            reason = refusal(address, port, self.policy)
            if reason is not None:
                raise EgressRefused(f"{host} is not on the public internet: {reason}")
        ip = ipaddress.ip_address(addresses[0].split("%", 1)[0])
        extensions: dict[str, Any] = {}
        if url.scheme == "https" and literal is None:
            extensions["sni_hostname"] = host
        return url.copy_with(host=str(ip)), extensions

    async def _read(self, response: httpx.Response, url: httpx.URL) -> bytes:
        cap = self.policy.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise _too_large(f"{_short(str(url))} is {_mb(int(declared))}, over the {_mb(cap)} limit; not read")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > cap:
                    raise _too_large(f"{_short(str(url))} is over the {_mb(cap)} limit; reading stopped there")
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise _timeout(f"{_short(str(url))} stopped sending in time") from None
        except httpx.HTTPError as exc:
            raise EgressError(f"reading {url.host} failed ({type(exc).__name__})") from None
        return b"".join(chunks)

    def _left(self, deadline: float) -> float:
        return max(0.1, deadline - time.monotonic())


def _mb(size: int) -> str:
    return f"{size / MB:.1f} MB" if size >= MB else f"{size} bytes"


def _short(url: str, limit: int = 80) -> str:
    return url if len(url) <= limit else url[: limit - 3] + "..."


def egress_policy(settings: Any) -> EgressPolicy:
    """The relay's caps from the settings (``web_fetch_*``; the test-only loopback ports)."""
    return EgressPolicy(
        max_bytes=settings.web_fetch_max_bytes,
        timeout=settings.web_fetch_seconds,
        loopback_ports=frozenset(settings.web_test_loopback_ports),
    )
