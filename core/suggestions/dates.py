"""Dates and times written in text (a mail, a todo, a note), found by code, not by a model.

The patterns (which spans look like a date, a time, a due date) are ours: a regular expression
per shape. Turning a found span into a date is ``dateutil``'s parser. A date without a year is
the next one on or after today; a weekday alone ("by Friday") is the next such day. Only dates
with a day and a month (or ISO dates, weekdays after a deadline word, "today", "tomorrow") count:
a lone number never does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from dateutil import parser as dateparser

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_WEEKDAY = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+\d{4})"
_DATE = (
    rf"(?:\d{{4}}-\d{{2}}-\d{{2}}"
    rf"|(?:{_WEEKDAY},?\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}\.?{_YEAR}?"
    rf"|(?:{_WEEKDAY},?\s+)?{_MONTH}\.?\s+{_DAY}{_YEAR}?)"
)
_CLOCK = r"\d{1,2}(?:[:.]\d{2})?\s*(?:am|pm|a\.m\.|p\.m\.)|\d{1,2}[:.]\d{2}|noon"
_TIME = rf"(?:,?\s*(?:at|from|@|,|T)?\s*(?P<start>{_CLOCK}))"
_END = rf"(?:\s*(?:-|\u2013|to|until|till)\s*(?P<end>{_CLOCK}))"
WHEN = re.compile(rf"\b(?P<date>{_DATE})\b{_TIME}?{_END}?", re.IGNORECASE)
_DUE_WORD = r"(?:due(?:\s+(?:on|by|date))?|deadline(?:\s+is)?|by|before|no later than|submit by)"
DUE = re.compile(
    rf"\b{_DUE_WORD}[:\s]+(?P<date>{_DATE}|{_WEEKDAY}|today|tomorrow|tonight)\b(?:{_TIME})?", re.IGNORECASE
)
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class Found:
    start: datetime  # aware, in the zone the text was read in; midnight when no time was written
    end: datetime | None
    has_time: bool
    quote: str  # the words it was found in


def _clock(text: str) -> time | None:
    raw = text.strip().lower().replace(".", ":").replace("a:m:", "am").replace("p:m:", "pm")
    if raw == "noon":
        return time(12)
    try:
        parsed = dateparser.parse(raw, default=datetime(2000, 1, 1))
    except (ValueError, OverflowError):
        return None
    return parsed.time() if parsed is not None else None


def _day(text: str, today: date) -> date | None:
    raw = text.strip().lower()
    if raw in ("today", "tonight"):
        return today
    if raw == "tomorrow":
        return today + timedelta(days=1)
    if raw[:3] in _WEEKDAYS and not re.search(r"\d", raw):
        ahead = (_WEEKDAYS.index(raw[:3]) - today.weekday()) % 7
        return today + timedelta(days=ahead)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw):
        try:
            return date.fromisoformat(raw)
        except ValueError:
            return None
    has_year = bool(re.search(r"\d{4}", raw))
    try:
        parsed = dateparser.parse(re.sub(rf"^{_WEEKDAY},?\s+", "", raw), default=datetime(today.year, 1, 1),
                                  dayfirst=True)  # fmt: skip
    except (ValueError, OverflowError):
        return None
    if parsed is None:
        return None
    day = parsed.date()
    if not has_year and day < today:
        try:
            day = day.replace(year=day.year + 1)
        except ValueError:
            return None
    return day


def _found(match: re.Match[str], tz: ZoneInfo, today: date) -> Found | None:
    day = _day(match["date"], today)
    if day is None:
        return None
    start_clock = _clock(match["start"]) if match["start"] else None
    end_clock = _clock(match["end"]) if match.groupdict().get("end") else None
    start = datetime.combine(day, start_clock or time(), tz)
    end = datetime.combine(day, end_clock, tz) if start_clock and end_clock else None
    if end is not None and end <= start:
        end = None
    return Found(start, end, start_clock is not None, " ".join(match[0].split()))


def dates_in(text: str, tz: ZoneInfo, now: datetime) -> list[Found]:
    """Every date (with its time, if one is written) in ``text``, on or after today."""
    today = now.astimezone(tz).date()
    out = [f for m in WHEN.finditer(text) if (f := _found(m, tz, today)) is not None]
    return [f for f in out if f.start.date() >= today]


def due_dates_in(text: str, tz: ZoneInfo, now: datetime) -> list[Found]:
    """Dates given as a deadline ("due 10 Dec", "by Friday", "deadline: 2026-12-04 17:00")."""
    today = now.astimezone(tz).date()
    out = []
    for m in DUE.finditer(text):
        found = _found(m, tz, today)
        if found is not None and found.start.date() >= today:
            if not found.has_time:  # due on a day: by the end of it
                found = Found(found.start + timedelta(hours=17), None, False, found.quote)
            out.append(found)
    return out
