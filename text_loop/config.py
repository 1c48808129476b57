"""The harness's knobs, with the defaults Pepper ships."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

DEFAULT_ROUND_CAPS: Mapping[str, int] = MappingProxyType({"live": 8, "scheduled": 12, "room": 4, "call": 6})
# Seconds of a turn after which no new round with tools starts: the rounds cap how many times the
# model may call tools, not how long each call takes (up to the model's and each tool's timeout),
# so a turn of slow rounds could keep the person waiting for minutes, and their next messages wait
# behind it. A caller on the line waits least.
DEFAULT_TIME_BUDGETS: Mapping[str, float] = MappingProxyType({"live": 120.0, "scheduled": 300.0, "room": 60.0,
                                                              "call": 30.0})  # fmt: skip

# Words and phrases whose removal changes what a reply claims; the repair pass may not drop them.
HEDGES: tuple[str, ...] = (
    "might", "may", "maybe", "perhaps", "possibly", "probably", "likely", "unlikely", "could",
    "seems", "appears", "i think", "i believe", "i'm not sure", "not sure", "approximately",
    "about", "around", "roughly", "unless", "if", "not",
)  # fmt: skip


@dataclass(frozen=True)
class HarnessConfig:
    """How a text turn is bounded and checked.

    ``round_caps``: rounds per turn kind (a round is one generation with tools offered).
    ``time_budgets``: seconds per turn kind after which the turn ends as at the round cap.
    ``budget_notice_within``: from this many remaining rounds, the model is told the budget.
    ``free_wasted_rounds``: rounds in which every call was unknown or refused that do not count.
    ``repair_*``: the repair pass and the bounds of its deterministic check.
    """

    round_caps: Mapping[str, int] = field(default_factory=lambda: DEFAULT_ROUND_CAPS)
    default_round_cap: int = 8
    time_budgets: Mapping[str, float] = field(default_factory=lambda: DEFAULT_TIME_BUDGETS)
    default_time_budget: float = 120.0
    budget_notice_within: int = 2
    free_wasted_rounds: int = 2
    tier: str = "small"
    max_output_tokens: int = 1024
    repair_channels: frozenset[str] = frozenset({"sms", "email"})
    repair_tier: str = "small"
    repair_max_length_change: float = 0.4
    repair_max_added_words: int = 3
    hedges: tuple[str, ...] = HEDGES

    def round_cap(self, kind: str) -> int:
        return max(1, self.round_caps.get(kind, self.default_round_cap))

    def time_budget(self, kind: str) -> float:
        return self.time_budgets.get(kind, self.default_time_budget)
