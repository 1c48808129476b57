"""``GET /metrics``: the Prometheus text of every process of this server (``core.metrics``).

Who may read it: with ``PEPPER_METRICS_TOKEN`` set, whoever sends it as a bearer token; without
it, only a scraper on this machine talking to Pepper directly (a loopback address and no
forwarding header: a request through the reverse proxy carries ``X-Forwarded-For``, so the public
side of the proxy never sees the metrics by default).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress

from quart import Quart, Response, g, request

from core.metrics import exposition, metrics
from core.settings import Settings
from gateway.webhooks import MEDIA_STREAM, WEBHOOKS

FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


# Webhooks Quart answers (the messaging ones are counted by ``gateway.messaging_asgi``), by path.
_WEBHOOK_NAMES = {w.path: w.name for w in WEBHOOKS if w is not MEDIA_STREAM}


def webhook_outcome(status: int, *, duplicate: bool = False) -> str:
    if status < 400:
        return "duplicate" if duplicate else "accepted"
    if status in (401, 403):
        return "refused"  # a forged or missing signature, a stale or replayed request
    return "failed" if status >= 500 else "malformed"


def count_webhook(name: str, status: int, *, duplicate: bool = False) -> None:
    metrics().webhooks.labels(name, webhook_outcome(status, duplicate=duplicate)).inc()


def mark_duplicate() -> None:
    """This request (a webhook Quart answers) delivered again what was already recorded: it is
    counted as a ``duplicate``, not ``accepted``."""
    g.pepper_duplicate = True


def _from_this_machine() -> bool:
    try:
        loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:  # a Unix socket or no address at all
        loopback = False
    return loopback and not any(name in request.headers for name in FORWARDING_HEADERS)


def register(app: Quart, settings: Settings) -> None:
    expected = f"Bearer {settings.metrics_token.get_secret_value()}" if settings.metrics_token else None

    @app.after_request
    async def count_webhooks(response: Response) -> Response:
        name = _WEBHOOK_NAMES.get(request.path)
        if name is not None:
            count_webhook(name, response.status_code, duplicate=g.get("pepper_duplicate", False))
        return response

    @app.get("/metrics")
    async def metrics_page() -> Response:
        if expected is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return Response("metrics need the bearer token (PEPPER_METRICS_TOKEN)\n", 401,
                                {"WWW-Authenticate": "Bearer", "Content-Type": "text/plain"})  # fmt: skip
        elif not _from_this_machine():
            return Response("metrics are shown only to this machine unless PEPPER_METRICS_TOKEN is set\n", 403,
                            {"Content-Type": "text/plain"})  # fmt: skip
        # Reading every process's files is file I/O: off the event loop.
        body, content_type = await asyncio.to_thread(exposition)
        return Response(body, 200, {"Content-Type": content_type})
