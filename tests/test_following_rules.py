"""The pure rules of following a page: which dates a quote supports, how old and new events pair."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from core.following.match import Stored, pair
from core.following.pages import _date_supported, checked_events, normalise


@pytest.mark.parametrize(
    ("day", "written", "supported"),
    [
        (date(2025, 3, 14), "Friday 14 March 2025", True),
        (date(2025, 3, 14), "Fri 14 Mar", True),
        (date(2025, 3, 14), "March 14th", True),
        (date(2025, 3, 14), "14/03/2025", True),
        (date(2025, 3, 14), "2025-03-14", True),
        (date(2025, 3, 14), "Friday 14 March 2026", False),  # another year
        (date(2025, 3, 15), "Friday 14 March 2025", False),  # another day
        (date(2025, 4, 14), "Friday 14 March 2025", False),  # another month
        (date(2025, 3, 14), "next Friday", False),  # worked out, not written
        (date(2025, 3, 14), "14 March to 2 April", False),  # two months: not one date
        (date(2025, 3, 14), "vendredi 14 mars 2025", True),
        (date(2025, 3, 14), "Freitag, 14. März 2025", True),
        (date(2025, 4, 14), "lundi 14 avril", True),
        (date(2025, 6, 14), "samedi 14 juillet", False),  # juin is June, juillet July
        (date(2025, 9, 3), "3 sept.", True),
        (date(2025, 5, 3), "sábado 3 de mayo de 2025", True),
    ],
)
def test_a_date_must_be_written_as_given(day: date, written: str, supported: bool):
    assert _date_supported(day, written) is supported


def test_quotes_compare_with_whitespace_case_and_typographic_quotes_folded():
    page = "Friday 14 March 2025:\n  the \u201cBig\u201d   Sports  Day"
    raw = [{"title": "Sports day", "date": "2025-03-14", "date_text": "friday 14 march 2025",
            "quote": 'Friday 14 March 2025: the "Big" Sports Day', "cancelled": False}]  # fmt: skip
    events, dropped = checked_events(raw, page, UTC)
    assert [e.title for e in events] == ["Sports day"] and dropped == []
    assert events[0].all_day and events[0].end - events[0].start == timedelta(days=1)
    assert normalise("A\u00a0 B") == "a b"


def d(day: int) -> datetime:
    return datetime(2025, 4, day, 16, tzinfo=UTC)


def test_a_moved_one_off_event_is_an_update():
    result = pair([("Sports day", d(18))], [Stored(1, "Sports Day", d(11))])
    assert [(i, s.id) for i, s in result.pairs] == [(0, 1)] and result.new == [] and result.missing == []


def test_a_weekly_series_keeps_each_week_and_a_shifted_window_is_not_a_move():
    old = [Stored(1, "Swim practice", d(1)), Stored(2, "Swim practice", d(8))]
    same = pair([("Swim practice", d(8)), ("Swim practice", d(1))], old)
    assert sorted((i, s.id) for i, s in same.pairs) == [(0, 2), (1, 1)]
    # The page now lists 8 and 15: week 8 is the same event, 15 is new, 1 is missed (not moved to 15).
    shifted = pair([("Swim practice", d(8)), ("Swim practice", d(15))], old)
    assert [(i, s.id) for i, s in shifted.pairs] == [(0, 2)]
    assert shifted.new == [1] and [s.id for s in shifted.missing] == [1]


def test_titles_never_cross():
    result = pair([("Bake sale", d(10))], [Stored(1, "Book fair", d(10))])
    assert result.pairs == [] and result.new == [0] and [s.id for s in result.missing] == [1]


@pytest.mark.parametrize(
    ("line", "cancelled"),
    [("Concert du 14 mars 2025 - annulé", True), ("Konzert am 14. März 2025 fällt aus", True),
     ("Concert on 14 March 2025 - CANCELLED", True), ("Concert on 14 March 2025, cancellation policy online", False),
     ("Concert on 14 March 2025", False)],
)  # fmt: skip
def test_cancelled_only_when_the_quote_says_it_is(line: str, cancelled: bool):
    written = next(p for p in ("14 mars 2025", "14. März 2025", "14 March 2025") if p in line)
    raw = [{"title": "Concert", "date": "2025-03-14", "date_text": written, "quote": line, "cancelled": True}]
    [event], _ = checked_events(raw, line, UTC)
    assert event.cancelled is cancelled
