"""Usage per person: tokens, cost and call time per UTC day, caps, and the usage tier.

Every model call of a turn adds its tokens (the provider's usage fields) and its cost (the price
table, ``usage.prices``: US dollars per million input, cached input and output tokens) to the
person's day; every call adds its minutes. A cap (``usage.daily_tokens``, ``daily_cost``,
``daily_minutes``, or the account's own from ``pepper account limits``) bounds a day; months are
the sum of their days.

The tier is the highest ratio of a day's use to a cap: below ``low_compute_at`` ``normal``, then
``low_compute``, from ``critical_at`` ``critical``, at the cap ``dead``. The built-in
``model_select`` (``core.models.select``) acts on it, and any slot occupant can read it with
:func:`usage_tier`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from core.models.records import attempt_usage
from core.store.database import NO_FLUSH
from core.store.queries import Queries
from core.usage.config import DEAD_REPLY, UsageConfig, UsageTier, tier_of


@dataclass(frozen=True)
class Caps:
    tokens: int | None
    cost: float | None
    minutes: float | None


@dataclass(frozen=True)
class DayUsage:
    day: date
    tokens: int
    cost: Decimal
    minutes: float
    model_calls: int
    told_tier: str


def ratio_of(day: DayUsage, caps: Caps) -> float:
    ratios = [0.0]
    if caps.tokens is not None:
        ratios.append(day.tokens / caps.tokens if caps.tokens else 1.0)
    if caps.cost is not None:
        ratios.append(float(day.cost) / caps.cost if caps.cost else 1.0)
    if caps.minutes is not None:
        ratios.append(day.minutes / caps.minutes if caps.minutes else 1.0)
    return max(ratios)


async def caps_for(db: Queries, account_id: UUID, config: UsageConfig) -> Caps:
    row = await db.fetchrow(
        "SELECT daily_tokens, daily_cost, daily_minutes FROM account_limits WHERE account_id = $1", account_id
    )
    if row is None:
        return Caps(config.daily_tokens, config.daily_cost, config.daily_minutes)
    return Caps(
        row["daily_tokens"] if row["daily_tokens"] is not None else config.daily_tokens,
        float(row["daily_cost"]) if row["daily_cost"] is not None else config.daily_cost,
        row["daily_minutes"] if row["daily_minutes"] is not None else config.daily_minutes,
    )


async def set_limits(
    db: Queries, account_id: UUID, *, tokens: int | None, cost: float | None, minutes: float | None
) -> None:
    """The account's own daily caps (None: the settings' default)."""
    await db.execute(
        """
        INSERT INTO account_limits (account_id, daily_tokens, daily_cost, daily_minutes) VALUES ($1, $2, $3, $4)
        ON CONFLICT (account_id) DO UPDATE SET daily_tokens = $2, daily_cost = $3, daily_minutes = $4,
            updated_at = now()
        """,
        account_id,
        tokens,
        cost,
        minutes,
    )


def _day(row: Any, day: date) -> DayUsage:
    if row is None:
        return DayUsage(day, 0, Decimal(0), 0.0, 0, "normal")
    return DayUsage(day, row["tokens"], row["cost"], row["call_seconds"] / 60, row["model_calls"], row["tier"])


async def day_usage(db: Queries, account_id: UUID, day: date) -> DayUsage:
    row = await db.fetchrow(
        "SELECT tokens, cost, call_seconds, model_calls, tier FROM usage_days WHERE account_id = $1 AND day = $2",
        account_id,
        day,
    )
    return _day(row, day)


async def month_usage(db: Queries, account_id: UUID, day: date) -> DayUsage:
    """The sums over ``day``'s calendar month (``told_tier`` is ``day``'s)."""
    row = await db.fetchrow(
        """
        SELECT coalesce(sum(tokens), 0)::bigint AS tokens, coalesce(sum(cost), 0) AS cost,
               coalesce(sum(call_seconds), 0) AS call_seconds, coalesce(sum(model_calls), 0)::int AS model_calls,
               'normal' AS tier
        FROM usage_days WHERE account_id = $1 AND date_trunc('month', day) = date_trunc('month', $2::date)
        """,
        account_id,
        day,
    )
    return _day(row, day)


async def usage_tier(db: Queries, account_id: UUID, now: datetime, config: UsageConfig) -> UsageTier:
    """The person's tier now (UTC day)."""
    caps = await caps_for(db, account_id, config)
    if caps.tokens is None and caps.cost is None and caps.minutes is None:
        return "normal"
    return tier_of(ratio_of(await day_usage(db, account_id, now.date()), caps), config)


async def add_usage(
    db: Queries, account_id: UUID, now: datetime, *, tokens: int = 0, cost: Decimal = Decimal(0),
    call_seconds: float = 0.0, model_calls: int = 0,
) -> None:  # fmt: skip
    """Add to the person's UTC day. The commit does not wait for the disk: a turn's record, committed
    durably after it, flushes it too; a crash before that may lose one turn's count."""
    await db.execute(
        f"""
        INSERT INTO usage_days (account_id, day, tokens, cost, call_seconds, model_calls)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (account_id, day) DO UPDATE SET tokens = usage_days.tokens + $3, cost = usage_days.cost + $4,
            call_seconds = usage_days.call_seconds + $5, model_calls = usage_days.model_calls + $6
        RETURNING {NO_FLUSH}
        """,
        account_id,
        now.date(),
        tokens,
        cost,
        call_seconds,
        model_calls,
    )


def rounds_usage(rounds: list[dict[str, Any]], config: UsageConfig) -> tuple[int, Decimal, int]:
    """``(tokens, cost, model calls)`` of a turn's recorded rounds (``text_loop.records``)."""
    tokens, cost, calls = 0, Decimal(0), 0
    for r in rounds:
        # Calls that failed (failed over, or a stream cut part way and asked again) are charged what
        # their provider reported for them, and counted only when it reported something.
        for attempt in r.get("failed_attempts") or ():
            input_tokens, output_tokens, cached, _reasoning = attempt_usage(attempt)
            if input_tokens or output_tokens:
                calls += 1
                tokens += input_tokens + output_tokens
                cost += config.cost(str(attempt.get("model")), input_tokens, output_tokens, cached)
        response = r.get("response")
        if not isinstance(response, dict):
            continue
        input_tokens, output_tokens, cached, _reasoning = response.get("usage") or (0, 0, 0, 0)
        calls += 1
        tokens += input_tokens + output_tokens
        cost += config.cost(str(response.get("model")), input_tokens, output_tokens, cached)
    return tokens, cost, calls


def calls_usage(entries: Iterable[dict[str, Any]], config: UsageConfig) -> tuple[int, Decimal, int]:
    """``(tokens, cost, model calls)`` of model calls reported as ``{"model", "input", "output",
    "cached"}`` (what a tool's helper and the repair pass report); malformed entries count nothing."""
    tokens, cost, calls = 0, Decimal(0), 0
    for entry in entries:
        try:
            model, inp, out = str(entry["model"]), int(entry["input"]), int(entry["output"])
            cached = int(entry.get("cached") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        if min(inp, out, cached) < 0:
            continue
        calls += 1
        tokens += inp + out
        cost += config.cost(model, inp, out, min(cached, inp))
    return tokens, cost, calls


async def tier_change(db: Queries, account_id: UUID, now: datetime, tier: UsageTier) -> bool:
    """Note ``tier`` as today's; True when it differs from the tier last noted today (the owner is
    then told, at most once a day per change: the first turn of a day starts at ``normal``)."""
    row = await db.fetchrow(
        """
        INSERT INTO usage_days (account_id, day, tier) VALUES ($1, $2, $3)
        ON CONFLICT (account_id, day) DO UPDATE SET tier = $3
        RETURNING (SELECT tier FROM usage_days WHERE account_id = $1 AND day = $2) AS before
        """,
        account_id,
        now.date(),
        tier,
    )
    before = row["before"] or "normal"
    return bool(before != tier)


def tier_notice(tier: UsageTier) -> str:
    return {
        "normal": "Your usage is back to normal for today.",
        "low_compute": "You've used most of today's allowance: Pepper uses its cheaper model for the rest of the day.",
        "critical": "You're close to today's usage limit: Pepper now uses its smallest model and only looks things up.",
        "dead": DEAD_REPLY,
    }[tier]


@dataclass(frozen=True)
class UsageState:
    tier: UsageTier  # now
    told: str  # the tier the owner was last told about today


def usage_select(now: datetime) -> str:
    """A scalar SQL expression over the account id ``$1``: the account's caps and its use on
    ``now``'s UTC day, as JSON, read on the statement that opens a turn (:func:`usage_state`)."""
    return (
        "(SELECT json_build_object("
        "'limits', (SELECT row_to_json(l) FROM account_limits l WHERE l.account_id = $1), "
        "'day', (SELECT row_to_json(u) FROM usage_days u WHERE u.account_id = $1 "
        f"AND u.day = DATE '{now.date().isoformat()}')))"
    )


def usage_state(value: Any, config: UsageConfig) -> UsageState:
    """The tier from the value of :func:`usage_select`."""
    data = json.loads(value) if isinstance(value, str) else value or {}
    limits, day = data.get("limits") or {}, data.get("day") or {}

    def pick(name: str, default: Any) -> Any:
        return limits[name] if limits.get(name) is not None else default

    caps = Caps(pick("daily_tokens", config.daily_tokens), pick("daily_cost", config.daily_cost),
                pick("daily_minutes", config.daily_minutes))  # fmt: skip
    told = str(day.get("tier") or "normal")
    if caps.tokens is None and caps.cost is None and caps.minutes is None:
        return UsageState("normal", told)
    used = DayUsage(
        date.min, int(day.get("tokens") or 0), Decimal(str(day.get("cost") or 0)),
        float(day.get("call_seconds") or 0) / 60, int(day.get("model_calls") or 0), told,
    )  # fmt: skip
    return UsageState(tier_of(ratio_of(used, caps), config), told)


async def own_limits(db: Queries, account_id: UUID) -> Caps:
    """The account's own caps (None where it follows the settings)."""
    row = await db.fetchrow(
        "SELECT daily_tokens, daily_cost, daily_minutes FROM account_limits WHERE account_id = $1", account_id
    )
    if row is None:
        return Caps(None, None, None)
    cost = row["daily_cost"]
    return Caps(row["daily_tokens"], float(cost) if cost is not None else None, row["daily_minutes"])
