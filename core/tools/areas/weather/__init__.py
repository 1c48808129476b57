"""Feature area: weather forecasts for the person's place or a named one (Open-Meteo, no key).

The person's place is stored once (``set_weather_place``, geocoded then); until it is, the city
their profile's time zone is named after stands in (and the forecast says so). A forecast for
another place geocodes its name each time. Everything is read-only except saving the place.
"""

from __future__ import annotations

from datetime import date
from typing import Any
from uuid import UUID

from core.store.queries import Queries
from core.tools.areas.weather.open_meteo import Place, WeatherUnavailable, forecast, geocode
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "weather"


async def saved_place(db: Queries, account_id: UUID) -> Place | None:
    row = await db.fetchrow("SELECT name, latitude, longitude FROM weather_places WHERE account_id = $1", account_id)
    return Place(row["name"], row["latitude"], row["longitude"]) if row else None


def zone_city(timezone: str) -> str | None:
    """The city an IANA zone is named after (``Europe/Paris``: Paris); None for UTC and the like."""
    if "/" not in timezone or timezone.startswith(("Etc/", "US/")):
        return None
    return timezone.rsplit("/", 1)[1].replace("_", " ")


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _forecast(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        days, note = int(args.get("days", 3)), ""
        try:
            if args.get("place"):
                place = await geocode(connectors, args["place"])
                if place is None:
                    return ToolOutcome.failed(f"no place called {args['place']!r} was found")
            else:
                place = await saved_place(ctx.db, ctx.session.account_id)
                city = zone_city(ctx.session.timezone)
                if place is None and city is not None:  # the profile's time zone names a city
                    place = await geocode(connectors, city)
                    note = " (from the person's time zone; set_weather_place saves their own place)"
                if place is None:
                    return ToolOutcome.failed("the person has no weather place saved; ask where, or name a place")
            current, found = await forecast(connectors, place, days=days, timezone=ctx.session.timezone)
        except WeatherUnavailable as exc:
            return ToolOutcome.failed(exc.message)
        if not found:
            return ToolOutcome.empty(f"Open-Meteo has no forecast for {place.name}")
        lines = [f"{place.name}{note}" + (f" ({current})" if current else "") + ":"]
        for day in found:
            when = date.fromisoformat(day.date).strftime("%a %d %b")
            extra = "".join(
                [f", rain {day.rain_chance}%" if day.rain_chance is not None else "",
                 f", wind to {day.wind} km/h" if day.wind is not None else ""]
            )  # fmt: skip
            lines.append(f"- {when}: {day.summary}, {day.low:.0f} to {day.high:.0f}°C{extra}")
        return ToolOutcome.ok("\n".join(lines))

    async def _plan_place(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            place = await geocode(connectors, args["place"])
        except WeatherUnavailable as exc:
            return ToolOutcome.failed(exc.message)
        if place is None:
            return ToolOutcome.failed(f"no place called {args['place']!r} was found")
        payload = {"name": place.name, "latitude": place.latitude, "longitude": place.longitude}
        return ToolOutcome.planned(payload, f"weather place set to {place.name}")

    return (
        Tool(
            "weather_forecast",
            "Forecast for the person's saved place, or a named place.",
            {"type": "object", "properties": {
                "place": {"type": "string", "maxLength": 120},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "additionalProperties": False},
            _forecast, AREA,
        ),
        Tool(
            "set_weather_place",
            "Save the person's place for forecasts.",
            {"type": "object", "properties": {"place": {"type": "string", "minLength": 1, "maxLength": 120}},
             "required": ["place"], "additionalProperties": False},
            _plan_place, AREA, writes=True, apply=_apply_place,
        ),
    )  # fmt: skip


async def _apply_place(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute(
        """
        INSERT INTO weather_places (account_id, name, latitude, longitude) VALUES ($1, $2, $3, $4)
        ON CONFLICT (account_id) DO UPDATE SET name = $2, latitude = $3, longitude = $4, updated_at = now()
        """,
        account_id, payload["name"], payload["latitude"], payload["longitude"],
    )  # fmt: skip
