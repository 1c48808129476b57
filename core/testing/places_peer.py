"""A loopback routing service speaking OSRM's and OpenRouteService's JSON: OSRM's
``GET /route/v1/{profile}/{lon},{lat};{lon},{lat}``, OpenRouteService's
``POST /v2/directions/{profile}`` (GeoJSON coordinates, ``Authorization`` key) and its Pelias
geocoder ``GET /geocode/search``. Shapes as the services document them (trimmed to the fields
Pepper reads plus their neighbours)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer


class RoutingPeer(HttpPeer):
    def __init__(self, *, duration: float, distance: float, place: tuple[float, float] = (48.8049, 2.1204)) -> None:
        self.duration, self.distance, self.place = duration, distance, place
        self.fail = False
        self.requests: list[dict[str, Any]] = []

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/route/v1/{profile}/{coords}", self._osrm),
            web.post("/v2/directions/{profile}", self._ors),
            web.get("/geocode/search", self._geocode),
        ]

    async def _osrm(self, request: web.Request) -> web.Response:
        self.requests.append({"kind": "osrm", "coords": request.match_info["coords"]})
        if self.fail:
            return web.json_response({"code": "NoRoute", "message": "Impossible route between points"}, status=400)
        pairs = [p.split(",") for p in request.match_info["coords"].split(";")]
        return web.json_response(
            {
                "code": "Ok",
                "routes": [
                    {"geometry": "", "legs": [{"steps": [], "summary": "", "weight": self.duration,
                                               "duration": self.duration, "distance": self.distance}],
                     "weight_name": "routability", "weight": self.duration, "duration": self.duration,
                     "distance": self.distance}
                ],
                "waypoints": [{"hint": "", "distance": 0.0, "name": "", "location": [float(x), float(y)]}
                              for x, y in pairs],
            }
        )  # fmt: skip

    async def _ors(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"kind": "openrouteservice", "authorization": request.headers.get("Authorization"),
                              "coordinates": body.get("coordinates")})  # fmt: skip
        if self.fail:
            return web.json_response({"error": {"code": 2010, "message": "Could not find routable point"}}, status=404)
        return web.json_response(
            {
                "bbox": [2.12, 48.80, 2.35, 48.86],
                "routes": [
                    {"summary": {"distance": self.distance, "duration": self.duration}, "segments": [],
                     "bbox": [2.12, 48.80, 2.35, 48.86], "geometry": "", "way_points": [0, 1]}
                ],
                "metadata": {"attribution": "openrouteservice.org", "service": "routing"},
            }
        )  # fmt: skip

    async def _geocode(self, request: web.Request) -> web.Response:
        self.requests.append({"kind": "geocode", "text": request.query.get("text")})
        lat, lon = self.place
        return web.json_response(
            {
                "geocoding": {"version": "0.2", "query": {"text": request.query.get("text")}},
                "type": "FeatureCollection",
                "features": [
                    {"type": "Feature", "geometry": {"type": "Point", "coordinates": [lon, lat]},
                     "properties": {"label": f"{request.query.get('text')}, France", "confidence": 0.9}}
                ],
                "bbox": [lon, lat, lon, lat],
            }
        )  # fmt: skip
