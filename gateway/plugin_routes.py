"""HTTP routes of ``route`` plugins, each under ``/plugins/NAME/`` (``core.slots.plugins``).

Pepper does not authenticate these requests: a plugin's route checks whatever its callers must
prove (a signature, a token). A handler that raises answers 500 with a fixed body and is logged;
it never reaches the other routes.
"""

from __future__ import annotations

import logging
from typing import Any

from quart import Quart, Response, request

from core.slots.plugins import PluginRequest, PluginRoute, discover, plugin_routes
from core.store.queries import Queries

log = logging.getLogger(__name__)


def _view(name: str, route: PluginRoute) -> Any:
    prefix = f"/plugins/{name}"

    async def view(**_: Any) -> Response:
        below = request.path[len(prefix) :] or "/"
        body = await request.get_data(as_text=False)
        raw = body if isinstance(body, bytes) else body.encode()
        incoming = PluginRequest(request.method, below, dict(request.args), dict(request.headers), raw)
        try:
            answer = await route.handler(incoming)
        except Exception:
            log.exception("plugin route failed: plugin=%s", name)
            return Response('{"error": "plugin-failed"}', 500, content_type="application/json")
        return Response(answer.body, answer.status, content_type=answer.content_type)

    return view


def mount_plugin_routes(app: Quart, db: Queries | None = None) -> list[str]:
    """Mount every usable plugin route on ``app`` (with ``db``, the webhooks of channel plugins
    too, ``gateway.plugin_channels``); returns the paths mounted."""
    from gateway.plugin_channels import channel_plugins, channel_routes

    mounted = []
    found = discover()
    extra = channel_routes(channel_plugins(found), db) if db is not None else []
    for n, (path, route) in enumerate(plugin_routes(found, extra)):
        name = path.split("/")[2]
        app.add_url_rule(path, endpoint=f"plugin-{n}-{name}", view_func=_view(name, route), methods=[route.method])
        mounted.append(path)
    return mounted
