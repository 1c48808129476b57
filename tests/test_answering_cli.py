"""``pepper answering`` and the owner's rules: what the CLI saves, refuses and shows."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta

import pytest

from answering_service.rules import Rules, free_starts, parse_hours, rule_problem
from core.errors import InvalidInput
from core.tools.areas.calendar import Busy
from gateway.cli import main


def run_cli(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


def test_the_owner_sets_the_answering_rules_from_the_cli(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada", "--timezone", "Europe/London")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "answering", "show", "Ada")
    assert code == 0 and "booking:       off" in out and "notify by:     sms" in out
    code, out, err = run_cli(
        monkeypatch, capsys, "answering", "set", "Ada", "--greeting", "Hi, Ada's line.", "--booking", "on",
        "--type", "consultation=45", "--type", "call=15", "--hours", "mon-thu=09:00-12:00,fri=10:00-11:00",
        "--buffer", "5", "--notice", "240", "--horizon", "14", "--vip", "(415) 555-2671", "--block", "+14155559999",
        "--notify", "email",
    )  # fmt: skip
    assert code == 0, err
    assert "greeting:      Hi, Ada's line." in out and "consultation 45 min, call 15 min" in out
    assert "Mon 09:00-12:00" in out and "Fri 10:00-11:00" in out and "(Europe/London)" in out
    assert "VIP:           +14155552671" in out and "blocked:       +14155559999" in out
    assert "notify by:     email" in out
    code, out, _ = run_cli(monkeypatch, capsys, "answering", "set", "Ada", "--unvip", "+14155552671")
    assert "VIP:           (none)" in out and "booking:       on" in out  # the rest is kept
    code, _, err = run_cli(monkeypatch, capsys, "answering", "set", "Ada", "--hours", "mon=17:00-09:00")
    assert code != 0 and "the end must come after the start" in err
    code, _, err = run_cli(monkeypatch, capsys, "answering", "set", "Ada", "--buffer", "9999")
    assert code != 0 and "between 0 and 240" in err
    code, out, err = run_cli(
        monkeypatch, capsys, "answering", "set", "Ada", "--max-line-calls-per-hour", "12", "--max-texts-per-hour",
        "3", "--sms-countries", "gb, ie",
    )  # fmt: skip
    assert code == 0, err
    assert "12 calls per line per hour" in out and "3 per line per hour, to caller ID only, in GB, IE" in out
    code, _, err = run_cli(monkeypatch, capsys, "answering", "set", "Ada", "--sms-countries", "GB,XX")
    assert code != 0 and "'XX' is not a region code" in err
    code, out, _ = run_cli(monkeypatch, capsys, "answering", "set", "Ada", "--sms-countries", "default")
    assert "in PEPPER_DEFAULT_REGION's" in out
    code, out, _ = run_cli(monkeypatch, capsys, "answering", "calls", "Ada")
    assert code == 0 and "no answering calls" in out


def test_free_times_keep_hours_buffers_notice_and_horizon():
    rules = Rules(uuid.uuid4(), working_hours=parse_hours("mon-fri=09:00-12:00"), buffer_minutes=15,
                  min_notice_minutes=60, horizon_days=10)  # fmt: skip
    day = date(2030, 6, 3)  # a Monday
    now = datetime(2030, 6, 1, 8, tzinfo=UTC)
    busy = [Busy(datetime.combine(day, time(10), UTC), datetime.combine(day, time(10, 30), UTC))]
    starts = [f"{s:%H:%M}" for s in free_starts(rules, day, 30, busy, now)]
    # 09:30 would end at 10:00, inside the 15-minute buffer before 10:00; 10:45 is the first after.
    assert starts == ["09:00", "09:15", "10:45", "11:00", "11:15", "11:30"]
    assert free_starts(rules, date(2030, 6, 1), 30, [], now) == []  # Saturday
    late = datetime.combine(day, time(9), UTC)
    assert "too soon" in rule_problem(rules, late, late + timedelta(minutes=30), late - timedelta(minutes=30))
    assert "too far ahead" in rule_problem(rules, late, late + timedelta(minutes=30), late - timedelta(days=11))
    with pytest.raises(InvalidInput):
        parse_hours("funday=09:00-10:00")
