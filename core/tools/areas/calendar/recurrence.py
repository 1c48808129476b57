"""Recurring events in wall-clock time: a series made at 09:00 Europe/Paris stays at 09:00 local
across a DST change, so its UTC instant moves by an hour.

Rules are RFC 5545 RRULE values (``FREQ=WEEKLY;BYDAY=MO;COUNT=10``), expanded with dateutil on
naive local times and then placed in the series' zone. A local time that falls in a
spring-forward gap takes the offset from before the gap (RFC 5545 section 3.3.5).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from dateutil.rrule import rrule, rrulestr

from core.errors import InvalidInput

MAX_FINITE = 5000  # a series with more occurrences than this is treated as endless
_MARGIN = timedelta(days=2)  # wider than any UTC offset, so no occurrence is missed


def normalize_rrule(text: str) -> str:
    """``RRULE:`` prefix dropped, upper-cased; ``InvalidInput`` for a rule dateutil cannot read."""
    value = text.strip().removeprefix("RRULE:").removeprefix("rrule:").upper()
    if not value or "\n" in value:
        raise InvalidInput("a recurrence is one RRULE such as FREQ=WEEKLY;BYDAY=MO")
    try:
        rrulestr(value, dtstart=datetime(2000, 1, 1))
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"not a recurrence rule: {exc}") from exc
    return value


@lru_cache(maxsize=4096)
def _rule(text: str, local_start: datetime) -> rrule:
    return rrulestr(text, dtstart=local_start, cache=False)  # type: ignore[return-value]


def _place(naive: datetime, tz: ZoneInfo) -> datetime:
    return naive.replace(tzinfo=tz).astimezone(UTC)


def occurrences(
    start: datetime,
    end: datetime,
    tzid: str,
    rule_text: str,
    window_start: datetime,
    window_end: datetime,
    exdates: Sequence[datetime] = (),
) -> Iterator[tuple[datetime, datetime]]:
    """(start, end) in UTC of each occurrence overlapping [window_start, window_end), in order.

    ``start``/``end`` are the first occurrence's instants; the duration is kept in elapsed time.
    ``exdates`` are original occurrence starts that no longer belong to the series.
    """
    tz = ZoneInfo(tzid)
    duration = end - start
    local_start = start.astimezone(tz).replace(tzinfo=None)
    rule = _rule(rule_text, local_start)
    lo = (window_start - duration).astimezone(tz).replace(tzinfo=None) - _MARGIN
    hi = window_end.astimezone(tz).replace(tzinfo=None) + _MARGIN
    skipped = {d.astimezone(UTC) for d in exdates}
    for naive in rule.xafter(max(lo, local_start), inc=True):
        if naive > hi:
            break
        occ_start = _place(naive, tz)
        occ_end = occ_start + duration
        if occ_end <= window_start or occ_start >= window_end or occ_start in skipped:
            continue
        yield occ_start, occ_end


def series_end(start: datetime, end: datetime, tzid: str, rule_text: str) -> datetime | None:
    """End of the last occurrence of a finite series (COUNT or UNTIL), or None when endless."""
    if "COUNT=" not in rule_text and "UNTIL=" not in rule_text:
        return None
    tz = ZoneInfo(tzid)
    rule = _rule(rule_text, start.astimezone(tz).replace(tzinfo=None))
    last = None
    for n, naive in enumerate(rule):
        if n >= MAX_FINITE:
            return None
        last = naive
    if last is None:
        return end
    return _place(last, tz) + (end - start)


def is_occurrence(start: datetime, end: datetime, tzid: str, rule_text: str, when: datetime) -> bool:
    """Whether ``when`` is the start of an occurrence of the series."""
    return any(s == when for s, _ in occurrences(start, end, tzid, rule_text, when, when + timedelta(seconds=1)))
