"""Replay cases: the failing test a quality issue proposes, as a file ``pepper replay --case`` runs.

A case names a recorded turn and the point the judge failed it on. Running it replays the turn on
the current build (``text_loop.replay``: recorded tool results, no write runs) and checks the new
reply. Points a detector can check are checked without a model (:func:`check_reply`); the others
ask the judge to grade the replay on that point (``check: judge``). The case fails until a fix
makes the replayed turn pass, which is what a proposed failing test is for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.quality.detectors import DETECTORS, TurnView
from core.quality.points import POINTS
from core.store.queries import Queries

CASE_VERSION = 1
# The detector whose check a point's case runs on the replayed reply; other points ask the judge.
CHECKS = {d.point: d.name for d in DETECTORS.values() if d.name != "required-step"}


def build_case(
    turn_id: UUID, point: str, reason: str, *, tier: str | None, writes_committed: bool, reply: str
) -> dict[str, Any]:
    return {
        "pepper_replay_case": CASE_VERSION,
        "turn_id": str(turn_id),
        "point": point,
        "reason": reason,
        "tier": tier,
        "check": CHECKS.get(point, "judge"),
        # What the original's writes came to: a replay runs none, so the check must be told.
        "writes_committed": writes_committed,
        "failed_reply": reply,
    }


def load_case(path: str | Path) -> dict[str, Any]:
    """A case file, checked; :class:`InvalidInput` for anything else."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read replay case {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("pepper_replay_case") != CASE_VERSION:
        raise InvalidInput(f"{path} is not a Pepper replay case (version {CASE_VERSION})")
    try:
        UUID(str(data.get("turn_id")))
    except ValueError:
        raise InvalidInput(f"{path}: turn_id is not a turn id") from None
    if data.get("point") not in POINTS or data.get("check") not in (*CHECKS.values(), "judge"):
        raise InvalidInput(f"{path}: unknown point or check")
    return data


def check_reply(case: dict[str, Any], reply: str, calls: list[dict[str, Any]]) -> str | None:
    """Why the replayed reply still fails the case's detector check, or None when it passes."""
    detector = DETECTORS[case["check"]]
    detail = detector.fires(TurnView(reply, calls, (), bool(case.get("writes_committed"))))
    return None if detail is None else f"{detector.name}: {json.dumps(detail, sort_keys=True)}"


def case_json(case: dict[str, Any]) -> str:
    return json.dumps(case, indent=2, sort_keys=True) + "\n"


async def issue_case(db: Queries, issue_id: int) -> dict[str, Any] | None:
    """A quality issue's replay case; None for an unknown issue."""
    case = await db.fetchval("SELECT replay_case FROM quality_issues WHERE id = $1", issue_id)
    return None if case is None else json.loads(case)


async def list_issues(db: Queries, *, include_closed: bool = False) -> list[Any]:
    """Quality issues, newest first, with the account's name."""
    return await db.fetch(
        """
        SELECT i.id, i.turn_id, i.point, i.reason, i.proposed_fix, i.status, i.seen, i.created_at, a.name
        FROM quality_issues i JOIN accounts a ON a.id = i.account_id
        WHERE $1 OR i.status = 'open' ORDER BY i.created_at DESC, i.id DESC
        """,
        include_closed,
    )
