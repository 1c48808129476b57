"""Feature area: places and travel time.

``geocode`` says where a place is: coordinates written in it (``48.85, 2.35``), a place the
person saved (``pepper places add``), or the routing service's geocoder (OpenRouteService), whose
answers are kept. ``travel_time`` gives the time between two places from the routing service
(OSRM or OpenRouteService, ``routing.Routing``) or, without one, an estimate from straight-line
distance at ``PEPPER_TRAVEL_SPEED_KMH`` that says it is an estimate.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.store.queries import Queries
from core.tools.areas.places.routing import Point, Routing, RoutingError, Travel, coordinates_in, estimate
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "places"
MAX_NAME = 300


def place_name(text: str) -> str:
    """How a place is matched: lower-cased, spaces folded."""
    return " ".join(text.lower().split())


async def save_place(db: Queries, account_id: UUID, label: str, lat: float, lon: float, source: str = "saved") -> None:
    name = place_name(label)
    if not name or len(name) > MAX_NAME:
        raise InvalidInput(f"a place needs a name of 1 to {MAX_NAME} characters")
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise InvalidInput("latitude is -90..90 and longitude -180..180")
    await db.execute(
        """
        INSERT INTO places (account_id, name, label, lat, lon, source) VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (account_id, name) DO UPDATE SET label = EXCLUDED.label, lat = EXCLUDED.lat, lon = EXCLUDED.lon,
            source = EXCLUDED.source
        """,
        account_id, name, label.strip(), lat, lon, source,
    )  # fmt: skip


async def list_places(db: Queries, account_id: UUID) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT label, lat, lon, source FROM places WHERE account_id = $1 ORDER BY source DESC, name", account_id
        )
    )


async def locate(db: Queries, connectors: Connectors, account_id: UUID, text: str) -> Point | None:
    """Where ``text`` is, or None when Pepper cannot tell. Raises ``RoutingError`` when the
    geocoding service fails."""
    if not text.strip():
        return None
    found = coordinates_in(text)
    if found is not None:
        return found
    name = place_name(text)[:MAX_NAME]
    row = await db.fetchrow("SELECT label, lat, lon FROM places WHERE account_id = $1 AND name = $2", account_id, name)
    if row is not None:
        return Point(row["lat"], row["lon"], row["label"])
    point = await Routing(connectors).geocode(text)
    if point is not None:
        await save_place(db, account_id, text, point.lat, point.lon, source="geocoded")
    return point


async def travel_between(
    db: Queries, connectors: Connectors, account_id: UUID, origin: str, destination: str
) -> tuple[Travel | None, str]:
    """The travel time from one place to another, or None and why not."""
    try:
        a = await locate(db, connectors, account_id, origin)
        b = await locate(db, connectors, account_id, destination)
    except RoutingError as exc:
        return None, str(exc)
    missing = [t for t, p in ((origin, a), (destination, b)) if p is None]
    if missing or a is None or b is None:
        return None, "cannot place " + " or ".join(repr(m) for m in missing) + (
            " (save it with `pepper places add`, or write its coordinates)"
        )
    return await Routing(connectors).travel(a, b), ""


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _geocode(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            point = await locate(ctx.db, connectors, ctx.session.account_id, args["place"])
        except RoutingError as exc:
            return ToolOutcome.failed(f"the geocoding service failed: {exc}")
        if point is None:
            return ToolOutcome.empty(f"cannot place {args['place']!r}: not a saved place and no geocoder knows it")
        return ToolOutcome.ok(f"{point.label or args['place']}: {point.lat:.5f}, {point.lon:.5f}")

    async def _travel(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        account_id = ctx.session.account_id
        travel, why = await travel_between(ctx.db, connectors, account_id, args["origin"], args["destination"])
        if travel is None:
            return ToolOutcome.failed(why)
        return ToolOutcome.ok(f"From {args['origin']} to {args['destination']}: {travel.describe()}.")

    place = {"type": "string", "minLength": 1, "maxLength": MAX_NAME}
    return (
        Tool(
            name="geocode",
            description="Where a place or address is (latitude, longitude): saved places, coordinates, or a geocoder.",
            parameters={
                "type": "object",
                "properties": {"place": place},
                "required": ["place"],
                "additionalProperties": False,
            },
            handler=_geocode,
            area=AREA,
        ),
        Tool(
            name="travel_time",
            description=(
                "How long it takes to get from one place to another. Without a routing service the answer is an "
                "estimate from straight-line distance, and says so: pass that on."
            ),
            parameters={
                "type": "object",
                "properties": {"origin": place, "destination": place},
                "required": ["origin", "destination"],
                "additionalProperties": False,
            },
            handler=_travel,
            area=AREA,
        ),
    )


TOOLS = make_tools(Connectors())

__all__ = [
    "TOOLS",
    "Point",
    "Routing",
    "RoutingError",
    "Travel",
    "estimate",
    "list_places",
    "locate",
    "make_tools",
    "save_place",
    "travel_between",
]
