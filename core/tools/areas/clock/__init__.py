"""Feature area: the clock."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.tools.registry import Tool, ToolContext, ToolOutcome


async def _current_time(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    zone_name = args.get("timezone") or ctx.session.timezone
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        return ToolOutcome.failed(f"unknown time zone {zone_name!r}")
    local = ctx.now.astimezone(zone)
    return ToolOutcome.ok(f"{local:%A %d %B %Y, %H:%M} ({zone_name}, UTC{local:%z})")


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="current_time",
        description="The current date and time, in the person's time zone unless another IANA zone is given.",
        parameters={
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA zone, e.g. Europe/Paris"}},
            "additionalProperties": False,
        },
        handler=_current_time,
        area="clock",
    ),
)
