"""Phone calls as recorded (``calls``): which line took them, who holds them, how they ended."""

from __future__ import annotations

from typing import Any

from core.store.queries import Queries


async def line_of(db: Queries, call_sid: str) -> str | None:
    """The number of the line the call came in on; None for an unknown call (or one with no line)."""
    return await db.fetchval("SELECT line_number FROM calls WHERE call_sid = $1", call_sid)


async def record_final_status(db: Queries, call_sid: str, status: str, *, channel: str) -> None:
    """Record that the call ended with ``status`` (a call still ringing or in progress takes it) and
    announce its ``CallSid`` on ``channel`` to the process holding it, in one statement."""
    await db.execute(
        """
        WITH ended AS (
            UPDATE calls SET ended_at = coalesce(ended_at, now()),
                             status = CASE WHEN status IN ('ringing', 'in-progress') THEN $2 ELSE status END
            WHERE call_sid = $1 RETURNING held_by
        )
        SELECT pg_notify($3, $1) FROM ended WHERE held_by IS NOT NULL
        """,
        call_sid,
        status,
        channel,
    )


async def hold_calls(db: Queries, holder: int, call_sids: list[str]) -> None:
    """Record the calls (those not fully recorded yet) as held by the session ``holder``."""
    await db.execute(
        "UPDATE calls SET held_by = $1 WHERE call_sid = ANY($2::text[]) AND summary IS NULL"
        " AND held_by IS DISTINCT FROM $1",
        holder,
        call_sids,
    )


async def ended_among(db: Queries, call_sids: list[str]) -> list[str]:
    """Those of the calls whose end is recorded."""
    rows = await db.fetch(
        "SELECT call_sid FROM calls WHERE call_sid = ANY($1::text[]) AND ended_at IS NOT NULL", call_sids
    )
    return [r["call_sid"] for r in rows]


async def orphaned(db: Queries) -> list[tuple[str, int]]:
    """``(call_sid, held_by)`` of calls not fully recorded whose holding session is gone."""
    rows = await db.fetch(
        """
        SELECT call_sid, held_by FROM calls WHERE held_by IS NOT NULL AND summary IS NULL
          AND held_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        """
    )
    return [(r["call_sid"], r["held_by"]) for r in rows]


async def end_orphans(db: Queries, orphans: list[tuple[str, int]], *, reason: str, holder: int | None) -> list[Any]:
    """Record the end of those ``orphans`` (``(call_sid, held_by)``) still orphaned, and claim them
    for ``holder``: one statement, so of several processes sweeping at once one ends each. Returns
    the rows ended (``call_sid``, ``turn_id``)."""
    return await db.fetch(
        """
        UPDATE calls SET status = 'completed', ended_at = coalesce(ended_at, now()),
                         end_reason = coalesce(end_reason, $1), held_by = $4
        WHERE (call_sid, held_by) IN (SELECT * FROM unnest($2::text[], $3::int[])) AND summary IS NULL
          AND held_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING call_sid, turn_id
        """,
        reason,
        [sid for sid, _ in orphans],
        [pid for _, pid in orphans],
        holder,
    )


async def summarize_if_missing(db: Queries, call_sid: str, summary: str) -> None:
    """Set the call's summary unless it has one (a call with a summary is fully recorded)."""
    await db.execute("UPDATE calls SET summary = coalesce(summary, $2) WHERE call_sid = $1", call_sid, summary)
