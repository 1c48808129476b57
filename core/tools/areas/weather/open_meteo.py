"""Open-Meteo, the one weather adapter: geocoding a place name and a daily forecast (no key).

Plain HTTPS JSON (https://open-meteo.com/en/docs): ``/v1/search`` on the geocoding host and
``/v1/forecast`` on the API host. An error answer is ``{"error": true, "reason": "..."}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from core.errors import PepperError
from core.tools.connectors import Connectors

DAILY = "weather_code,temperature_2m_max,temperature_2m_min,precipitation_probability_max,wind_speed_10m_max"
CURRENT = "temperature_2m,weather_code,wind_speed_10m"

# WMO weather interpretation codes (Open-Meteo's ``weather_code``), in words.
CODES = {
    0: "clear", 1: "mostly clear", 2: "partly cloudy", 3: "overcast", 45: "fog", 48: "freezing fog",
    51: "light drizzle", 53: "drizzle", 55: "heavy drizzle", 56: "freezing drizzle", 57: "freezing drizzle",
    61: "light rain", 63: "rain", 65: "heavy rain", 66: "freezing rain", 67: "freezing rain",
    71: "light snow", 73: "snow", 75: "heavy snow", 77: "snow grains", 80: "showers", 81: "showers",
    82: "violent showers", 85: "snow showers", 86: "snow showers", 95: "thunderstorm", 96: "thunderstorm with hail",
    99: "thunderstorm with hail",
}  # fmt: skip


class WeatherUnavailable(PepperError):
    code = "weather-unavailable"


@dataclass(frozen=True)
class Place:
    name: str
    latitude: float
    longitude: float


@dataclass(frozen=True)
class Day:
    date: str
    summary: str
    high: float
    low: float
    rain_chance: int | None
    wind: float | None


async def _get(connectors: Connectors, url: str, params: dict[str, Any]) -> dict[str, Any]:
    try:
        async with connectors.http() as client:
            response = await client.get(url, params=params)
    except httpx.HTTPError as exc:
        raise WeatherUnavailable(f"Open-Meteo did not answer ({type(exc).__name__})") from exc
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise WeatherUnavailable(f"Open-Meteo sent an answer that is not JSON (HTTP {response.status_code})")
    if response.status_code != 200 or data.get("error"):
        raise WeatherUnavailable(f"Open-Meteo refused: {str(data.get('reason', response.status_code))[:120]}")
    return data


async def geocode(connectors: Connectors, name: str) -> Place | None:
    data = await _get(
        connectors, f"{connectors.open_meteo_geocoding_url}/v1/search",
        {"name": name, "count": 1, "language": "en", "format": "json"},
    )  # fmt: skip
    results = data.get("results") or []
    if not results:
        return None
    try:
        top = results[0]
        label = ", ".join(str(p) for p in (top["name"], top.get("admin1"), top.get("country")) if p)
        return Place(label, float(top["latitude"]), float(top["longitude"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise WeatherUnavailable("Open-Meteo's geocoding answer has no coordinates") from exc


async def forecast(connectors: Connectors, place: Place, *, days: int, timezone: str) -> tuple[str | None, list[Day]]:
    """The current conditions in words (None when not given) and ``days`` daily forecasts."""
    data = await _get(
        connectors, f"{connectors.open_meteo_url}/v1/forecast",
        {"latitude": place.latitude, "longitude": place.longitude, "daily": DAILY, "current": CURRENT,
         "timezone": timezone, "forecast_days": days},
    )  # fmt: skip
    try:
        daily = data["daily"]
        out = [
            Day(
                daily["time"][i],
                CODES.get(int(daily["weather_code"][i]), "unsettled"),
                float(daily["temperature_2m_max"][i]),
                float(daily["temperature_2m_min"][i]),
                _opt(daily.get("precipitation_probability_max"), i),
                _opt(daily.get("wind_speed_10m_max"), i),
            )
            for i in range(min(days, len(daily["time"])))
        ]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise WeatherUnavailable("Open-Meteo's forecast is missing its daily values") from exc
    now = data.get("current")
    current = None
    if isinstance(now, dict) and isinstance(now.get("temperature_2m"), int | float):
        current = f"now {now['temperature_2m']:.0f}°C, {CODES.get(int(now.get('weather_code', -1)), 'unsettled')}"
    return current, out


def _opt(values: Any, i: int) -> Any:
    if not isinstance(values, list) or i >= len(values) or values[i] is None:
        return None
    return round(values[i]) if isinstance(values[i], int | float) else None
