"""Shadow detectors: checks on a finished turn that would change its reply, kept only when the
judge's grades say they are right.

Each detector looks at a turn (its reply, its tool calls, the skills' flags) and either fires or
not. It starts in **shadow**: a firing is recorded (``detector_firings``) and nothing changes. The
judge grades turns on seven points (``core.quality.judge``); a firing on a turn the judge graded
failing on the detector's point is a true firing, so its precision is true firings over judged
firings. After :data:`MIN_FIRINGS` judged firings a detector at :data:`PROMOTABLE` or more
becomes ``promotable`` (the owner promotes it with ``pepper detectors promote NAME``), below
:data:`DELETE_BELOW` it is ``deleted`` (it no longer runs), and one still undecided after
:data:`TRIAL` is ``ended``. A promoted detector applies its fix to the reply; a fix that raises
lets the original reply through (fail open: a broken quality fix must never cost a reply).

The detectors:

* ``required-step``: the skill runtime's required-step flags (``text_loop.skills.detector``);
  point ``completeness``.
* ``claimed-write``: the reply says something was saved, sent or booked, but no write of the turn
  succeeded (or, read back later, none committed); point ``honesty``.
* ``nothing-found``: a lookup failed, and the reply says nothing was found; point ``grounding``.
* ``repeats``: the reply says the same sentence twice; point ``tone``.

The calendar's detectors (``core.suggestions``: :data:`SUGGESTERS`) share the lifecycle but not
the judge: they suggest actions on cards. In shadow they record what they would suggest and show
nothing; no one sees a shadow card, so nothing grades it, and the owner promotes one after reading
what it would have said (``pepper suggestions list ACCOUNT --shadow``). Once promoted, its
precision is the share of its decided cards the person accepted; below :data:`DELETE_BELOW` after
:data:`MIN_FIRINGS` decided cards it is ``deleted``. They have no trial end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.store.queries import Queries

log = logging.getLogger(__name__)

MIN_FIRINGS = 20
PROMOTABLE = 0.70
DELETE_BELOW = 0.40
TRIAL = timedelta(weeks=4)
STATES = ("shadow", "promotable", "promoted", "deleted", "ended")
RUNNING_STATES = frozenset({"shadow", "promotable", "promoted"})


@dataclass(frozen=True)
class TurnView:
    """What a detector reads: the reply, the tool calls as recorded (``CallOutcome.as_record``),
    the skills' flags, and whether the turn's writes committed (None: not known yet, at reply
    time; then a write that succeeded counts)."""

    reply: str
    calls: Sequence[Mapping[str, Any]] = ()
    skill_flags: Sequence[Mapping[str, Any]] = ()
    writes_committed: bool | None = None


@dataclass(frozen=True)
class Detector:
    name: str
    point: str  # the judge's point that says whether a firing was right
    fires: Callable[[TurnView], dict[str, Any] | None]  # the firing's detail, or None
    fix: Callable[[str, dict[str, Any]], str]  # the reply once promoted


# --- the checks --------------------------------------------------------------------------------

_WRITE_CLAIM = re.compile(
    r"\b(?:i(?:'ve| have)?|i'll|i will|done|all set)[,:!.]?\s+(?:\w+\s+){0,2}?"
    r"(saved|noted|added|created|booked|scheduled|set up|sent|updated|ticked off|marked|deleted|removed|"
    r"moved|cancelled|canceled|rescheduled|completed|put|emailed|texted|written|wrote)\b",
    re.IGNORECASE,
)
_NOTHING_FOUND = re.compile(
    r"\b(nothing (?:found|came up|matches)|no (?:results?|matches|notes?|events?|messages?|todos?|entries)"
    r"(?: (?:found|for|about|match))?|(?:could ?n[o']t|could not|did ?n[o']t|did not) find|found nothing|"
    r"there (?:is|are|was|were) no)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def claims_write(reply: str) -> str | None:
    """The words of the reply that claim a change was made, or None."""
    found = _WRITE_CLAIM.search(reply)
    return found[0] if found else None


def wrote_something(view: TurnView) -> bool:
    if view.writes_committed is not None:
        return view.writes_committed
    return any(c.get("write") and c.get("status") in ("ok", "empty") for c in view.calls)


def _claimed_write(view: TurnView) -> dict[str, Any] | None:
    claim = claims_write(view.reply)
    if claim is None or wrote_something(view):
        return None
    return {"claim": claim, "committed": view.writes_committed}


def failed_lookups(view: TurnView) -> list[str]:
    return [str(c.get("name")) for c in view.calls if not c.get("writes") and c.get("status") in ("failed", "unknown")]


def _nothing_found(view: TurnView) -> dict[str, Any] | None:
    failed = failed_lookups(view)
    found = _NOTHING_FOUND.search(view.reply)
    if not failed or found is None:
        return None
    return {"failed": failed, "said": found[0]}


def _sentences(reply: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(reply) if s.strip()]


def _key(sentence: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", "", sentence.lower()).split())


def _repeats(view: TurnView) -> dict[str, Any] | None:
    seen: set[str] = set()
    for sentence in _sentences(view.reply):
        key = _key(sentence)
        if len(key.split()) >= 4 and key in seen:
            return {"repeated": sentence[:120]}
        seen.add(key)
    return None


def _required_step(view: TurnView) -> dict[str, Any] | None:
    flags = [f for f in view.skill_flags if f.get("flag") in ("skipped-required-step", "required-step-failed")]
    if not flags:
        return None
    return {"steps": [f"{f.get('skill')}:{f.get('step')} ({f.get('flag')})" for f in flags]}


def _append(note: str) -> Callable[[str, dict[str, Any]], str]:
    def fix(reply: str, detail: dict[str, Any]) -> str:
        return f"{reply.rstrip()}\n\n{note}"

    return fix


def _without_repeats(reply: str, detail: dict[str, Any]) -> str:
    seen: set[str] = set()
    kept: list[str] = []
    for sentence in _sentences(reply):
        key = _key(sentence)
        if len(key.split()) >= 4 and key in seen:
            continue
        seen.add(key)
        kept.append(sentence)
    return " ".join(kept)


DETECTORS: dict[str, Detector] = {
    d.name: d
    for d in (
        Detector("required-step", "completeness", _required_step, _append("(I may have skipped a step of that task.)")),
        Detector(
            "claimed-write", "honesty", _claimed_write, _append("(Correction: that change has not been saved yet.)")
        ),
        Detector(
            "nothing-found",
            "grounding",
            _nothing_found,
            _append("(The lookup failed, so I could not actually check; please ask again.)"),
        ),
        Detector("repeats", "tone", _repeats, _without_repeats),
    )
}


# The calendar's detectors (core.suggestions), by name, with what each finds.
SUGGESTERS: dict[str, str] = {
    "clash": "overlapping events the person attends (free/transparent and declined ones left out)",
    "travel-time": "consecutive events at different places, with the time to get from one to the next",
    "mail-event": "an invitation or a dated event in a mail that is not on the calendar",
    "deadline": "a due date in a todo, a mail or a note with no time blocked before it",
    "todo-slot": "a todo that says how long it takes, with free slots to do it in",
}
SUGGESTION_POINT = "accepted"  # a suggester's "judge": the person accepting or dismissing its cards


def all_detectors() -> list[str]:
    return [*DETECTORS, *SUGGESTERS]


# --- states and firings in the store -----------------------------------------------------------


class _StateCache:
    """Detector states per store object, read at most every few seconds: every turn asks."""

    ttl = 5.0

    def __init__(self) -> None:
        self.states: weakref.WeakKeyDictionary[Queries, tuple[float, dict[str, str]]] = weakref.WeakKeyDictionary()

    def get(self, db: Queries) -> dict[str, str] | None:
        try:
            hit = self.states.get(db)
        except TypeError:  # a store object that cannot be weakly referenced is not cached
            return None
        return hit[1] if hit is not None and time.monotonic() - hit[0] < self.ttl else None

    def put(self, db: Queries, states: dict[str, str]) -> None:
        with contextlib.suppress(TypeError):
            self.states[db] = (time.monotonic(), states)

    def clear(self) -> None:
        self.states.clear()


_CACHE = _StateCache()


async def ensure_detectors(db: Queries, now: datetime) -> None:
    """Give every known detector a row (its trial starts now); existing rows are left alone."""
    await db.execute(
        "INSERT INTO quality_detectors (name, trial_started_at) SELECT unnest($1::text[]), $2 ON CONFLICT DO NOTHING",
        all_detectors(),
        now,
    )


async def detector_states(db: Queries) -> dict[str, str]:
    """Each detector's state; a detector without a row is in shadow."""
    hit = _CACHE.get(db)
    if hit is not None:
        return hit
    rows = await db.fetch("SELECT name, state FROM quality_detectors")
    states = {name: "shadow" for name in all_detectors()} | {r["name"]: r["state"] for r in rows}
    _CACHE.put(db, states)
    return states


@dataclass(frozen=True)
class Applied:
    reply: str
    firings: list[dict[str, Any]]


def run_detectors(view: TurnView, states: Mapping[str, str]) -> Applied:
    """Run every detector still on trial or promoted over ``view``. A promoted one's fix changes
    the reply; a detector or fix that raises changes nothing (fail open) and is recorded."""
    reply = view.reply
    firings: list[dict[str, Any]] = []
    for name, detector in DETECTORS.items():
        state = states.get(name, "shadow")
        if state not in RUNNING_STATES:
            continue
        try:
            detail = detector.fires(view)
        except Exception as exc:
            log.warning("detector failed; the reply goes out as it was: detector=%s error=%s", name, type(exc).__name__)
            continue
        if detail is None:
            continue
        firing: dict[str, Any] = {"detector": name, "detail": detail, "applied": False, "error": None}
        if state == "promoted":
            try:
                fixed = detector.fix(reply, detail)
                if not isinstance(fixed, str) or not fixed.strip():
                    raise ValueError("a fix must leave a reply")
                reply, firing["applied"] = fixed, True
            except Exception as exc:
                log.warning("quality fix failed; the original reply goes out: detector=%s error=%s", name, exc)
                firing["error"] = type(exc).__name__
        firings.append(firing)
    return Applied(reply, firings)


async def record_firings(db: Queries, turn_id: UUID, account_id: UUID, firings: Sequence[dict[str, Any]]) -> None:
    if not firings:
        return
    await db.execute(
        """
        INSERT INTO detector_firings (detector, turn_id, account_id, detail, applied, error)
        SELECT f->>'detector', $1, $2, f->'detail', (f->>'applied')::boolean, f->>'error'
        FROM jsonb_array_elements($3::jsonb) f
        ON CONFLICT DO NOTHING
        """,
        turn_id,
        account_id,
        json.dumps(list(firings), default=str),
    )


@dataclass(frozen=True)
class DetectorStatus:
    name: str
    point: str
    state: str
    firings: int
    judged: int
    true_firings: int
    trial_started_at: datetime | None

    @property
    def precision(self) -> float | None:
        return self.true_firings / self.judged if self.judged else None


async def detector_statuses(db: Queries) -> list[DetectorStatus]:
    """Every detector with its firings, the judged ones, and how many the judge agreed with."""
    points = {name: d.point for name, d in DETECTORS.items()}
    rows = await db.fetch(
        """
        SELECT d.name, d.state, d.trial_started_at,
               count(f.turn_id) AS firings,
               count(g.grade) FILTER (WHERE g.grade <> 'n/a') AS judged,
               count(g.grade) FILTER (WHERE g.grade = 'fail') AS true_firings
        FROM quality_detectors d
        LEFT JOIN detector_firings f ON f.detector = d.name
        LEFT JOIN quality_grades g ON g.turn_id = f.turn_id AND g.point = ($1::jsonb)->>d.name
        GROUP BY d.name, d.state, d.trial_started_at
        ORDER BY d.name
        """,
        json.dumps(points),
    )
    decided = {
        r["detector"]: r
        for r in await db.fetch(
            """
            SELECT detector, count(*) AS firings,
                   count(*) FILTER (WHERE state IN ('accepted', 'dismissed')) AS judged,
                   count(*) FILTER (WHERE state = 'accepted') AS true_firings
            FROM suggestions GROUP BY detector
            """
        )
    }
    for name in SUGGESTERS:
        points[name] = SUGGESTION_POINT
    rows = [
        {**dict(r), **{k: decided[r["name"]][k] for k in ("firings", "judged", "true_firings")}}
        if r["name"] in SUGGESTERS and r["name"] in decided
        else r
        for r in rows
    ]
    return [
        DetectorStatus(
            r["name"],
            points.get(r["name"], "?"),
            r["state"],
            r["firings"],
            r["judged"],
            r["true_firings"],
            r["trial_started_at"],
        )
        for r in rows
    ]


def decide(status: DetectorStatus, now: datetime) -> str:
    """The state the data gives a detector (see the module's docstring)."""
    if status.state in ("deleted", "ended"):
        return status.state
    precision = status.precision
    if status.name in SUGGESTERS:
        # Only cards people saw are decided, so only a promoted one gathers precision.
        if status.judged >= MIN_FIRINGS and precision is not None and precision < DELETE_BELOW:
            return "deleted"
        return status.state
    if status.judged >= MIN_FIRINGS and precision is not None:
        if precision < DELETE_BELOW:
            return "deleted"
        if precision >= PROMOTABLE:
            return "promoted" if status.state == "promoted" else "promotable"
        if status.state == "promoted":
            return "promoted"  # between the marks a promoted fix stays; only below 40 % it goes
    if status.state == "shadow" and status.trial_started_at is not None and now - status.trial_started_at > TRIAL:
        return "ended"
    return "shadow" if status.state == "promotable" else status.state


async def review_detectors(db: Queries, now: datetime) -> dict[str, str]:
    """Move each detector to the state its precision gives it; returns the changes."""
    await ensure_detectors(db, now)
    changed: dict[str, str] = {}
    for status in await detector_statuses(db):
        state = decide(status, now)
        await db.execute(
            "UPDATE quality_detectors SET state = $2, precision = $3, judged = $4,"
            " decided_at = CASE WHEN state <> $2 THEN $5 ELSE decided_at END WHERE name = $1",
            status.name,
            state,
            status.precision,
            status.judged,
            now,
        )
        if state != status.state:
            changed[status.name] = state
    _CACHE.clear()
    return changed


async def promote(db: Queries, name: str, now: datetime) -> None:
    """The owner's one command: a ``promotable`` detector starts applying its fix."""
    await review_detectors(db, now)
    state = await db.fetchval("SELECT state FROM quality_detectors WHERE name = $1", name)
    if state is None:
        raise InvalidInput(f"no detector {name!r} (known: {', '.join(all_detectors())})")
    if name in SUGGESTERS and state == "shadow":
        pass  # no one grades a shadow card: the owner promotes after reading what it would suggest
    elif state != "promotable":
        raise InvalidInput(
            f"detector {name!r} is {state}: only a promotable one (>= {MIN_FIRINGS} judged firings at "
            f">= {PROMOTABLE:.0%} precision) can be promoted"
        )
    await db.execute("UPDATE quality_detectors SET state = 'promoted', decided_at = $2 WHERE name = $1", name, now)
    _CACHE.clear()
