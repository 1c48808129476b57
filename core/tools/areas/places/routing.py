"""Where a place is and how long it takes to get there: one adapter for the routing services
(OSRM and OpenRouteService, over their HTTP APIs), and the offline estimate used without one.

The estimate is hand-written (a few lines of the haversine formula): straight-line distance,
times a detour factor, at a configured speed. It is always labelled an estimate.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

from core.tools.connectors import Connectors

log = logging.getLogger(__name__)

EARTH_KM = 6371.0088
# Roads and paths are longer than the straight line; 1.3 is the usual rule of thumb in towns.
DETOUR = 1.3
_COORDS = re.compile(r"(-?\d{1,2}(?:\.\d+)?)\s*,\s*(-?\d{1,3}(?:\.\d+)?)")


@dataclass(frozen=True)
class Point:
    lat: float
    lon: float
    label: str = ""


@dataclass(frozen=True)
class Travel:
    minutes: int
    km: float
    estimate: bool  # True: straight-line distance at a set speed, not a route
    source: str  # "estimate", "osrm" or "openrouteservice"
    note: str = ""  # why a route was not used (the service failed), when it was asked

    def describe(self) -> str:
        if self.estimate:
            why = f"; {self.note}" if self.note else ""
            return f"about {self.minutes} min (an estimate from straight-line distance, {self.km:.1f} km{why})"
        return f"{self.minutes} min by road ({self.km:.1f} km, {self.source})"


class RoutingError(Exception):
    pass


def coordinates_in(text: str) -> Point | None:
    """``"48.8566, 2.3522"`` (latitude, longitude) written in a location, or None."""
    found = _COORDS.fullmatch(text.strip()) or _COORDS.search(text)
    if found is None:
        return None
    lat, lon = float(found[1]), float(found[2])
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        return None
    return Point(lat, lon, text.strip())


def haversine_km(a: Point, b: Point) -> float:
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_KM * math.asin(min(1.0, math.sqrt(h)))


def estimate(a: Point, b: Point, speed_kmh: float, note: str = "") -> Travel:
    km = haversine_km(a, b) * DETOUR
    return Travel(max(1, math.ceil(km / speed_kmh * 60)), km, True, "estimate", note)


class Routing:
    """The configured routing service (``connectors.routing_kind``), or none: then every travel
    time is :func:`estimate`. A service that fails falls back to the estimate and says so."""

    def __init__(self, connectors: Connectors, profile: str = "driving") -> None:
        self.connectors = connectors
        self.kind = connectors.routing_kind if connectors.routing_url else "none"
        self.url = (connectors.routing_url or "").rstrip("/")
        self.profile = profile

    @property
    def geocodes(self) -> bool:
        return self.kind == "openrouteservice"

    async def travel(self, a: Point, b: Point) -> Travel:
        speed = self.connectors.travel_speed_kmh
        if self.kind == "none":
            return estimate(a, b, speed)
        try:
            seconds, metres = await self._route(a, b)
        except (RoutingError, httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("routing service failed; estimating: kind=%s error=%s", self.kind, type(exc).__name__)
            return estimate(a, b, speed, note=f"the {self.kind} routing service did not answer")
        return Travel(max(1, math.ceil(seconds / 60)), metres / 1000, False, self.kind)

    async def _route(self, a: Point, b: Point) -> tuple[float, float]:
        async with self.connectors.http() as http:
            if self.kind == "osrm":
                # OSRM's HTTP API: /route/v1/{profile}/{lon},{lat};{lon},{lat}
                path = f"{self.url}/route/v1/{self.profile}/{a.lon},{a.lat};{b.lon},{b.lat}"
                response = await http.get(path, params={"overview": "false"})
                body = _json(response)
                if body.get("code") != "Ok" or not body.get("routes"):
                    raise RoutingError(str(body.get("code")))
                route = body["routes"][0]
                return float(route["duration"]), float(route["distance"])
            profile = {"driving": "driving-car", "walking": "foot-walking", "cycling": "cycling-regular"}
            response = await http.post(
                f"{self.url}/v2/directions/{profile.get(self.profile, self.profile)}",
                json={"coordinates": [[a.lon, a.lat], [b.lon, b.lat]]},
                headers={"Authorization": self.connectors.routing_key or ""},
            )
            summary = _json(response)["routes"][0]["summary"]
            return float(summary.get("duration", 0.0)), float(summary.get("distance", 0.0))

    async def geocode(self, text: str) -> Point | None:
        """OpenRouteService's geocoder (Pelias): the best match, or None. Raises ``RoutingError``."""
        if not self.geocodes:
            return None
        try:
            async with self.connectors.http() as http:
                response = await http.get(
                    f"{self.url}/geocode/search",
                    params={"text": text, "size": "1"},
                    headers={"Authorization": self.connectors.routing_key or ""},
                )
                features = _json(response).get("features") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise RoutingError("the geocoding service did not answer") from exc
        if not features:
            return None
        try:
            lon, lat = features[0]["geometry"]["coordinates"][:2]
            label = str(features[0].get("properties", {}).get("label") or text)
            return Point(float(lat), float(lon), label)
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError("the geocoding service answered something else") from exc


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise RoutingError(f"answered {response.status_code}")
    body = response.json()
    if not isinstance(body, dict):
        raise RoutingError("not a JSON object")
    return body
