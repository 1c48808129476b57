"""Home Assistant's REST API with a long-lived access token (https://developers.home-assistant.io/docs/api/rest).

``GET /api/`` checks the token (``{"message": "API running."}``), ``GET /api/states`` lists every
entity's state, ``POST /api/services/<domain>/<service>`` calls a service. A wrong token is 401.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from core.errors import InvalidInput, PepperError
from core.tools.connectors import Connectors

_PART = re.compile(r"^[a-z0-9_]{1,64}$")
ENTITY = re.compile(r"^[a-z0-9_]{1,64}\.[a-z0-9_]{1,128}$")


class HomeUnavailable(PepperError):
    code = "home-assistant-unavailable"


def clean_url(url: str) -> str:
    """The server's base URL (``http://homeassistant.local:8123``). Home Assistant usually sits on
    the person's own network, so private addresses are allowed: the URL comes from the person's
    CLI, never from a conversation."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("the Home Assistant address must be an http:// or https:// URL")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/').removesuffix('/api')}"


async def _call(connectors: Connectors, url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        async with connectors.http() as client:
            response = await client.request(method, f"{url}{path}", headers=headers, json=body)
    except httpx.HTTPError as exc:
        raise HomeUnavailable(f"Home Assistant did not answer ({type(exc).__name__})") from exc
    if response.status_code == 401:
        raise HomeUnavailable("Home Assistant refused the token (401): connect it again with a new token")
    if response.status_code >= 400:
        raise HomeUnavailable(f"Home Assistant refused the request (HTTP {response.status_code})")
    try:
        return response.json()
    except ValueError as exc:
        raise HomeUnavailable("Home Assistant's answer is not JSON") from exc


async def check(connectors: Connectors, url: str, token: str) -> None:
    data = await _call(connectors, url, token, "GET", "/api/")
    if not isinstance(data, dict) or "message" not in data:
        raise HomeUnavailable("that address does not answer like Home Assistant's API")


async def states(connectors: Connectors, url: str, token: str) -> list[dict[str, Any]]:
    data = await _call(connectors, url, token, "GET", "/api/states")
    if not isinstance(data, list):
        raise HomeUnavailable("Home Assistant's states are not a list")
    return [s for s in data if isinstance(s, dict) and isinstance(s.get("entity_id"), str)]


async def call_service(
    connectors: Connectors, url: str, token: str, domain: str, service: str, data: dict[str, Any]
) -> None:
    if not _PART.fullmatch(domain) or not _PART.fullmatch(service):
        raise InvalidInput("a service's domain and name are lower-case letters, digits and '_'")
    await _call(connectors, url, token, "POST", f"/api/services/{domain}/{service}", data)
