"""Phone calls as recorded (``calls``): which line took them, who holds them, how they ended."""

from __future__ import annotations

from core.store.queries import Queries


async def line_of(db: Queries, call_sid: str) -> str | None:
    """The number of the line the call came in on; None for an unknown call (or one with no line)."""
    return await db.fetchval("SELECT line_number FROM calls WHERE call_sid = $1", call_sid)
