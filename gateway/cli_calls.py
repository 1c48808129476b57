"""``pepper calls``: phone calls, the ones that came in and the ones Pepper placed, with receipts.

pepper calls [list] [--account A] [--limit N]   recent calls, newest first
pepper calls show CALL_SID                       one call: its route, status, and every attempt's receipt
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from core import identity
from core.errors import NotFound
from core.records import outbound as records
from core.settings import Settings
from core.store import Database


def add_commands(subparsers: Any) -> None:
    calls = subparsers.add_parser("calls", help="phone calls, in and out, with their receipts")
    sub = calls.add_subparsers(dest="action", metavar="ACTION")
    listing = sub.add_parser("list", help="recent calls, newest first (the default)")
    listing.add_argument("--account", help="only this account (id or unique name)")
    listing.add_argument("--limit", type=int, default=20)
    show = sub.add_parser("show", help="one call and the receipts of the calls Pepper placed")
    show.add_argument("call_sid")


def _when(value: Any) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}" if value is not None else "-"


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command != "calls":
        return False
    action = getattr(args, "action", None) or "list"
    if action == "list":
        ref = getattr(args, "account", None)
        account_id = (await identity.get_account(db, ref)).id if ref else None
        rows = await records.recent(db, account_id, getattr(args, "limit", 20))
        if not rows:
            out("no calls")
        for r in rows:
            who = r["to_number"] if r["route"] == "outbound" else (r["caller"] or "unknown caller")
            receipt = f"  {r['outcome']}: {r['receipt']}" if r["receipt"] else ""
            out(f"{_when(r['started_at'])}  {r['route']:<9} {r['status']:<11} {who}  {r['call_sid'] or '-'}{receipt}")
        return True
    row = await records.call_row(db, args.call_sid)
    attempt = await records.by_sid(db, args.call_sid)
    if row is None and attempt is None:
        raise NotFound(f"no call {args.call_sid}")
    out(f"call {args.call_sid}")
    if row is not None:
        out(
            f"  route {row['route']}, status {row['status']}, from {row['caller'] or 'unknown'} on {row['line_number']}"
        )
        ended = f"ended {_when(row['ended_at'])}, end reason {row['end_reason'] or '-'}"
        out(f"  started {_when(row['started_at'])}, {ended}")
        if row["verified_by"]:
            out(f"  verified by {row['verified_by']}")
        if row["summary"]:
            out(f"  summary: {row['summary']}")
    if attempt is not None:
        task = f"task #{attempt['task_id']}" if attempt["task_id"] else attempt["purpose"]
        out(f"  placed by Pepper for {task} to {attempt['to_number']} from {attempt['from_number']}")
        siblings = await records.attempts_like(db, attempt)
        for a in siblings:
            answered = f", answered by {a['answered_by']}" if a["answered_by"] else ""
            out(f"  attempt {a['attempt']} ({a['call_sid'] or 'not placed'}): {a['status']}, "
                f"{a['outcome'] or 'pending'}{answered}: {a['receipt'] or '-'}")  # fmt: skip
    return True
