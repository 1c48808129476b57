"""Writing what the models did into a turn record: the model that ran, the tier, the usage.

A turn may make several calls (tool rounds, a repair pass); the record keeps the totals and one
entry per call, so quality reports can compare models and see failovers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from core.conversation import update_turn
from core.models.types import Generation
from core.store.queries import Queries


def usage_record(generations: Sequence[Generation]) -> dict[str, Any]:
    """Totals over the calls, and each call's model, provider, usage and failover."""
    calls: list[dict[str, Any]] = [
        {
            "model": g.model,
            "provider": g.provider,
            "finish_reason": g.finish_reason,
            "input_tokens": g.usage.input_tokens,
            "output_tokens": g.usage.output_tokens,
            "cached_input_tokens": g.usage.cached_input_tokens,
            "reasoning_tokens": g.usage.reasoning_tokens,
            **({"failed_over_from": g.failed_over_from} if g.failed_over_from else {}),
            **({"effort": g.extras["effort"]} if "effort" in g.extras else {}),
            **({"failed_attempt": g.extras["failed_attempt"]} if "failed_attempt" in g.extras else {}),
        }
        for g in generations
    ]
    keys = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
    totals = {key: sum(c[key] for c in calls) for key in keys}
    for c in calls:  # a failed attempt is charged what its provider reported for it, if anything
        for key, value in zip(keys, attempt_usage(c.get("failed_attempt")), strict=True):
            totals[key] += value
    return {**totals, "calls": calls}


def attempt_usage(attempt: Any) -> tuple[int, int, int, int]:
    """``(input, output, cached, reasoning)`` tokens a failed attempt's provider reported (see
    ``core.models.router.failed_attempt``); zeros when it reported none or the entry is malformed."""
    usage = attempt.get("usage") if isinstance(attempt, dict) else None
    if not isinstance(usage, list) or len(usage) != 4 or not all(isinstance(v, int) and v >= 0 for v in usage):
        return 0, 0, 0, 0
    return usage[0], usage[1], usage[2], usage[3]


async def record_model_use(
    db: Queries, turn_id: UUID, generations: Sequence[Generation], *, tier: str | None = None
) -> None:
    """Store the model that ran (the last call's), the tier and the usage in the turn record."""
    if not generations:
        return
    parts: dict[str, Any] = {"model": generations[-1].model, "usage": usage_record(generations)}
    if tier is not None:
        parts["tier"] = tier
    await update_turn(db, turn_id, **parts)
