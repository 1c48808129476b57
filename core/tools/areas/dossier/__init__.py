"""Feature area: the dossier, a short document about the person in every prompt.

The owner writes one half; the model adds notes to the other. A note is staged: it is what the
model learned in a turn whose reply the person may never see. Notes only accumulate; the weekly
rewrite, revisions and the prompt text live in ``core.memory.dossier``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.memory.dossier import MAX_NOTES_IN_PROMPT, dossier_text
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

__all__ = ["MAX_NOTES_IN_PROMPT", "TOOLS", "dossier_text"]


async def _plan_note(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    body = " ".join(args["note"].split())
    if not body:
        return ToolOutcome.failed("the note is empty")
    return ToolOutcome.planned({"note": body}, "dossier note added")


async def _apply_note(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO dossier_notes (account_id, body) VALUES ($1, $2)", account_id, payload["note"])


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="add_dossier_note",
        description="Remember a lasting fact or preference about the person (one short sentence).",
        parameters={
            "type": "object",
            "properties": {"note": {"type": "string", "minLength": 1, "maxLength": 300}},
            "required": ["note"],
            "additionalProperties": False,
        },
        handler=_plan_note,
        apply=_apply_note,
        area="dossier",
        writes=True,
        staged=True,
    ),
)
