"""A loopback Home Assistant REST API: ``/api/``, ``/api/states`` and ``/api/services/<domain>/<service>``.

Bearer-token auth as Home Assistant checks it: anything else gets its bare ``401: Unauthorized``.
A service call
changes the entity's state the way the real one does for the services tests use, and is recorded
in ``calls``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer

STATES: dict[str, tuple[str, dict[str, Any]]] = {
    "light.kitchen": ("on", {"friendly_name": "Kitchen light", "brightness": 200}),
    "light.hall": ("off", {"friendly_name": "Hall light"}),
    "lock.front_door": ("locked", {"friendly_name": "Front door"}),
    "climate.living_room": ("heat", {"friendly_name": "Living room", "temperature": 20, "current_temperature": 19.5}),
    "sensor.outside_temperature": ("7.5", {"friendly_name": "Outside temperature", "unit_of_measurement": "°C"}),
    "binary_sensor.back_window": ("off", {"friendly_name": "Back window", "device_class": "window"}),
}
EFFECT = {"turn_on": "on", "turn_off": "off", "lock": "locked", "unlock": "unlocked"}


@dataclass
class HomeAssistantPeer(HttpPeer):
    token: str = "ha-long-lived-token"
    states: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=lambda: dict(STATES))
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/", self._root),
            web.get("/api/states", self._states),
            web.post("/api/services/{domain}/{service}", self._service),
        ]

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def _state(self, entity: str) -> dict[str, Any]:
        state, attributes = self.states[entity]
        stamp = "2025-03-27T09:00:00.000000+00:00"
        return {"entity_id": entity, "state": state, "attributes": attributes, "last_changed": stamp,
                "last_reported": stamp, "last_updated": stamp,
                "context": {"id": "01H" + "0" * 23, "parent_id": None, "user_id": None}}  # fmt: skip

    async def _root(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.Response(status=401, text="401: Unauthorized")
        return web.json_response({"message": "API running."})

    async def _states(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.Response(status=401, text="401: Unauthorized")
        return web.json_response([self._state(e) for e in sorted(self.states)])

    async def _service(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.Response(status=401, text="401: Unauthorized")
        try:
            data = json.loads(await request.text() or "{}")
        except ValueError:
            return web.json_response({"message": "Data should be valid JSON."}, status=400)
        domain, service = request.match_info["domain"], request.match_info["service"]
        entity = data.get("entity_id") if isinstance(data, dict) else None
        if entity not in self.states or not str(entity).startswith(f"{domain}."):
            return web.json_response({"message": f"Service {domain}.{service} not found."}, status=400)
        self.calls.append((domain, service, data))
        if service in EFFECT:
            self.states[entity] = (EFFECT[service], self.states[entity][1])
        return web.json_response([self._state(entity)])
