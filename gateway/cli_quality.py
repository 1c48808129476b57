"""``pepper quality`` and ``pepper detectors``: the quality loop from the command line.

pepper quality judge [--day DAY] [--account A]   grade now (default: each person's yesterday)
pepper quality issues [--all] [--case ID [--out FILE]]   the open quality issues; one's replay case
pepper quality report [--since WHEN]             grades per point per tier and model
pepper detectors list                            each detector's firings, precision and state
pepper detectors promote NAME                    the owner's one command to apply a promotable fix

The judge only writes grades and issues (``core.quality``); nothing here changes code or
configuration, and ``promote`` is the one way a detector starts changing replies.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from core import identity
from core.errors import InvalidInput, NotFound
from core.quality.cases import case_json, issue_case, list_issues
from core.quality.detectors import SUGGESTERS, all_detectors, detector_statuses, ensure_detectors, promote
from core.quality.jobs import grades_report, judge_now
from core.quality.points import POINTS
from core.settings import Settings
from core.store import Database
from gateway.cli_turns import parse_since


def _now() -> datetime:
    return datetime.now(UTC)


# Tests set this to a fixed instant.
clock: Callable[[], datetime] = _now


def add_commands(subparsers: Any) -> None:
    quality = subparsers.add_parser("quality", help="the nightly judge's grades and quality issues").add_subparsers(
        dest="action", required=True
    )
    judge = quality.add_parser("judge", help="grade a sample of a day's real turns now")
    judge.add_argument("--day", help="the local day to grade, YYYY-MM-DD (default: each person's yesterday)")
    judge.add_argument("--account", help="only this account (id or unique name)")
    issues = quality.add_parser("issues", help="the quality issues the judge opened")
    issues.add_argument("--all", action="store_true", help="closed ones too")
    issues.add_argument("--case", type=int, metavar="ID", help="print (or --out) this issue's replay case file")
    issues.add_argument("--out", metavar="FILE", help="with --case: write the case file here")
    report = quality.add_parser("report", help="grades per point per tier and model over a period")
    report.add_argument("--since", default="7d", metavar="WHEN", help="30m, 2h, 3d or 1w ago, or an ISO date (7d)")

    detectors = subparsers.add_parser("detectors", help="shadow detectors and their precision").add_subparsers(
        dest="action", required=True
    )
    detectors.add_parser("list", help="each detector's firings, precision and state")
    promoting = detectors.add_parser("promote", help="let a promotable detector apply its fix")
    promoting.add_argument("name", choices=sorted(all_detectors()))


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command == "quality":
        if args.action == "judge":
            await _judge(args, settings, db, out)
        elif args.action == "issues":
            await _issues(args, db, out)
        else:
            await _report(args, db, out)
        return True
    if args.command == "detectors":
        if args.action == "promote":
            await promote(db, args.name, clock())
            if args.name in SUGGESTERS:
                out(f"detector {args.name} promoted: its suggestions now show as cards")
            else:
                out(f"detector {args.name} promoted: it now applies its fix to replies")
        else:
            await _detectors(db, out)
        return True
    return False


async def _judge(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> None:
    from gateway import cli

    day: date | None = None
    if args.day:
        try:
            day = date.fromisoformat(args.day)
        except ValueError:
            raise InvalidInput(f"not a day for --day: {args.day!r} (write 2025-06-02)") from None
    account = await identity.get_account(db, args.account) if args.account else None
    report = await judge_now(
        db, cli.model_service_factory(settings), clock(), day=day, account_id=account.id if account else None
    )
    graded = sum(d.graded for d in report.days)
    refused = sum(d.refused for d in report.days)
    opened = [i for d in report.days for i in d.opened]
    tokens = sum(d.input_tokens + d.output_tokens for d in report.days)
    out(
        f"judged {report.done} day(s): {graded} turn(s) graded, {refused} answer(s) refused, "
        f"{sum(d.already for d in report.days)} graded before; {tokens} model tokens"
    )
    failing: dict[str, int] = {}
    for d in report.days:
        for point, n in d.failing.items():
            failing[point] = failing.get(point, 0) + n
    if failing:
        out("failing: " + ", ".join(f"{p} {failing[p]}" for p in POINTS if p in failing))
    if opened:
        out(f"opened quality issue(s): {', '.join(str(i) for i in opened)} (pepper quality issues)")
    for name, state in report.detectors.items():
        out(f"detector {name} is now {state}")


async def _issues(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    if args.case is not None:
        case = await issue_case(db, args.case)
        if case is None:
            raise NotFound(f"no quality issue {args.case}")
        text = case_json(case)
        if args.out:
            await asyncio.to_thread(Path(args.out).write_text, text, encoding="utf-8")
            out(f"wrote {args.out}; run it with: pepper replay --case {args.out}")
        else:
            out(text.rstrip("\n"))
        return
    if args.out:
        raise InvalidInput("--out needs --case ID")
    rows = await list_issues(db, include_closed=args.all)
    if not rows:
        out("no quality issues" if args.all else "no open quality issues")
        return
    for r in rows:
        out(
            f"#{r['id']} {r['status']} {r['point']} turn {r['turn_id']} ({r['name']}, "
            f"{r['created_at']:%Y-%m-%d}, seen {r['seen']}x)"
        )
        out(f"    why: {r['reason']}")
        out(f"    fix: {r['proposed_fix']}")
        out(f"    case: pepper quality issues --case {r['id']} --out case-{r['id']}.json")


async def _report(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    now = clock()
    since = parse_since(args.since, now=now, timezone="UTC")
    rows = await grades_report(db, since, now + timedelta(seconds=1))
    if not rows:
        out(f"no grades since {since:%Y-%m-%d %H:%M} UTC")
        return
    out(f"grades since {since:%Y-%m-%d %H:%M} UTC (pass/graded per point; n/a left out)")
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        entry = table.setdefault((r["tier"], r["model"]), {"turns": 0})
        entry[r["point"]] = (r["passed"], r["passed"] + r["failed"])
        entry["turns"] = max(entry["turns"], r["turns"])
    header = f"{'tier':<8} {'model':<24} {'turns':>5} " + " ".join(f"{p:>14}" for p in POINTS)
    out(header)
    for (tier, model), entry in table.items():
        cells = []
        for point in POINTS:
            passed, graded = entry.get(point, (0, 0))
            cells.append(f"{f'{passed}/{graded}' + (f' {passed / graded:.0%}' if graded else ''):>14}")
        out(f"{tier:<8} {model:<24} {entry['turns']:>5} " + " ".join(cells))


async def _detectors(db: Database, out: Callable[[str], None]) -> None:
    await ensure_detectors(db, clock())
    out(f"{'detector':<15} {'point':<13} {'state':<11} {'firings':>7} {'judged':>6} {'precision':>9}  trial began")
    for s in await detector_statuses(db):
        precision = f"{s.precision:.0%}" if s.precision is not None else "-"
        began = f"{s.trial_started_at:%Y-%m-%d}" if s.trial_started_at else "-"
        out(f"{s.name:<15} {s.point:<13} {s.state:<11} {s.firings:>7} {s.judged:>6} {precision:>9}  {began}")
