"""``pepper answering``: the owner's rules for the answering service, and what callers left.

pepper answering show ACCOUNT
pepper answering set ACCOUNT [--greeting T] [--caller-info T] [--booking on|off] [--type NAME=MIN ...]
                             [--hours mon-fri=09:00-17:00,...] [--buffer MIN] [--notice MIN] [--horizon DAYS]
                             [--vip NUMBER ...] [--unvip NUMBER ...] [--block NUMBER ...] [--unblock NUMBER ...]
                             [--notify sms|email|web] [--invitations on|off] [--transfer on|off]
                             [--max-calls-per-hour N]
pepper answering calls ACCOUNT       recent answering calls, messages and bookings
pepper answering transcript CALL_SID
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from answering_service.rules import CHANNELS, Rules, load_rules, parse_countries, parse_hours, parse_type, save_rules
from core import identity
from core.errors import InvalidInput, NotFound
from core.records import answering, answering_bookings
from core.records import calls as call_records
from core.settings import Settings
from core.store.queries import Queries


def add_commands(subparsers: Any) -> None:
    top = subparsers.add_parser("answering", help="the answering service: rules for callers, messages, bookings")
    sub = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="an account's answering-service settings")
    show.add_argument("account")
    s = sub.add_parser("set", help="change an account's answering-service settings")
    s.add_argument("account")
    s.add_argument("--greeting", help="what callers hear first")
    s.add_argument("--caller-info", help="what callers may be told (hours, address...)")
    s.add_argument("--booking", choices=("on", "off"))
    s.add_argument("--type", action="append", default=[], metavar="NAME=MIN",
                   help="appointment type and minutes; repeat; replaces the list")  # fmt: skip
    s.add_argument("--hours", help="e.g. mon-fri=09:00-17:00,sat=10:00-12:00 ('none' for no hours)")
    s.add_argument("--buffer", type=int, help="minutes kept free before and after busy time")
    s.add_argument("--notice", type=int, help="minimum notice in minutes")
    s.add_argument("--horizon", type=int, help="how many days ahead callers may book")
    s.add_argument("--vip", action="append", default=[], metavar="NUMBER")
    s.add_argument("--unvip", action="append", default=[], metavar="NUMBER")
    s.add_argument("--block", action="append", default=[], metavar="NUMBER")
    s.add_argument("--unblock", action="append", default=[], metavar="NUMBER")
    s.add_argument("--notify", choices=CHANNELS, help="where messages from callers reach you")
    s.add_argument("--invitations", choices=("on", "off"), help="send calendar invitations to callers who book")
    s.add_argument("--transfer", choices=("on", "off"), help="let callers who ask be put through to your phone")
    s.add_argument(
        "--max-calls-per-hour",
        type=int,
        dest="max_calls",
        help="calls per caller ID per hour (every withheld number counts as one caller)",
    )
    s.add_argument("--max-line-calls-per-hour", type=int, dest="max_line_calls", help="calls per line per hour")
    s.add_argument(
        "--max-texts-per-hour",
        type=int,
        dest="max_texts",
        help="confirmation texts to callers per line per hour (0: none)",
    )
    s.add_argument(
        "--sms-countries",
        metavar="CC,CC",
        help="countries callers' texts may go to, e.g. GB,IE ('default': PEPPER_DEFAULT_REGION's)",
    )
    calls = sub.add_parser("calls", help="recent answering calls with their messages and bookings")
    calls.add_argument("account")
    t = sub.add_parser("transcript", help="one answering call's transcript")
    t.add_argument("call_sid")


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command != "answering":
        return False
    if args.action == "transcript":
        await _transcript(db, args.call_sid, out)
        return True
    account = await identity.get_account(db, args.account)
    rules = await load_rules(db, account.id)
    if args.action == "set":
        rules = _changed(rules, args, settings.default_region)
        await save_rules(db, rules)
        out(f"answering settings saved for {account.name}")
    if args.action in ("show", "set"):
        _show(rules, out)
    elif args.action == "calls":
        await _calls(db, account.id, rules, out)
    return True


def _numbers(raw: list[str], region: str) -> list[str]:
    return [identity.normalize_phone(n, region) for n in raw]


def _changed(rules: Rules, args: argparse.Namespace, region: str) -> Rules:
    changes: dict[str, Any] = {}
    for field, value in (("greeting", args.greeting), ("caller_info", args.caller_info)):
        if value is not None:
            if len(value) > 2000:
                raise InvalidInput(f"the {field.replace('_', ' ')} is longer than 2000 characters")
            changes[field] = value.strip()
    if args.booking is not None:
        changes["booking_enabled"] = args.booking == "on"
    if args.invitations is not None:
        changes["send_invitations"] = args.invitations == "on"
    if getattr(args, "transfer", None) is not None:
        changes["transfer_enabled"] = args.transfer == "on"
    if args.type:
        types = tuple(parse_type(t) for t in args.type)
        if len({t.name.lower() for t in types}) != len(types):
            raise InvalidInput("two appointment types have the same name")
        changes["appointment_types"] = types
    if args.hours is not None:
        changes["working_hours"] = parse_hours(args.hours)
    for field, value, low, high in (("buffer_minutes", args.buffer, 0, 240), ("min_notice_minutes", args.notice, 0,
                                    43200), ("horizon_days", args.horizon, 1, 365), ("max_calls_per_hour",
                                    args.max_calls, 1, 1000), ("max_line_calls_per_hour",
                                    args.max_line_calls, 1, 10000), ("max_texts_per_hour", args.max_texts, 0,
                                    10000)):  # fmt: skip
        if value is not None:
            if not low <= value <= high:
                raise InvalidInput(f"{field.replace('_', ' ')} must be between {low} and {high}")
            changes[field] = value
    if args.notify is not None:
        changes["notify_channel"] = args.notify
    if args.sms_countries is not None:
        changes["sms_countries"] = parse_countries(args.sms_countries)
    vip = [n for n in rules.vip_numbers if n not in _numbers(args.unvip, region)]
    vip += [n for n in _numbers(args.vip, region) if n not in vip]
    blocked = [n for n in rules.blocked_numbers if n not in _numbers(args.unblock, region)]
    blocked += [n for n in _numbers(args.block, region) if n not in blocked]
    changes["vip_numbers"], changes["blocked_numbers"] = tuple(vip), tuple(blocked)
    return dataclasses.replace(rules, **changes)


def _show(rules: Rules, out: Callable[[str], None]) -> None:
    out(f"greeting:      {rules.greeting}")
    out(f"caller info:   {rules.caller_info or '(none)'}")
    out(f"booking:       {'on' if rules.booking_enabled else 'off'}")
    out("types:         " + ", ".join(f"{t.name} {t.minutes} min" for t in rules.appointment_types))
    out(f"hours:         {rules.hours_text()} ({rules.timezone})")
    out(f"buffer:        {rules.buffer_minutes} min; notice {rules.min_notice_minutes} min;"
        f" up to {rules.horizon_days} days ahead")  # fmt: skip
    out(f"notify by:     {rules.notify_channel}; invitations {'on' if rules.send_invitations else 'off'}")
    out(f"put through:   {'on' if rules.transfer_enabled else 'off'} (callers who ask are put through to you)")
    out(f"VIP:           {', '.join(rules.vip_numbers) or '(none)'}")
    out(f"blocked:       {', '.join(rules.blocked_numbers) or '(none)'}")
    out(f"rate limit:    {rules.max_calls_per_hour} calls per number per hour (withheld numbers share one);"
        f" {rules.max_line_calls_per_hour} calls per line per hour")  # fmt: skip
    countries = ", ".join(rules.sms_countries) or "PEPPER_DEFAULT_REGION's"
    out(f"caller texts:  {rules.max_texts_per_hour} per line per hour, to caller ID only, in {countries}")


async def _calls(db: Queries, account_id: Any, rules: Rules, out: Callable[[str], None]) -> None:
    rows = await answering.recent_calls(db, account_id, limit=20)
    if not rows:
        out("no answering calls")
    for row in rows:
        when = row["started_at"].astimezone(rules.zone)
        out(
            f"{when:%Y-%m-%d %H:%M}  {row['call_sid']}  {row['caller'] or 'unknown'}"
            f"  {row['end_reason'] or 'in progress'}"
        )
        message = await answering.message_of(db, row["call_sid"])
        if message is not None:
            out(f"    message ({message['urgency']}) from {message['caller_name']!r}, call back"
                f" {message['callback_number']}: {message['reason']!r}")  # fmt: skip
            signals = []
            if row["line_type"] is not None:
                signals.append(f"line type {row['line_type'] or 'unknown'}")
            if row["caller_name_lookup"]:
                signals.append(f"registered name {row['caller_name_lookup']!r}")
            if verstat := await call_records.verstat(db, row["call_sid"]):
                signals.append(f"STIR/SHAKEN {verstat}")
            if signals:
                out(f"    caller signals (Twilio): {', '.join(signals)}")
        for b in await answering_bookings.bookings_of(db, row["call_sid"]):
            out(f"    {b['status']} {b['appointment_type']} {b['starts_at'].astimezone(rules.zone):%a %d %b %H:%M}")


async def _transcript(db: Queries, call_sid: str, out: Callable[[str], None]) -> None:
    row = await answering.call_transcript(db, call_sid)
    if row is None:
        raise NotFound(f"no answering call {call_sid}")
    out(row["summary"] or "(in progress)")
    lines = json.loads(row["transcript"]) if isinstance(row["transcript"], str) else row["transcript"]
    for line in lines:
        out(f"{'Caller' if line.get('role') == 'caller' else 'Pepper'}: {line.get('text', '')}")
