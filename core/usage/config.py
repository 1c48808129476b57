"""The ``usage`` settings section: prices, daily caps per person and the tier thresholds.

In ``pepper.toml``::

    [usage]
    daily_cost = 2.0            # US dollars per person per UTC day
    daily_tokens = 2000000
    daily_minutes = 60          # call minutes
    [usage.prices."gpt-5-mini"]
    input = 0.25                # per million tokens
    output = 2.0

or the same as JSON in ``PEPPER_USAGE``. See ``core.usage.ledger`` for how they are applied.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.models.types import Generation

UsageTier = Literal["normal", "low_compute", "critical", "dead"]
TIERS: tuple[UsageTier, ...] = ("normal", "low_compute", "critical", "dead")
DEAD_REPLY = "I've reached today's usage limit, so I can't answer until tomorrow (UTC)."
DEAD_CALL_MESSAGE = "Pepper has reached today's usage limit. Please call again tomorrow."
NO_MODEL_CALL_MESSAGE = "Pepper can't take calls right now. Please try again later."


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(default=0.0, ge=0)
    output: float = Field(default=0.0, ge=0)
    cached_input: float | None = Field(default=None, ge=0)  # None: the input price


class UsageConfig(BaseModel):
    """The ``usage`` settings section (``[usage]`` in pepper.toml or JSON in ``PEPPER_USAGE``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prices: dict[str, Price] = Field(default_factory=dict)  # by model name, as the router names it
    daily_tokens: int | None = Field(default=None, ge=0)
    daily_cost: float | None = Field(default=None, ge=0)
    daily_minutes: float | None = Field(default=None, ge=0)
    low_compute_at: float = Field(default=0.8, gt=0, le=1)
    critical_at: float = Field(default=0.9, gt=0, le=1)
    # None: computed from the configured tiers and the prices (``core.models.select``).
    low_compute_tier: str | None = None
    critical_tier: str | None = None
    # A conversation or task whose turns hit the round cap or fail this many times in a row within
    # an hour is paused (``core.usage.breaker``); 0 turns the breaker off.
    breaker_failures: int = Field(default=3, ge=0)

    def cost(self, model: str, input_tokens: int, output_tokens: int, cached: int = 0) -> Decimal:
        price = self.prices.get(model)
        if price is None:
            return Decimal(0)
        cached_price = price.input if price.cached_input is None else price.cached_input
        total = (input_tokens - cached) * price.input + cached * cached_price + output_tokens * price.output
        return Decimal(str(total)) / Decimal(1_000_000)


def generation_usage(generation: Generation) -> dict[str, Any]:
    """One model call's usage as a helper reports it (``core.usage.ledger.calls_usage`` counts it)."""
    used = generation.usage
    return {"model": generation.model, "input": used.input_tokens, "output": used.output_tokens,
            "cached": used.cached_input_tokens}  # fmt: skip


def tier_of(ratio: float, config: UsageConfig) -> UsageTier:
    if ratio >= 1:
        return "dead"
    if ratio >= config.critical_at:
        return "critical"
    if ratio >= config.low_compute_at:
        return "low_compute"
    return "normal"
