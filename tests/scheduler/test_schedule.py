"""Schedules: words, DST, the sun, cron, offsets. Pure computations."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from core.scheduling.schedule import (
    MAX_OFFSET_SECONDS,
    Place,
    Schedule,
    ScheduleError,
    parse_schedule,
    stable_offset,
)

NOW = datetime(2025, 6, 2, 5, 0, tzinfo=UTC)  # Monday
PARIS = "Europe/Paris"
NEW_YORK = "America/New_York"


def _local(moments: list[datetime], zone: str) -> list[str]:
    from zoneinfo import ZoneInfo

    return [f"{m.astimezone(ZoneInfo(zone)):%a %Y-%m-%d %H:%M %Z}" for m in moments]


@pytest.mark.parametrize(
    ("text", "described"),
    [
        ("mornings", "every day at 08:00"),
        ("Weekdays at 7:30", "weekdays at 07:30"),
        ("weekends at 9am", "weekends at 09:00"),
        ("mon, wed and fri at 6:15pm", "mon,wed,fri at 18:15"),
        ("every day at sunset", "every day at sunset"),
        ("30 minutes before sunrise on weekdays", "weekdays at 30 minutes before sunrise"),
        ("sunset + 15", "every day at 15 minutes after sunset"),
        ("cron */15 * * * *", "cron */15 * * * *"),
        ("in 20 minutes", "once at 2025-06-02 05:20 UTC"),
        ("once at 2025-06-03 09:00", "once at 2025-06-03 07:00 UTC"),
    ],
)
def test_people_write_schedules_in_words(text, described):
    schedule = parse_schedule(text, now=NOW, timezone=PARIS)
    assert schedule.describe() == described
    assert Schedule.from_record(schedule.as_record()) == schedule


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("weekdays", "say a time"),
        ("someday at 9", "not a day"),
        ("daily at 25:00", "not a time of day"),
        ("cron * * *", "five fields"),
        ("cron 99 8 * * 1", "'99' is not a valid minute"),
        ("cron 0 8 * 13 1", "'13' is not a valid month"),
        ("cron 0 8 * * funday", "'funday' is not a valid day of the week"),
        ("in -5 minutes", "not in the future"),
        ("in 0 hours", "not in the future"),
        ("in five minutes", "a whole number"),
        ("once at 2025-13-01 09:00", "not a date"),
    ],
)
def test_a_bad_schedule_says_what_is_wrong(text, says):
    with pytest.raises(ScheduleError, match=says):
        parse_schedule(text, now=NOW, timezone=PARIS)


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(ScheduleError, match="unknown time zone"):
        parse_schedule("mornings", now=NOW, timezone="Mars/Olympus")


def test_weekdays_skip_the_weekend():
    schedule = parse_schedule("weekdays at 07:30", now=NOW, timezone=PARIS)
    found = schedule.occurrences(NOW, NOW + timedelta(days=8), PARIS)
    assert _local(found, PARIS) == [
        "Mon 2025-06-02 07:30 CEST", "Tue 2025-06-03 07:30 CEST", "Wed 2025-06-04 07:30 CEST",
        "Thu 2025-06-05 07:30 CEST", "Fri 2025-06-06 07:30 CEST", "Mon 2025-06-09 07:30 CEST",
    ]  # fmt: skip


def test_spring_forward_moves_a_time_in_the_gap_forward_and_skips_no_day():
    schedule = parse_schedule("every day at 02:30", now=NOW, timezone=NEW_YORK)
    start = datetime(2025, 3, 8, 12, 0, tzinfo=UTC)
    found = schedule.occurrences(start, start + timedelta(days=3), NEW_YORK)
    assert _local(found, NEW_YORK) == [
        "Sun 2025-03-09 03:30 EDT",
        "Mon 2025-03-10 02:30 EDT",
        "Tue 2025-03-11 02:30 EDT",
    ]


def test_fall_back_runs_a_repeated_time_once():
    schedule = parse_schedule("every day at 01:30", now=NOW, timezone=NEW_YORK)
    start = datetime(2025, 11, 1, 12, 0, tzinfo=UTC)
    found = schedule.occurrences(start, start + timedelta(days=3), NEW_YORK)
    assert _local(found, NEW_YORK) == [
        "Sun 2025-11-02 01:30 EDT",
        "Mon 2025-11-03 01:30 EST",
        "Tue 2025-11-04 01:30 EST",
    ]
    assert len(set(found)) == len(found)


def test_hourly_cron_across_both_changes_is_strictly_increasing_with_no_gap_over_two_hours():
    schedule = parse_schedule("cron 30 * * * *", now=NOW, timezone=PARIS)
    for start in (datetime(2025, 3, 29, 20, 0, tzinfo=UTC), datetime(2025, 10, 25, 20, 0, tzinfo=UTC)):
        found = schedule.occurrences(start, start + timedelta(hours=10), PARIS)
        assert all(b > a for a, b in itertools.pairwise(found))
        assert all(b - a <= timedelta(hours=2) for a, b in itertools.pairwise(found))
        assert len(found) >= 9


def test_next_after_walks_every_day_of_a_year_across_dst_without_skips_or_doubles():
    schedule = parse_schedule("every day at 02:30", now=NOW, timezone=PARIS)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    found = schedule.occurrences(start, start + timedelta(days=365), PARIS)
    days = [m.astimezone(__import__("zoneinfo").ZoneInfo(PARIS)).date() for m in found]
    assert len(found) == 365 and len(set(days)) == 365


def test_sunrise_follows_the_place_and_the_season():
    schedule = parse_schedule("sunrise", now=NOW, timezone=PARIS)
    paris = Place(48.8566, 2.3522)
    june = schedule.next_after(datetime(2025, 6, 20, 12, tzinfo=UTC), PARIS, paris)
    december = schedule.next_after(datetime(2025, 12, 20, 12, tzinfo=UTC), PARIS, paris)
    assert _local([june], PARIS)[0].startswith("Sat 2025-06-21 05:4")
    assert _local([december], PARIS)[0].startswith("Sun 2025-12-21 08:4")


def test_a_sun_schedule_skips_polar_days_and_needs_a_place():
    schedule = parse_schedule("sunset", now=NOW, timezone="Europe/Oslo")
    svalbard = Place(78.22, 15.65)
    nxt = schedule.next_after(datetime(2025, 5, 1, tzinfo=UTC), "Europe/Oslo", svalbard)
    assert nxt is not None and nxt.month == 8  # the midnight sun ends late August
    with pytest.raises(ScheduleError, match="no place"):
        schedule.next_after(NOW, PARIS)


def test_a_one_off_runs_once():
    schedule = parse_schedule("in 2 hours", now=NOW, timezone=PARIS)
    assert schedule.next_after(NOW, PARIS) == NOW + timedelta(hours=2)
    assert schedule.next_after(NOW + timedelta(hours=2), PARIS) is None


def test_offsets_are_stable_small_and_only_for_coarse_schedules():
    coarse = parse_schedule("mornings", now=NOW, timezone=PARIS)
    cron = parse_schedule("cron 0 8 * * *", now=NOW, timezone=PARIS)
    offsets = [stable_offset(task_id, coarse) for task_id in range(1, 200)]
    assert offsets == [stable_offset(task_id, coarse) for task_id in range(1, 200)]
    assert all(0 <= o < MAX_OFFSET_SECONDS for o in offsets)
    assert len(set(offsets)) > 100  # spread out
    assert stable_offset(7, cron) == 0
