"""``pepper calls show`` (one call's record, with its latency broken down) and ``pepper
replay-call`` (run a recorded call again on this build's call engine and say where its behaviour
differs, ``voice.replay_call``).

pepper calls show CALL
pepper replay-call CALL [--show]

CALL is the call's CallSid or the id of its turn. The exit status is 0 when the replay matches
the recording, 1 when it differs (each difference printed with where in the call it was) or when
there is nothing to replay. Nothing is stored or sent: no tool runs, no staged write is
committed or dropped, no model is reached.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

from core.errors import NotFound
from core.records import calls as call_records
from core.settings import Settings
from core.store import Database
from gateway.cli_turns import printable


def add_commands(subparsers: Any) -> None:
    calls = subparsers.add_parser("calls", help="phone and browser calls as recorded").add_subparsers(
        dest="action", required=True
    )
    show = calls.add_parser("show", help="one call: how it went and its latency broken down")
    show.add_argument("call", metavar="CALL", help="the call's CallSid, or its turn id")
    replay = subparsers.add_parser(
        "replay-call", help="replay a recorded call on this build's call engine and show where it differs"
    )
    replay.add_argument("call", metavar="CALL", help="the call's CallSid, or its turn id")
    replay.add_argument("--show", action="store_true", help="also print the recording's outputs, one a line")


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command == "calls":
        await _show(args, db, out)
        return True
    if args.command != "replay-call":
        return False
    from voice.replay_call import outputs_of, replay_call

    call_sid = await call_records.recorded_call_of(db, args.call)
    loaded = await call_records.load_recording(db, call_sid) if call_sid else None
    if call_sid is None or loaded is None:
        raise NotFound(f"no recorded call {args.call} (calls are recorded when voice_record_calls is on)")
    entries, complete = loaded
    result = await replay_call(db, entries, complete=complete)
    state = "complete" if complete else "INCOMPLETE (the call's process stopped before its end was written)"
    out(f"call {call_sid}: recording {state}, {len(entries)} entries")
    if args.show:
        for output, t_ms, _ in outputs_of(entries):
            out(printable(f"  {t_ms:>9.1f} ms  {' '.join(str(x) for x in output)}"))
    out(f"outputs: recorded {result.recorded_outputs}, replay {result.replayed_outputs}")
    if result.identical:
        out("replay identical: this build does what the recorded call did")
    else:
        out(f"replay differs in {len(result.differences)} place(s):")
        for line in result.differences:
            out(printable(f"  {line}"))
    args.exit_code = 0 if result.identical else 1
    return True


async def _show(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    row = await call_records.call_row(db, args.call)
    if row is None:
        raise NotFound(f"no call {args.call}")
    stats = row["stats"] if isinstance(row["stats"], dict) else json.loads(row["stats"] or "{}")
    out(f"call {row['call_sid']}  route {row['route']}  status {row['status']}  ended: {row['end_reason'] or '-'}")
    out(f"started {row['started_at']:%Y-%m-%d %H:%M:%S %Z}  line {row['line_number'] or '-'}"
        f"  verified by {row['verified_by'] or '-'}  turn {row['turn_id'] or '-'}")  # fmt: skip
    if row["summary"]:
        out(printable(f"summary: {row['summary']}"))
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
    loaded = await call_records.load_recording(db, row["call_sid"])
    state = "none" if loaded is None else ("complete" if loaded[1] else "incomplete")
    out(f"recording for replay: {state}" + ("  (pepper replay-call " + row["call_sid"] + ")" if loaded else ""))
