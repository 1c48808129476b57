"""Schedules: when a scheduled task's occurrences fall, time-zone aware and safe across DST.

Schedules are coarse and human: a time of day on some days of the week ("weekdays at 07:30",
"mornings"), sunrise or sunset at a place (via ``astral``), a cron expression for the rare precise
case (via ``croniter``), or one moment ("once at 2025-06-02 09:00", "in 20 minutes").

Occurrences are defined in the task's local wall-clock time and resolved to UTC by two rules:

* a local time that does not exist (the spring-forward gap) moves forward by the gap
  (02:30 on the night clocks jump from 02:00 to 03:00 runs at 03:30);
* a local time that happens twice (the fall-back hour) runs once, at its first instant.

So a DST change never skips or doubles an occurrence. The occurrence time is also the
occurrence's identity (with the task id), which is what keeps a clock jump from doubling one.

Parsing errors raise :class:`ScheduleError` with a sentence the person (or the model) can act on.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import InvalidInput

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
WEEKDAYS = frozenset(range(5))
WEEKENDS = frozenset({5, 6})
EVERY_DAY = frozenset(range(7))
MORNING = time(8, 0)
EVENING = time(18, 0)
# The largest spread given to tasks set for the same time (seconds). Coarse schedules only.
MAX_OFFSET_SECONDS = 300
# Bound on how far ahead a search for the next occurrence looks (polar nights last months).
_SEARCH_DAYS = 400
# Larger than any DST shift anywhere (Troll station: 2 h); bounds the cron search window.
_DST_MARGIN = timedelta(hours=3)

Kind = Literal["daily", "sun", "cron", "once"]


class ScheduleError(InvalidInput):
    code = "bad-schedule"


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name such as Europe/Paris") from None


def to_utc(local: datetime, tz: ZoneInfo) -> datetime:
    """A naive local wall-clock time as a UTC instant: gaps move forward, repeated times take the first."""
    aware = local.replace(tzinfo=tz, fold=0)
    utc = aware.astimezone(UTC)
    # zoneinfo reads a time in the gap with the offset from before it, which lands after the gap.
    return utc


@dataclass(frozen=True)
class Place:
    latitude: float
    longitude: float

    def __post_init__(self) -> None:
        if not -90 <= self.latitude <= 90 or not -180 <= self.longitude <= 180:
            raise ScheduleError("a place needs a latitude between -90 and 90 and a longitude between -180 and 180")


@dataclass(frozen=True)
class Schedule:
    """One schedule. Build with :func:`parse_schedule` or :meth:`from_record`; store ``as_record()``."""

    kind: Kind
    days: frozenset[int] = EVERY_DAY
    at: time | None = None  # daily
    event: str | None = None  # sun: sunrise or sunset
    offset_minutes: int = 0  # sun
    place: Place | None = None  # sun; None: the owner's place
    expr: str | None = None  # cron
    moment: datetime | None = None  # once, UTC

    @property
    def coarse(self) -> bool:
        """Coarse schedules get a small stable offset; cron and one-off moments run on time."""
        return self.kind in ("daily", "sun")

    @property
    def one_shot(self) -> bool:
        return self.kind == "once"

    @property
    def needs_place(self) -> bool:
        return self.kind == "sun" and self.place is None

    # --- records -------------------------------------------------------------------------

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind in ("daily", "sun"):
            out["days"] = sorted(self.days)
        if self.kind == "daily":
            assert self.at is not None
            out["at"] = self.at.strftime("%H:%M")
        elif self.kind == "sun":
            out["event"] = self.event
            out["offset_minutes"] = self.offset_minutes
            if self.place is not None:
                out["latitude"], out["longitude"] = self.place.latitude, self.place.longitude
        elif self.kind == "cron":
            out["expr"] = self.expr
        else:
            assert self.moment is not None
            out["at"] = self.moment.isoformat()
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Schedule:
        kind = record.get("kind")
        if kind == "daily":
            hh, mm = record["at"].split(":")
            return cls("daily", frozenset(record.get("days", EVERY_DAY)), at=time(int(hh), int(mm)))
        if kind == "sun":
            place = None
            if record.get("latitude") is not None:
                place = Place(float(record["latitude"]), float(record["longitude"]))
            return cls(
                "sun",
                frozenset(record.get("days", EVERY_DAY)),
                event=record["event"],
                offset_minutes=int(record.get("offset_minutes", 0)),
                place=place,
            )
        if kind == "cron":
            return _cron(record["expr"])
        if kind == "once":
            return cls("once", moment=datetime.fromisoformat(record["at"]).astimezone(UTC))
        raise ScheduleError(f"unknown schedule kind {kind!r}")

    # --- occurrences -----------------------------------------------------------------------

    def next_after(self, after: datetime, timezone: str, place: Place | None = None) -> datetime | None:
        """The first occurrence strictly after ``after`` (aware), in UTC; None when there is none.

        ``place`` is the owner's place, used when a sun schedule names none. Raises
        ``ScheduleError`` when a sun schedule has no place at all.
        """
        if after.tzinfo is None:
            raise ValueError("after must be timezone-aware")
        tz = zone(timezone)
        if self.kind == "once":
            assert self.moment is not None
            return self.moment if self.moment > after else None
        if self.kind == "cron":
            return self._next_cron(after, tz)
        start = after.astimezone(tz).date() - timedelta(days=1)
        for n in range(_SEARCH_DAYS):
            day = start + timedelta(days=n)
            if day.weekday() not in self.days:
                continue
            candidate = self._on(day, tz, place)
            if candidate is not None and candidate > after:
                return candidate
        return None

    def occurrences(
        self, after: datetime, until: datetime, timezone: str, place: Place | None = None, *, limit: int = 1000
    ) -> list[datetime]:
        """Occurrences in ``(after, until]``, oldest first, at most ``limit``."""
        found: list[datetime] = []
        cursor = after
        while len(found) < limit:
            nxt = self.next_after(cursor, timezone, place)
            if nxt is None or nxt > until:
                break
            found.append(nxt)
            cursor = nxt
        return found

    def _on(self, day: date, tz: ZoneInfo, place: Place | None) -> datetime | None:
        if self.kind == "daily":
            assert self.at is not None
            return to_utc(datetime.combine(day, self.at), tz)
        where = self.place or place
        if where is None:
            raise ScheduleError("this schedule follows the sun but no place is known; set the owner's place")
        from astral import Observer
        from astral.sun import sunrise, sunset

        observer = Observer(where.latitude, where.longitude)
        try:
            moment = (sunrise if self.event == "sunrise" else sunset)(observer, day, tzinfo=tz)
        except ValueError:  # the sun does not rise or set that day (polar day or night)
            return None
        return (moment + timedelta(minutes=self.offset_minutes)).astimezone(UTC).replace(microsecond=0)

    def _next_cron(self, after: datetime, tz: ZoneInfo) -> datetime | None:
        from croniter import croniter

        # Walk cron's wall-clock candidates (naive local times) from a little before ``after``:
        # resolving gaps can move a candidate later than a following one, so look a DST margin
        # past the first hit and keep the earliest instant.
        local_after = after.astimezone(tz).replace(tzinfo=None)
        it = croniter(self.expr, local_after - _DST_MARGIN)
        best: datetime | None = None
        horizon: datetime | None = None
        for _ in range(10_000):
            candidate = it.get_next(datetime)
            if horizon is not None and candidate > horizon:
                break
            if candidate - local_after > timedelta(days=_SEARCH_DAYS * 5):
                break
            utc = to_utc(candidate, tz)
            if utc > after and (best is None or utc < best):
                best = utc
                horizon = horizon or candidate + _DST_MARGIN
        return best

    # --- words -----------------------------------------------------------------------------

    def describe(self) -> str:
        if self.kind == "once":
            assert self.moment is not None
            return f"once at {self.moment:%Y-%m-%d %H:%M} UTC"
        if self.kind == "cron":
            return f"cron {self.expr}"
        days = _days_words(self.days)
        if self.kind == "daily":
            assert self.at is not None
            return f"{days} at {self.at:%H:%M}"
        when = self.event or "sunrise"
        if self.offset_minutes:
            rel = "after" if self.offset_minutes > 0 else "before"
            when = f"{abs(self.offset_minutes)} minutes {rel} {when}"
        where = f" at {self.place.latitude:.3f},{self.place.longitude:.3f}" if self.place else ""
        return f"{days} at {when}{where}"


def _days_words(days: frozenset[int]) -> str:
    if days == EVERY_DAY:
        return "every day"
    if days == WEEKDAYS:
        return "weekdays"
    if days == WEEKENDS:
        return "weekends"
    return ",".join(DAY_NAMES[d] for d in sorted(days))


def _cron(expr: str) -> Schedule:
    from croniter import croniter

    expr = " ".join(expr.split())
    fields = expr.split()
    if len(fields) != 5:
        raise ScheduleError(
            f"a cron expression has five fields (minute hour day month weekday); {expr!r} has {len(fields)}"
        )
    if not croniter.is_valid(expr):
        for i, (name, allowed) in enumerate(_CRON_FIELDS):
            alone = ["*"] * 5
            alone[i] = fields[i]
            if not croniter.is_valid(" ".join(alone)):
                raise ScheduleError(f"in cron {expr!r}, {fields[i]!r} is not a valid {name} ({allowed})")
        raise ScheduleError(f"not a valid cron expression: {expr!r}")
    return Schedule("cron", expr=expr)


_CRON_FIELDS = (
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day of the month", "1-31"),
    ("month", "1-12 or jan-dec"),
    ("day of the week", "0-6 or sun-sat"),
)


def stable_offset(task_id: int, schedule: Schedule) -> int:
    """Seconds added to each occurrence so tasks set for the same time do not all start at once.

    A hash of the task id: the same task always gets the same offset.
    """
    if not schedule.coarse:
        return 0
    digest = hashlib.sha256(f"pepper-task-{task_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % MAX_OFFSET_SECONDS


# --- the words people write --------------------------------------------------------------

_TIME = re.compile(r"^(\d{1,2})(?::(\d{2}))?\s*(am|pm)?$")
_RELATIVE = re.compile(r"^in\s+([+-]?\d+)\s*(minutes?|mins?|m|hours?|hrs?|h|days?|d)$")
_SUN = re.compile(
    r"^(?:(\d+)\s*(?:minutes?|mins?|m)\s+(before|after)\s+)?(sunrise|sunset)"
    r"(?:\s*([+-])\s*(\d+)\s*(?:minutes?|mins?|m)?)?$"
)
_DAY_WORDS: dict[str, frozenset[int]] = {
    "daily": EVERY_DAY,
    "every day": EVERY_DAY,
    "everyday": EVERY_DAY,
    "mornings": EVERY_DAY,
    "every morning": EVERY_DAY,
    "evenings": EVERY_DAY,
    "every evening": EVERY_DAY,
    "weekdays": WEEKDAYS,
    "on weekdays": WEEKDAYS,
    "weekday mornings": WEEKDAYS,
    "weekends": WEEKENDS,
    "on weekends": WEEKENDS,
    "weekend mornings": WEEKENDS,
}

SCHEDULE_HELP = (
    "Write a schedule like: 'mornings', 'weekdays at 07:30', 'weekends at 9am', 'mon,wed,fri at 18:00', "
    "'every day at sunset', '30 minutes before sunrise on weekdays', 'cron */15 * * * *', "
    "'once at 2025-06-02 09:00' (local time) or 'in 20 minutes'."
)


def parse_time(text: str) -> time:
    m = _TIME.match(text.strip().lower())
    if not m:
        raise ScheduleError(f"not a time of day: {text!r} (write 07:30 or 7:30am)")
    hour, minute, half = int(m.group(1)), int(m.group(2) or 0), m.group(3)
    if half:
        if not 1 <= hour <= 12:
            raise ScheduleError(f"not a time of day: {text!r}")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise ScheduleError(f"not a time of day: {text!r}")
    return time(hour, minute)


def _parse_days(text: str) -> frozenset[int]:
    text = text.strip()
    for prefix in ("on ", "every "):
        if text.startswith(prefix) and text not in _DAY_WORDS:
            text = text[len(prefix) :]
    if text in _DAY_WORDS:
        return _DAY_WORDS[text]
    days: set[int] = set()
    for part in re.split(r"[,\s]+(?:and\s+)?", text):
        part = part.strip().rstrip("s")
        if not part:
            continue
        key = part[:3]
        if key not in DAY_NAMES:
            raise ScheduleError(f"not a day: {part!r}. {SCHEDULE_HELP}")
        days.add(DAY_NAMES.index(key))
    if not days:
        raise ScheduleError(f"no days given. {SCHEDULE_HELP}")
    return frozenset(days)


def parse_schedule(text: str, *, now: datetime, timezone: str) -> Schedule:
    """Read a schedule as people write it (see ``SCHEDULE_HELP``). ``now`` resolves "in 20 minutes"."""
    raw = " ".join(text.strip().split())
    words = raw.lower()
    if not words:
        raise ScheduleError(f"the schedule is empty. {SCHEDULE_HELP}")
    tz = zone(timezone)
    if words.startswith("cron "):
        return _cron(raw[5:])
    m = _RELATIVE.match(words)
    if m:
        amount, unit = int(m.group(1)), m.group(2)[0]
        if amount <= 0:
            raise ScheduleError(f"{raw!r} is not in the future; write a positive amount, e.g. 'in 20 minutes'")
        delta = {"m": timedelta(minutes=amount), "h": timedelta(hours=amount), "d": timedelta(days=amount)}[unit]
        return Schedule("once", moment=(now + delta).astimezone(UTC).replace(microsecond=0))
    if words.startswith("in "):
        raise ScheduleError(f"{raw!r}: write 'in', a whole number and minutes, hours or days, e.g. 'in 20 minutes'")
    if words.startswith(("once at ", "once on ", "at ", "on ")) and re.search(r"\d{4}-\d{2}-\d{2}", words):
        stamp = re.sub(r"^(once\s+)?(at|on)\s+", "", words)
        try:
            moment = datetime.fromisoformat(stamp.replace(" at ", " ").upper())
        except ValueError:
            raise ScheduleError(f"not a date and time: {stamp!r} (write 2025-06-02 09:00)") from None
        moment = to_utc(moment, tz) if moment.tzinfo is None else moment.astimezone(UTC)
        return Schedule("once", moment=moment)

    # "<days> at <time|sun>", "<sun> on <days>", "<days>", "at <time>"
    days_text, when = words, None
    if " at " in f" {words}":
        head, _, when = f" {words}".rpartition(" at ")
        days_text = head.strip()
    sun_first = _SUN.match(words.split(" on ")[0].split(" every ")[0].strip())
    if sun_first and when is None:
        when = words.split(" on ")[0].split(" every ")[0].strip()
        days_text = words[len(when) :].strip()
    days = _parse_days(days_text) if days_text else EVERY_DAY
    if when is None:
        if days_text in ("mornings", "every morning", "weekday mornings", "weekend mornings"):
            return Schedule("daily", days, at=MORNING)
        if days_text in ("evenings", "every evening"):
            return Schedule("daily", days, at=EVENING)
        raise ScheduleError(f"say a time, e.g. 'weekdays at 07:30'. {SCHEDULE_HELP}")
    sun = _SUN.match(when)
    if sun:
        offset = 0
        if sun.group(1):
            offset = int(sun.group(1)) * (-1 if sun.group(2) == "before" else 1)
        elif sun.group(4):
            offset = int(sun.group(5)) * (-1 if sun.group(4) == "-" else 1)
        if abs(offset) > 12 * 60:
            raise ScheduleError("an offset from sunrise or sunset must be under 12 hours")
        return Schedule("sun", days, event=sun.group(3), offset_minutes=offset)
    return Schedule("daily", days, at=parse_time(when))
