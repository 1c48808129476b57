"""Feature area: the calendar's suggestions, for the morning brief.

``calendar_suggestions`` runs the calendar's detectors now (``core.suggestions``) and lists the
cards the person can act on. A detector still in shadow records what it found and shows nothing,
so the tool lists only promoted detectors' cards. The cards are accepted or dismissed by the
person (``pepper suggestions``, the web app's approvals page), never by the model: the tool only
reads.
"""

from __future__ import annotations

from typing import Any

from core.suggestions import cards, run_detectors
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import suggestions_block

AREA = "suggestions"


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        report = await run_detectors(ctx.db, connectors, ctx.session.account_id, ctx.now)
        shown = await cards(ctx.db, ctx.session.account_id, limit=20)
        missing = f" Could not read {', '.join(report.unavailable)}." if report.unavailable else ""
        if not shown and report.unavailable:  # not "nothing": part of it was never looked at
            return ToolOutcome.ok(
                f"No calendar suggestions from what could be read; that is not a complete answer.{missing}"
            )
        if not shown:
            return ToolOutcome.empty("no calendar suggestions")
        head = "Suggestions waiting for the person (they accept or dismiss them in the app; you cannot):"
        block = suggestions_block([(f"#{c.id} {c.detector}", f"{c.title}. {c.detail}") for c in shown])
        return ToolOutcome.ok(f"{head}\n{block}{missing}")

    return (
        Tool(
            name="calendar_suggestions",
            description=(
                "Check the coming days for clashes, travel time, events in mail, deadlines and todos needing "
                "a slot; lists the suggestions the person can accept or dismiss."
            ),
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
            handler=_list,
            area=AREA,
        ),
    )


TOOLS = make_tools(Connectors())
