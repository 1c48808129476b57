"""Provider faults (issue 31, suite 3): what each case found, and the suite's one summary line.

The cases themselves live beside what they drive: ``text_loop.testing.provider_faults`` (text
models through their official SDKs, a turn each) and ``voice.testing.provider_faults`` (calls on
each realtime engine, the loopback Twilio caller listening). ``scripts/suite-provider-faults``
runs them all and ``tests/test_provider_faults.py`` a part of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from core.store.queries import Queries

# The caller must hear something (the notice again, an apology) this soon after a realtime fault.
HEARD_WITHIN_MS = 1500.0


def counted(metric: str, **labels: str) -> float:
    """A Prometheus counter's value in this process so far (0 before its first count)."""
    from prometheus_client import REGISTRY

    from core.metrics import metrics

    metrics()  # every metric exists from here on
    return REGISTRY.get_sample_value(f"{metric}_total", labels) or 0.0


def failed_overs(provider: str) -> float:
    """``pepper_model_calls{outcome="failed_over"}`` under ``provider`` so far."""
    return counted("pepper_model_calls", provider=provider, outcome="failed_over")


async def turn_tokens(db: Queries, turn_id: UUID) -> int:
    """Input and output tokens the turn's record holds (``pepper turns show``)."""
    usage: Any = await db.fetchval("SELECT usage FROM turns WHERE id = $1", turn_id)
    usage = json.loads(usage) if isinstance(usage, str) else usage or {}
    return int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))


async def notes_saved(db: Queries, account_id: UUID, body: str) -> int:
    """How many dossier notes of the account say ``body``."""
    return int(
        await db.fetchval("SELECT count(*) FROM dossier_notes WHERE account_id = $1 AND body = $2", account_id, body)
    )


@dataclass
class Case:
    """One fault injected and what followed. ``failures`` empty: as promised. ``heard_ms``: a
    realtime case's fault to the first sound the caller received (None: none, or a text case)."""

    name: str
    failures: list[str] = field(default_factory=list)
    double_charges: int = 0
    heard_ms: float | None = None
    turn_id: UUID | None = None  # a text case's turn (``pepper turns show`` prints its record)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(f"{self.name}: {what}")
        return ok


@dataclass
class Results:
    cases: list[Case] = field(default_factory=list)

    def add(self, cases: Iterable[Case]) -> None:
        self.cases.extend(cases)

    @property
    def failures(self) -> list[str]:
        return [f for c in self.cases for f in c.failures]

    @property
    def double_charges(self) -> int:
        return sum(c.double_charges for c in self.cases)

    @property
    def worst_heard_ms(self) -> float | None:
        heard = [c.heard_ms for c in self.cases if c.heard_ms is not None]
        return max(heard) if heard else None

    def timed_failures(self, within_ms: float = HEARD_WITHIN_MS) -> list[str]:
        """The realtime cases whose caller heard nothing within ``within_ms`` of the fault (the
        script's timed check; the tests check only that something was heard)."""
        return [f"{c.name}: first sound {c.heard_ms:.0f} ms after the fault (> {within_ms:.0f})"
                for c in self.cases if c.heard_ms is not None and c.heard_ms > within_ms]  # fmt: skip

    def summary(self) -> str:
        worst = self.worst_heard_ms
        return (
            f"provider faults: cases run {len(self.cases)}, failures {len(self.failures)},"
            f" double charges: {self.double_charges}, worst time to first caller audio after a realtime fault"
            f" {'none' if worst is None else f'{worst:.0f} ms'}"
        )
