"""Whether a replayed turn still fails its replay case (``pepper replay --case``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.models.types import ModelService
from core.quality.cases import check_reply
from core.quality.judge import MalformedGrades, grade_turn, load_turn
from core.store.queries import Queries


async def check_replayed(db: Queries, models: ModelService, case: dict[str, Any], replay_turn_id: UUID) -> str | None:
    """Why the replay (already run and recorded) still fails the case, or None when it passes. A
    detector's check needs no model; ``judge`` grades the replay on the case's point."""
    turn = await load_turn(db, replay_turn_id)
    if turn is None:
        return "the replay left no record"
    if case["check"] != "judge":
        return check_reply(case, turn.reply, turn.calls)
    try:
        verdict = await grade_turn(db, models, turn, tier=case.get("tier") or "small")
    except MalformedGrades as exc:
        return f"the judge's answer was refused ({exc})"
    grade = verdict.grades[case["point"]]
    return None if grade.grade != "fail" else f"the judge still fails it: {grade.reason}"
