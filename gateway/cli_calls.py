"""``pepper calls``: phone calls, the ones that came in and the ones Pepper placed, with their
receipts and each call's latency broken down; ``pepper replay-call`` runs a recorded call again on
this build's call engine and says where its behaviour differs (``voice.replay_call``).

pepper calls [list] [--account A] [--limit N]   recent calls, newest first
pepper calls show CALL                           one call: route, status, receipts of the calls Pepper
                                                 placed, latency broken down, its recording
pepper replay-call CALL [--show]

CALL is the call's CallSid or the id of its turn. ``replay-call`` exits 0 when the replay matches
the recording, 1 when it differs (each difference printed with where in the call it was) or when
there is nothing to replay. Nothing is stored or sent: no tool runs, no staged write is committed
or dropped, no model is reached.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

from core import identity
from core.errors import NotFound
from core.records import calls as call_records
from core.records import digits as digit_records
from core.records import outbound as records
from core.settings import Settings
from core.store import Database
from gateway.cli_turns import printable


def add_commands(subparsers: Any) -> None:
    calls = subparsers.add_parser("calls", help="phone calls, in and out, with receipts and latency")
    sub = calls.add_subparsers(dest="action", metavar="ACTION")
    listing = sub.add_parser("list", help="recent calls, newest first (the default)")
    listing.add_argument("--account", help="only this account (id or unique name)")
    listing.add_argument("--limit", type=int, default=20)
    show = sub.add_parser("show", help="one call: how it went, its receipts and its latency broken down")
    show.add_argument("call", metavar="CALL", help="the call's CallSid, or its turn id")
    replay = subparsers.add_parser(
        "replay-call", help="replay a recorded call on this build's call engine and show where it differs"
    )
    replay.add_argument("call", metavar="CALL", help="the call's CallSid, or its turn id")
    replay.add_argument("--show", action="store_true", help="also print the recording's outputs, one a line")


def _when(value: Any) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}" if value is not None else "-"


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command == "calls":
        if (getattr(args, "action", None) or "list") == "list":
            await _list(args, db, out)
        else:
            await _show(args, db, out)
        return True
    if args.command != "replay-call":
        return False
    from voice.replay_call import outputs_of, replay_call

    call_sid = await call_records.recorded_call_of(db, args.call)
    streams = await call_records.load_recordings(db, call_sid) if call_sid else []
    if call_sid is None or not streams:
        raise NotFound(f"no recorded call {args.call} (calls are recorded when voice_record_calls is on)")
    identical = True
    for n, stream in enumerate(streams, 1):
        # A call that ran on more than one media stream (back after a transfer, after keys
        # pressed) has a recording per stream: each is one engine's run, replayed on its own.
        part = f" stream {n} of {len(streams)} ({stream.stream_sid or 'one stream'})" if len(streams) > 1 else ""
        result = await replay_call(db, stream.entries, complete=stream.complete)
        state = "complete" if stream.complete else "INCOMPLETE (the call's process stopped before its end was written)"
        out(f"call {call_sid}{part}: recording {state}, {len(stream.entries)} entries")
        if args.show:
            for output, t_ms, _ in outputs_of(stream.entries):
                out(printable(f"  {t_ms:>9.1f} ms  {' '.join(str(x) for x in output)}"))
        out(f"outputs: recorded {result.recorded_outputs}, replay {result.replayed_outputs}")
        if result.identical:
            out("replay identical: this build does what the recorded call did")
        else:
            identical = False
            out(f"replay differs in {len(result.differences)} place(s):")
            for line in result.differences:
                out(printable(f"  {line}"))
    args.exit_code = 0 if identical else 1
    return True


async def _list(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    ref = getattr(args, "account", None)
    account_id = (await identity.get_account(db, ref)).id if ref else None
    rows = await records.recent(db, account_id, getattr(args, "limit", 20))
    if not rows:
        out("no calls")
    for r in rows:
        who = r["to_number"] if r["route"] == "outbound" else (r["caller"] or "unknown caller")
        receipt = f"  {r['outcome']}: {r['receipt']}" if r["receipt"] else ""
        out(f"{_when(r['started_at'])}  {r['route']:<9} {r['status']:<11} {who}  {r['call_sid'] or '-'}{receipt}")


async def _show(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    recorded = await call_records.call_row(db, args.call)  # by CallSid or turn id
    call_sid = recorded["call_sid"] if recorded is not None else args.call
    row = await records.call_row(db, call_sid)
    attempt = await records.by_sid(db, call_sid)
    if recorded is None and row is None and attempt is None:
        raise NotFound(f"no call {args.call}")
    if recorded is not None:
        out(f"call {call_sid}  route {recorded['route']}  status {recorded['status']}"
            f"  ended: {recorded['end_reason'] or '-'}")  # fmt: skip
    else:
        out(f"call {call_sid}")
    if row is not None:
        out(f"  from {row['caller'] or 'unknown'} on {row['line_number'] or '-'}")
        out(f"  started {_when(row['started_at'])}, ended {_when(row['ended_at'])}")
        if row["verified_by"]:
            out(f"  verified by {row['verified_by']}")
        if row["summary"]:
            out(printable(f"  summary: {row['summary']}"))
    if attempt is not None:
        task = f"task #{attempt['task_id']}" if attempt["task_id"] else attempt["purpose"]
        out(f"  placed by Pepper for {task} to {attempt['to_number']} from {attempt['from_number']}")
        for a in await records.attempts_like(db, attempt):
            answered = f", answered by {a['answered_by']}" if a["answered_by"] else ""
            out(f"  attempt {a['attempt']} ({a['call_sid'] or 'not placed'}): {a['status']}, "
                f"{a['outcome'] or 'pending'}{answered}: {a['receipt'] or '-'}")  # fmt: skip
    for press in await digit_records.for_call(db, call_sid):
        played = f"played {_when(press['played_at'])}" if press["played_at"] else "not played"
        out(f"  keys pressed by Pepper: {press['digits']}  (asked {_when(press['requested_at'])}, {played})")
    if recorded is None:
        return
    stats = recorded["stats"] if isinstance(recorded["stats"], dict) else json.loads(recorded["stats"] or "{}")
    out("latency (ms)                                   n   median      max")
    for key, label in call_records.LATENCY_PARTS:
        values = [float(v) for v in stats.get(key) or []]
        if values:
            out(f"  {label:<42} {len(values):>3} {statistics.median(values):>8.1f} {max(values):>8.1f}")
        else:
            out(f"  {label:<42}   0        -        -")
    counts = ", ".join(f"{k} {stats[k]}" for k in ("frames_in", "frames_to_model", "barge_ins", "fillers",
                                                    "model_reconnects") if k in stats)  # fmt: skip
    if counts:
        out(f"frames and events: {counts}")
    streams = await call_records.load_recordings(db, call_sid)
    state = "none" if not streams else ("complete" if all(r.complete for r in streams) else "incomplete")
    if len(streams) > 1:
        state += f", {len(streams)} media streams"
    out(f"recording for replay: {state}" + (f"  (pepper replay-call {call_sid})" if streams else ""))
