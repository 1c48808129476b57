"""A loopback Open-Meteo: the geocoding search and the forecast, in Open-Meteo's JSON shapes.

    async with OpenMeteoPeer() as meteo:
        connectors = Connectors(open_meteo_url=meteo.url, open_meteo_geocoding_url=meteo.url)

``places`` maps a lower-cased name to (name, admin1, country, latitude, longitude); a forecast
is made from the coordinates so a test can tell which place was asked for. A request missing
its parameters gets Open-Meteo's error shape (HTTP 400, ``{"error": true, "reason": ...}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer

PLACES = {
    "paris": ("Paris", "Île-de-France", "France", 48.85341, 2.3488),
    "lyon": ("Lyon", "Auvergne-Rhône-Alpes", "France", 45.74846, 4.84671),
    "oslo": ("Oslo", "Oslo", "Norway", 59.91273, 10.74609),
}


@dataclass
class OpenMeteoPeer(HttpPeer):
    places: dict[str, tuple[str, str, str, float, float]] = field(default_factory=lambda: dict(PLACES))
    start_day: date = date(2025, 3, 27)
    requests: list[dict[str, str]] = field(default_factory=list)
    broken: bool = False

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/v1/search", self._search), web.get("/v1/forecast", self._forecast)]

    async def _search(self, request: web.Request) -> web.Response:
        self.requests.append({"path": "search", **request.query})
        name = request.query.get("name", "")
        if len(name) < 2:
            return web.json_response({"error": True, "reason": "Parameter 'name' is required"}, status=400)
        found = self.places.get(name.lower())
        body: dict[str, Any] = {"generationtime_ms": 0.4}
        if found:
            label, admin1, country, lat, lon = found
            body["results"] = [{"id": 1, "name": label, "latitude": lat, "longitude": lon, "elevation": 42.0,
                                "feature_code": "PPLC", "country_code": country[:2].upper(), "timezone": "Europe/Paris",
                                "admin1": admin1, "country": country}]  # fmt: skip
        return web.json_response(body)

    async def _forecast(self, request: web.Request) -> web.Response:
        self.requests.append({"path": "forecast", **request.query})
        if self.broken:
            return web.Response(status=502, text="<html>Bad gateway</html>", content_type="text/html")
        try:
            lat, lon = float(request.query["latitude"]), float(request.query["longitude"])
            days = int(request.query.get("forecast_days", "7"))
        except (KeyError, ValueError):
            return web.json_response(
                {"error": True, "reason": "Cannot initialize WeatherVariable from invalid String value"}, status=400
            )
        if not (-90 <= lat <= 90):
            return web.json_response({"error": True, "reason": "Latitude must be in range of -90 to 90°."}, status=400)
        base = round(lat / 4)  # a place's temperatures follow its latitude: Oslo is colder than Lyon
        times = [(self.start_day + timedelta(days=i)).isoformat() for i in range(days)]
        daily = {
            "time": times,
            "weather_code": [61 if i % 2 else 2 for i in range(days)],
            "temperature_2m_max": [round(30.0 - base + i, 1) for i in range(days)],
            "temperature_2m_min": [round(20.0 - base + i, 1) for i in range(days)],
            "precipitation_probability_max": [80 if i % 2 else 10 for i in range(days)],
            "wind_speed_10m_max": [12.5 for _ in range(days)],
        }
        units = {"time": "iso8601", "weather_code": "wmo code", "temperature_2m_max": "°C",
                 "temperature_2m_min": "°C", "precipitation_probability_max": "%",
                 "wind_speed_10m_max": "km/h"}  # fmt: skip
        return web.json_response({
            "latitude": lat, "longitude": lon, "generationtime_ms": 0.1, "utc_offset_seconds": 3600,
            "timezone": request.query.get("timezone", "GMT"), "timezone_abbreviation": "CET", "elevation": 40.0,
            "current_units": {"time": "iso8601", "interval": "seconds", "temperature_2m": "°C",
                              "weather_code": "wmo code"},
            "current": {"time": f"{times[0]}T10:00", "interval": 900, "temperature_2m": 25.0 - base,
                        "weather_code": 2, "wind_speed_10m": 8.0},
            "daily_units": units, "daily": daily,
        })  # fmt: skip
