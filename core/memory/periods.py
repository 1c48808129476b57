"""Local days, weeks (Monday to Sunday) and months as spans of time, and each person's offset.

Summaries cover calendar periods in the person's own time zone. A period is known by its kind
and its first local day; :func:`span` turns it into the instants ``[from, until)`` it covers,
across daylight-saving changes.
"""

from __future__ import annotations

import hashlib
from datetime import date, datetime, time, timedelta
from typing import Literal
from uuid import UUID
from zoneinfo import ZoneInfo

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")


def local_midnight(day: date, timezone: str) -> datetime:
    return datetime.combine(day, time(), tzinfo=ZoneInfo(timezone))


def local_date(moment: datetime, timezone: str) -> date:
    return moment.astimezone(ZoneInfo(timezone)).date()


def period_start(period: Period, day: date) -> date:
    """The first local day of the period that contains ``day``."""
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def period_end(period: Period, start: date) -> date:
    """The first local day after the period that starts on ``start``."""
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def span(period: Period, start: date, timezone: str) -> tuple[datetime, datetime]:
    """The instants ``[from, until)`` the period covers in ``timezone``."""
    return local_midnight(start, timezone), local_midnight(period_end(period, start), timezone)


def person_offset(account_id: UUID, spread: timedelta = timedelta(hours=1)) -> timedelta:
    """A stable offset in ``[0, spread)`` for this person: their jobs start this long after the hour."""
    digest = hashlib.blake2b(account_id.bytes, digest_size=8, person=b"pepper-memory").digest()
    seconds = int.from_bytes(digest, "big") % max(1, int(spread.total_seconds()))
    return timedelta(seconds=seconds)


def due_at(period: Period, start: date, timezone: str, account_id: UUID, nightly_hour: int) -> datetime:
    """When a finished period's job may run: the night after it ends, at the person's offset."""
    night = local_midnight(period_end(period, start), timezone) + timedelta(hours=nightly_hour)
    return night + person_offset(account_id)


def label(period: Period, start: date) -> str:
    if period == "day":
        return f"{start:%A} {start.day} {start:%B %Y}"
    if period == "week":
        last = period_end("week", start) - timedelta(days=1)
        return f"Week of {start.day} {start:%b} to {last.day} {last:%b %Y}"
    return f"{start:%B %Y}"
