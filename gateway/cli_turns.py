"""``pepper turns``: find recorded turns and read one whole, from the command line.

pepper turns list [--account A] [--since WHEN] [--channel C] [--kind K] [--flagged] [--limit N]
pepper turns show ID

``show`` reads the record ``pepper replay`` starts from (``core.conversation.turn_record``) and the
turn's staged writes (``core.tools.staging.staged_for_turn``); tool results are printed as recorded,
untrusted ones included, with control characters escaped so a recorded result cannot drive the
terminal.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core import identity
from core.conversation import MESSAGE_CHANNELS, TURN_KINDS, turn_record
from core.errors import InvalidInput, NotFound
from core.models.records import attempt_usage
from core.records.turns import TurnFilter, list_turns, turn_account
from core.scheduling.schedule import to_utc, zone
from core.settings import Settings
from core.store import Database
from core.tools.staging import staged_for_turn

_RELATIVE = re.compile(r"^(\d+)\s*(m|min|h|d|w)$")
_UNITS = {"m": "minutes", "min": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Every C0/C1 control character but newline and tab: a recorded text may hold escape sequences.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def add_commands(subparsers: Any) -> None:
    turns = subparsers.add_parser("turns", help="recorded turns: find them, and read one whole").add_subparsers(
        dest="action", required=True
    )
    listing = turns.add_parser("list", help="one line per turn, newest first")
    listing.add_argument("--account", help="only this account (id or unique name)")
    listing.add_argument(
        "--since", metavar="WHEN", help="30m, 2h, 3d or 1w ago, or an ISO date or time (in --account's zone, else UTC)"
    )
    listing.add_argument("--channel", choices=MESSAGE_CHANNELS)
    listing.add_argument("--kind", choices=TURN_KINDS)
    listing.add_argument("--flagged", action="store_true", help="only turns with a flag (capped, failed, ...)")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most this many turns (default 50)")
    show = turns.add_parser("show", help="a turn's prompt, rounds, tool calls, reply and writes")
    show.add_argument("turn", metavar="ID", help="the turn id")


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command != "turns":
        return False
    if args.action == "list":
        await _list(args, db, out)
    else:
        await _show(args.turn, db, out)
    return True


def parse_since(text: str, *, now: datetime, timezone: str) -> datetime:
    """``2h`` / ``3d`` before ``now``, or an ISO date or date and time; a time without an offset is
    read in ``timezone``, a date alone is its midnight there."""
    raw = text.strip().lower()
    found = _RELATIVE.match(raw)
    if found:
        return now - timedelta(**{_UNITS[found[2]]: int(found[1])})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(
            f"not a time for --since: {text!r} (write 2h, 3d, 1w, 2025-06-02 or 2025-06-02T09:00)"
        ) from None
    return to_utc(moment, zone(timezone)) if moment.tzinfo is None else moment.astimezone(UTC)


async def _list(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    if args.limit < 1:
        raise InvalidInput("--limit must be at least 1")
    account = await identity.get_account(db, args.account) if args.account else None
    since = None
    if args.since is not None:
        since = parse_since(args.since, now=datetime.now(UTC), timezone=account.timezone if account else "UTC")
    rows = await list_turns(
        db,
        TurnFilter(
            account_id=account.id if account else None,
            since=since,
            channel=args.channel,
            kind=args.kind,
            flagged=args.flagged,
            limit=args.limit,
        ),
    )
    if not rows:
        out("no turns")
        return
    out(f"{'turn':<36}  {'time':<20}  {'account':<12}  {'channel':<9}  {'kind':<9}  "
        f"{'model':<16}  rounds  tokens in/out  flags")  # fmt: skip
    for r in rows:
        when = f"{r['started_at'].astimezone(ZoneInfo(r['timezone'])):%Y-%m-%d %H:%M %Z}"
        tokens = f"{r['input_tokens'] or 0}/{r['output_tokens'] or 0}"
        flags = ", ".join(r["flags"]) or "-"
        rounds = "-" if r["rounds"] is None else str(r["rounds"])
        out(f"{r['id']}  {when:<20}  {_clip(r['account_name'], 12):<12}  {r['channel']:<9}  {r['kind']:<9}  "
            f"{_clip(r['model'] or '-', 16):<16}  {rounds:>6}  {tokens:>13}  {flags}")  # fmt: skip


async def _show(ref: str, db: Database, out: Callable[[str], None]) -> None:
    try:
        turn_id = UUID(ref)
    except ValueError:
        raise InvalidInput(f"not a turn id: {ref!r}") from None
    row = await turn_record(db, turn_id)
    if row is None:
        raise NotFound(f"no turn {turn_id}")
    owner = await turn_account(db, turn_id)
    tz = ZoneInfo(owner["timezone"])

    def at(moment: datetime | None) -> str:
        return f"{moment.astimezone(tz):%Y-%m-%d %H:%M:%S %Z}" if moment else "-"

    usage = _json(row["usage"]) or {}
    timings = _json(row["timings"]) or {}
    out(f"turn {turn_id}" + (f" (replay of {row['replay_of']})" if row["replay_of"] else ""))
    out(f"  account {owner['name']}  channel {row['channel']}  kind {row['kind']}  status {row['status']}")
    out(f"  started {at(row['started_at'])}  finished {at(row['finished_at'])}  delivered {at(row['delivered_at'])}")
    tokens = (
        f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out"
        f" (cached {usage.get('cached_input_tokens', 0)})"
        if usage
        else "not recorded"
    )
    out(f"  model {row['model'] or '-'}  tier {row['tier'] or '-'}  tokens {tokens}")
    if timings:
        out(f"  time {timings.get('total_ms', 0):.0f} ms, model {timings.get('model_ms', 0):.0f} ms")
    out(f"  flags: {', '.join(owner['flags']) or 'none'}")
    if row["error"]:
        out(f"  error: {row['error']}")
    delivery = {k: v for k, v in (_json(row["delivery"]) or {}).items() if k != "stats"}  # a call's stats: long
    if delivery:
        out(f"  delivery: {printable(json.dumps(delivery, ensure_ascii=False, sort_keys=True))}")
    _prompt(_json(row["whole_prompt"]), out)
    recorded_calls = _json(row["tool_calls"]) or []
    calls = {c["id"]: c for c in recorded_calls}
    rounds = _json(row["rounds"]) or []
    if rounds and "role" in rounds[0]:  # a call's record: what was said, not model rounds
        _transcript(rounds, recorded_calls, out)
    else:
        for record in rounds:
            _round(record, calls, out, indent="")
    skills = _json(row["skills"]) or {}
    for worker in skills.get("workers", []):
        out(f"worker {worker['skill']} (run {worker.get('run', 1)}, call {worker.get('call_id')}):"
            f" {worker.get('status')}, tier {worker.get('tier')}")  # fmt: skip
        for record in worker.get("rounds", []):
            _round(record, calls, out, indent="  ")
        out(f"  report: {printable(worker.get('report') or '')}")
    out("reply:")
    out(_indented(row["reply"] or "(none)", "  "))
    _writes(await staged_for_turn(db, turn_id), out)


def _prompt(prompt: dict[str, Any] | None, out: Callable[[str], None]) -> None:
    out("prompt:")
    if not prompt:
        out("  (not recorded)")
        return
    if "system_stable" in prompt:
        stable, tools = prompt["system_stable"], prompt.get("tools")
        # A part the record names but prompt_parts lacks comes back null (``turn_prompt``): say so.
        out(f"  stable prefix: {'missing from prompt_parts' if stable is None else f'{len(stable)} characters'}; "
            + ("tools missing from prompt_parts" if tools is None else f"{len(tools)} tools offered"))  # fmt: skip
    if "notice" in prompt:  # a call's record: its prompt is the opening notice
        out(f"  opening notice: {len(prompt['notice'] or '')} characters:")
        out(_indented(prompt["notice"] or "", "    "))
        return
    memory = prompt.get("system_dynamic") or ""
    out(f"  memory block: {len(memory)} characters" + (":" if memory else ""))
    if memory:
        out(_indented(memory, "    "))
    messages = prompt.get("messages") or []
    out("  newest message:")
    out(_indented(messages[-1].get("content", "") if messages else "(none)", "    "))


def _failed_attempt(attempt: Any) -> str:
    """A failed call of a round: which, why, and what its provider reported it used (charged)."""
    if not isinstance(attempt, dict):
        return "failed first: (unreadable)"
    why = str(attempt.get("error") or "failed") + (f" {attempt['status']}" if attempt.get("status") else "")
    used = attempt_usage(attempt)
    charged = f"charged {used[0]} in / {used[1]} out" if any(used) else "nothing charged"
    return f"failed first: {attempt.get('model') or attempt.get('provider') or '-'} ({why}; {charged})"


def _round(record: dict[str, Any], calls: dict[str, Any], out: Callable[[str], None], *, indent: str) -> None:
    response = record.get("response") or {}
    tokens = response.get("usage") or [0, 0]
    notes = [f"tier {record['tier']}"] if record.get("tier") else []
    if record.get("counted") is False:
        notes.append("not counted")
    if record.get("wasted"):
        notes.append("wasted")
    if record.get("cap"):
        notes.append(f"cap: {record['cap']}")
    if record.get("error"):
        notes.append(f"error: {record['error']}")
    if record.get("interrupted"):
        notes.append("stream cut part way, asked again")
    if record.get("purpose") == "repair":
        out(f"{indent}round {record.get('n')} repair: {'changed' if record.get('changed') else 'unchanged'}"
            f" ({record.get('verdict')})")  # fmt: skip
        return
    out(f"{indent}round {record.get('n')} {record.get('purpose', 'turn')}: {response.get('model') or '-'}"
        f"  tokens {tokens[0]} in / {tokens[1]} out" + (f"  ({', '.join(notes)})" if notes else ""))  # fmt: skip
    for attempt in record.get("failed_attempts") or []:
        out(f"{indent}  {_failed_attempt(attempt)}")
    for asked in response.get("tool_calls") or []:
        _call(asked.get("name"), asked.get("arguments"), calls.get(asked.get("id"), {}), out, indent=f"{indent}  ")
    if response.get("text"):
        out(f"{indent}  text:")
        out(_indented(response["text"], f"{indent}    "))


def _call(name: str, arguments: Any, call: dict[str, Any], out: Callable[[str], None], *, indent: str) -> None:
    """One tool call as the model asked for it, and what the record says came of it."""
    asked = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    out(f"{indent}call {name} {printable(asked)} -> {call.get('status', 'no result recorded')}")
    if "gated_arguments" in call:
        out(f"{indent}  ran with {printable(json.dumps(call['gated_arguments'], ensure_ascii=False, sort_keys=True))}")
    for step in (call.get("gate") or {}).get("steps", []):
        if step.get("action") != "allow":  # every call is checked; only a refusal or a change tells
            why = step.get("reason") or step.get("error") or ""
            out(f"{indent}  gate {step.get('policy')}: {step.get('action')}" + (f": {printable(why)}" if why else ""))
    if "content" in call:
        out(_indented(call["content"], f"{indent}  "))


def _transcript(entries: list[dict[str, Any]], calls: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    out("transcript:")
    for entry in entries:
        if entry.get("role") == "tool":  # the calls follow in full
            continue
        said = entry.get("text", entry.get("event", ""))
        note = " (interrupted)" if entry.get("interrupted") else ""
        out(f"  +{(entry.get('at_ms') or 0) / 1000:.1f}s {entry.get('role')}: {printable(str(said))}{note}")
    if calls:
        out("tool calls:")
    for call in calls:
        _call(call.get("name", "?"), call.get("arguments"), call, out, indent="  ")


def _writes(writes: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    out("writes:")
    if not writes:
        out("  none staged")
    for w in writes:
        out(f"  {w['status']:<9} #{w['id']} {w['tool']}: {printable(w['summary'])}")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def printable(value: str) -> str:
    """A recorded text with its control characters escaped, safe to print to a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", value)


def _indented(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in printable(text).splitlines() or [""])


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
