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


def _rebase(text: str, local_start: datetime, lo: datetime) -> datetime:
    """A later start for the same series, on or before ``lo``, so expansion does not walk every
    occurrence since the first. Only for rules whose occurrences do not depend on where counting
    began: no COUNT; DAILY/WEEKLY move by whole intervals, MONTHLY/YEARLY by whole years (never
    from a 29 February)."""
    if lo <= local_start or "COUNT=" in text:
        return local_start
    parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
    interval = int(parts.get("INTERVAL", "1") or 1)
    freq = parts.get("FREQ")
    if freq in ("DAILY", "WEEKLY"):
        step = interval * (7 if freq == "WEEKLY" else 1)
        return local_start + timedelta(days=step * ((lo - local_start).days // step))
    if freq in ("MONTHLY", "YEARLY") and not (local_start.month == 2 and local_start.day == 29):
        years = interval  # k months x 12 (or k years) keeps the series in phase
        jump = years * ((lo.year - local_start.year - 1) // years)
        if jump > 0:
            return local_start.replace(year=local_start.year + jump)
    return local_start


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
    lo = (window_start - duration).astimezone(tz).replace(tzinfo=None) - _MARGIN
    hi = window_end.astimezone(tz).replace(tzinfo=None) + _MARGIN
    rule = _rule(rule_text, _rebase(rule_text, local_start, lo))
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
