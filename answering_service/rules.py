"""The owner's rules for callers (``answering_settings``) and the slot arithmetic that follows them.

Everything a caller may learn about the owner comes from here: the greeting and what the owner
wrote for callers. Booking rules: appointment types with durations, working hours per weekday
(local time), a buffer before and after every busy time, a minimum notice and a horizon.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core import identity
from core.errors import InvalidInput
from core.records import answering
from core.store.queries import Queries
from core.tools.areas.calendar import Busy

DAYS: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CHANNELS: tuple[str, ...] = ("sms", "email", "web")
SLOT_STEP = timedelta(minutes=15)
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class AppointmentType:
    name: str
    minutes: int


@dataclass(frozen=True)
class Rules:
    account_id: UUID
    timezone: str = "UTC"
    owner_name: str = ""
    greeting: str = "Hello, you have reached an assistant who takes messages for this number."
    caller_info: str = ""
    booking_enabled: bool = False
    appointment_types: tuple[AppointmentType, ...] = (AppointmentType("meeting", 30),)
    working_hours: dict[str, tuple[tuple[time, time], ...]] = field(
        default_factory=lambda: {d: ((time(9), time(17)),) for d in DAYS[:5]}
    )
    buffer_minutes: int = 10
    min_notice_minutes: int = 120
    horizon_days: int = 30
    vip_numbers: tuple[str, ...] = ()
    blocked_numbers: tuple[str, ...] = ()
    notify_channel: str = "sms"
    send_invitations: bool = False
    max_calls_per_hour: int = 5  # per caller ID; every anonymous or withheld caller shares one count
    max_line_calls_per_hour: int = 30  # per line, every caller
    max_texts_per_hour: int = 10  # confirmation texts to callers, per line
    sms_countries: tuple[str, ...] = ()  # regions a caller's text may go to; empty: PEPPER_DEFAULT_REGION's
    transfer_enabled: bool = False  # callers may be put through to the owner (transfer_to_owner)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def buffer(self) -> timedelta:
        return timedelta(minutes=self.buffer_minutes)

    def appointment(self, name: str) -> AppointmentType:
        wanted = name.strip().lower()
        for kind in self.appointment_types:
            if kind.name.lower() == wanted:
                return kind
        names = ", ".join(k.name for k in self.appointment_types)
        raise InvalidInput(f"no appointment type {name!r}; the types are: {names}")

    def hours_text(self) -> str:
        parts = []
        for day in DAYS:
            spans = self.working_hours.get(day, ())
            if spans:
                parts.append(f"{day.title()} " + ", ".join(f"{a:%H:%M}-{b:%H:%M}" for a, b in spans))
        return "; ".join(parts) or "no hours set"


def parse_hours(spec: str) -> dict[str, tuple[tuple[time, time], ...]]:
    """``mon-fri=09:00-17:00,sat=10:00-12:00`` (later entries for a day add spans); ``none`` clears."""
    out: dict[str, list[tuple[time, time]]] = {}
    if spec.strip().lower() == "none":
        return {}
    for part in spec.split(","):
        days, sep, span = part.strip().partition("=")
        if not sep:
            raise InvalidInput(f"{part!r}: write hours like mon-fri=09:00-17:00")
        first, _, last = days.strip().lower().partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise InvalidInput(f"{days!r}: days are {', '.join(DAYS)}")
        span_days = DAYS[DAYS.index(first) : DAYS.index(last or first) + 1]
        if not span_days:
            raise InvalidInput(f"{days!r}: the first day must come before the last")
        start, dash, end = span.strip().partition("-")
        if not dash or not _HHMM.match(start) or not _HHMM.match(end):
            raise InvalidInput(f"{span!r}: write times like 09:00-17:00")
        a, b = time.fromisoformat(start), time.fromisoformat(end)
        if b <= a:
            raise InvalidInput(f"{span!r}: the end must come after the start")
        for day in span_days:
            out.setdefault(day, []).append((a, b))
    return {d: tuple(sorted(v)) for d, v in out.items()}


def _hours_from_json(raw: Any) -> dict[str, tuple[tuple[time, time], ...]]:
    data = json.loads(raw) if isinstance(raw, str) else raw
    return {d: tuple((time.fromisoformat(a), time.fromisoformat(b)) for a, b in spans) for d, spans in data.items()}


def hours_json(hours: dict[str, tuple[tuple[time, time], ...]]) -> str:
    return json.dumps({d: [[f"{a:%H:%M}", f"{b:%H:%M}"] for a, b in spans] for d, spans in hours.items()})


def types_json(types: tuple[AppointmentType, ...]) -> str:
    return json.dumps([{"name": t.name, "minutes": t.minutes} for t in types])


def parse_countries(spec: str) -> tuple[str, ...]:
    """``GB,IE`` (ISO 3166 region codes phone numbers use); ``default`` or empty: PEPPER_DEFAULT_REGION's."""
    if spec.strip().lower() in ("", "default"):
        return ()
    out = []
    for part in spec.split(","):
        code = part.strip().upper()
        if not identity.is_phone_region(code):
            raise InvalidInput(f"{part.strip()!r} is not a region code like GB or US")
        if code not in out:
            out.append(code)
    return tuple(out)


def text_countries(rules: Rules, default_region: str) -> tuple[str, ...]:
    """Where a caller's confirmation text may go: the owner's list, else the default region."""
    return rules.sms_countries or (default_region.upper(),)


def parse_type(spec: str) -> AppointmentType:
    """``consultation=45``."""
    name, sep, minutes = spec.partition("=")
    if not sep or not name.strip() or not minutes.strip().isdigit():
        raise InvalidInput(f"{spec!r}: write appointment types like consultation=45")
    value = int(minutes)
    if not 5 <= value <= 480:
        raise InvalidInput("an appointment lasts 5 to 480 minutes")
    return AppointmentType(name.strip(), value)


async def load_rules(db: Queries, account_id: UUID) -> Rules:
    """The owner's rules; the defaults (booking off) when the owner never set any."""
    account = await answering.owner(db, account_id)
    base = Rules(
        account_id, timezone=account["timezone"] if account else "UTC", owner_name=account["name"] if account else ""
    )
    row = await answering.settings(db, account_id)
    if row is None:
        return base
    types = (
        json.loads(row["appointment_types"]) if isinstance(row["appointment_types"], str) else row["appointment_types"]
    )
    return replace(
        base,
        greeting=row["greeting"],
        caller_info=row["caller_info"],
        booking_enabled=row["booking_enabled"],
        appointment_types=tuple(AppointmentType(t["name"], int(t["minutes"])) for t in types),
        working_hours=_hours_from_json(row["working_hours"]),
        buffer_minutes=row["buffer_minutes"],
        min_notice_minutes=row["min_notice_minutes"],
        horizon_days=row["horizon_days"],
        vip_numbers=tuple(row["vip_numbers"]),
        blocked_numbers=tuple(row["blocked_numbers"]),
        notify_channel=row["notify_channel"],
        send_invitations=row["send_invitations"],
        max_calls_per_hour=row["max_calls_per_hour"],
        max_line_calls_per_hour=row["max_line_calls_per_hour"],
        max_texts_per_hour=row["max_texts_per_hour"],
        sms_countries=tuple(row["sms_countries"]),
        transfer_enabled=bool(row.get("transfer_enabled")),
    )


async def save_rules(db: Queries, rules: Rules) -> None:
    await answering.save_settings(
        db,
        rules.account_id,
        greeting=rules.greeting,
        caller_info=rules.caller_info,
        booking_enabled=rules.booking_enabled,
        appointment_types=types_json(rules.appointment_types),
        working_hours=hours_json(rules.working_hours),
        buffer_minutes=rules.buffer_minutes,
        min_notice_minutes=rules.min_notice_minutes,
        horizon_days=rules.horizon_days,
        vip_numbers=list(rules.vip_numbers),
        blocked_numbers=list(rules.blocked_numbers),
        notify_channel=rules.notify_channel,
        send_invitations=rules.send_invitations,
        max_calls_per_hour=rules.max_calls_per_hour,
        max_line_calls_per_hour=rules.max_line_calls_per_hour,
        max_texts_per_hour=rules.max_texts_per_hour,
        sms_countries=list(rules.sms_countries),
    )
    await answering.set_transfer_enabled(db, rules.account_id, rules.transfer_enabled)


# --- Slots ---------------------------------------------------------------------------------------


def within_hours(rules: Rules, start: datetime, end: datetime) -> bool:
    """The whole appointment lies inside one working-hours span of its (local) day."""
    local_start, local_end = start.astimezone(rules.zone), end.astimezone(rules.zone)
    if local_start.date() != local_end.date() and local_end.time() != time(0):
        return False
    for a, b in rules.working_hours.get(DAYS[local_start.weekday()], ()):
        if a <= local_start.time() and (local_end.time() <= b) and local_end > local_start:
            return True
    return False


def rule_problem(rules: Rules, start: datetime, end: datetime, now: datetime) -> str | None:
    """Why the owner's rules refuse [start, end), in words for the caller; None when they allow it."""
    if start < now + timedelta(minutes=rules.min_notice_minutes):
        return f"that is too soon: appointments need at least {_duration(rules.min_notice_minutes)} notice"
    if start > now + timedelta(days=rules.horizon_days):
        return f"that is too far ahead: appointments can be booked up to {rules.horizon_days} days ahead"
    if not within_hours(rules, start, end):
        return f"that is outside the hours for appointments ({rules.hours_text()})"
    return None


def overlaps(busy: list[Busy], start: datetime, end: datetime, pad: timedelta) -> bool:
    return any(b.start < end + pad and b.end > start - pad for b in busy)


def free_starts(rules: Rules, day: date, minutes: int, busy: list[Busy], now: datetime) -> list[datetime]:
    """Start times on a local day that fit the rules and keep the buffer from every busy time."""
    zone = rules.zone
    length = timedelta(minutes=minutes)
    out: list[datetime] = []
    for a, b in rules.working_hours.get(DAYS[day.weekday()], ()):
        at = datetime.combine(day, a, zone)
        last = datetime.combine(day, b, zone) - length
        while at <= last:
            if rule_problem(rules, at, at + length, now) is None and not overlaps(busy, at, at + length, rules.buffer):
                out.append(at)
            at += SLOT_STEP
    return out


def day_window(rules: Rules, day: date) -> tuple[datetime, datetime]:
    """The local day, widened by the buffer on both sides (busy time just outside it still counts)."""
    start = datetime.combine(day, time(), rules.zone)
    return start - rules.buffer, start + timedelta(days=1) + rules.buffer


def _duration(minutes: int) -> str:
    if minutes % 1440 == 0:
        days = minutes // 1440
        return f"{days} day{'s' if days > 1 else ''}"
    if minutes % 60 == 0:
        hours = minutes // 60
        return f"{hours} hour{'s' if hours > 1 else ''}"
    return f"{minutes} minutes"


def spoken(moment: datetime, zone: ZoneInfo) -> str:
    local = moment.astimezone(zone)
    return f"{local:%A %d %B} at {local:%H:%M}"
