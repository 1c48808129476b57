"""``pepper tasks``: scheduled tasks and their receipts, from the command line.

pepper tasks [list] [--account A] [--all]   tasks and their recent receipts
pepper tasks add ACCOUNT TITLE --schedule S --prompt P [--to chat,sms,call,room:ROOM] [--call-number N] [--reminder]
pepper tasks call-number ID NUMBER|none [--digits D]   the number a task's calls go to (approved by you)
pepper tasks remove ID [ID ...]
pepper tasks place ACCOUNT LAT LON [--label L]   where sunrise and sunset are computed
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from core import identity
from core.errors import InvalidInput, NotFound
from core.records.outbound import attempts_of_run, set_call_digits, set_call_number
from core.scheduling.runs import recent_receipts
from core.scheduling.schedule import SCHEDULE_HELP, Place, parse_schedule
from core.scheduling.tasks import account_timezone, cancel_tasks, create_task, get_task, list_tasks, set_owner_place
from core.settings import Settings
from core.store import Database
from core.store.queries import Queries


def add_commands(subparsers: Any) -> None:
    tasks = subparsers.add_parser("tasks", help="scheduled tasks and their receipts")
    tasks.add_argument("--account", help="only this account (id or unique name)")
    tasks.add_argument("--all", action="store_true", help="include done and cancelled tasks")
    sub = tasks.add_subparsers(dest="action", metavar="ACTION")
    listing = sub.add_parser("list", help="tasks and their recent receipts (the default)")
    listing.add_argument("--account", dest="account_filter", help="only this account")
    listing.add_argument("--all", dest="all_filter", action="store_true")
    add = sub.add_parser("add", help="schedule a task", description=SCHEDULE_HELP)
    add.add_argument("account", help="account id or unique name")
    add.add_argument("title")
    add.add_argument("--schedule", required=True, help="e.g. 'weekdays at 07:30', 'sunset', 'cron 0 8 * * 1'")
    add.add_argument("--prompt", required=True, help="what Pepper does at each run")
    add.add_argument(
        "--to", default="", help="comma-separated: chat, sms, whatsapp, email, call, room:ROOM (default: usual)"
    )
    add.add_argument("--call-number", help="for --to call: a number other than the owner's own, approved by you")
    add.add_argument("--reminder", action="store_true", help="a one-shot reminder")
    number = sub.add_parser("call-number", help="approve the number a task's calls go to ('none': the owner's own)")
    number.add_argument("task_id", type=int)
    number.add_argument("number")
    number.add_argument("--digits", help="keys pressed once the call connects (a menu or extension): 0-9 * # w")
    remove = sub.add_parser("remove", help="cancel tasks by number")
    remove.add_argument("ids", nargs="+", type=int)
    place = sub.add_parser("place", help="set where an account's sunrise and sunset are computed")
    place.add_argument("account")
    place.add_argument("latitude", type=float)
    place.add_argument("longitude", type=float)
    place.add_argument("--label")


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command != "tasks":
        return False
    now = datetime.now(UTC)
    action = args.action or "list"
    if action == "list":
        ref = getattr(args, "account_filter", None) or args.account
        account_id = (await identity.get_account(db, ref)).id if ref else None
        await _list(db, account_id, args.all or getattr(args, "all_filter", False), out)
    elif action == "add":
        account = await identity.get_account(db, args.account)
        zone = await account_timezone(db, account.id)
        schedule = parse_schedule(args.schedule, now=now, timezone=zone)
        if args.reminder and not schedule.one_shot:
            raise InvalidInput(
                "a reminder happens once: give a time like 'in 20 minutes' or 'once at 2025-06-02 09:00'"
            )
        channels = [c for c in args.to.split(",") if c.strip()]
        async with db.transaction() as conn:
            task = await create_task(
                conn, account.id, title=args.title, prompt=args.prompt, schedule=schedule, now=now,
                kind="reminder" if args.reminder else "task", deliver_to=channels,
                call_number=_number(args.call_number, settings), call_approved=True,
            )  # fmt: skip
        first = task.next_run_at.astimezone(ZoneInfo(zone)) if task.next_run_at else None
        out(f"scheduled {task.describe()}; first run {first:%a %d %b %Y %H:%M} ({zone})")
    elif action == "call-number":
        task = await get_task(db, args.task_id)
        number = None if args.number.strip().lower() == "none" else _number(args.number, settings)
        await set_call_number(db, task.id, number, approved=number is not None)
        if args.digits is not None:
            if not re.fullmatch(r"[0-9*#wW]{0,32}", args.digits):
                raise InvalidInput("digits are 0-9, *, # and w (a half-second wait), at most 32")
            await set_call_digits(db, task.id, args.digits or None)
        out(f"task #{task.id} calls {number or 'the owner' + chr(39) + 's verified number'}")
    elif action == "remove":
        async with db.transaction() as conn:
            done = await cancel_tasks(conn, None, args.ids, now=now)
        missing = sorted(set(args.ids) - set(done))
        for task_id in done:
            out(f"cancelled task #{task_id}")
        if missing:
            raise NotFound(f"no active task #{missing[0]}" + (" (others were cancelled)" if done else ""))
    elif action == "place":
        account = await identity.get_account(db, args.account)
        await set_owner_place(db, account.id, Place(args.latitude, args.longitude), args.label)
        out(f"{account.name}'s place is now {args.latitude:.4f},{args.longitude:.4f}")
    return True


def _number(raw: str | None, settings: Settings) -> str | None:
    return identity.normalize_phone(raw, settings.default_region) if raw else None


async def _list(db: Queries, account_id: Any, include_inactive: bool, out: Callable[[str], None]) -> None:
    tasks = await list_tasks(db, account_id, include_inactive=include_inactive)
    if not tasks:
        out("no scheduled tasks")
        return
    names = {a.id: a.name for a in await identity.list_accounts(db)}
    zones = {a.id: a.timezone for a in await identity.list_accounts(db)}
    for task in tasks:
        zone = ZoneInfo(task.timezone or zones.get(task.account_id, "UTC"))
        nxt = f"next {task.next_run_at.astimezone(zone):%a %d %b %H:%M}" if task.next_run_at else task.status
        out(f"{task.describe()}  [{names.get(task.account_id, task.account_id)}; {task.kind}; {nxt}]")
        for r in await recent_receipts(db, task.id):
            why = f"  ({r['reason']})" if r["reason"] else ""
            tries = f"  attempts {r['attempts']}" if r["attempts"] > 1 else ""
            out(f"    {r['occurrence_at'].astimezone(zone):%Y-%m-%d %H:%M}  {r['status']:<7}{why}{tries}")
            for call in await attempts_of_run(db, r["id"]):
                out(f"      call attempt {call['attempt']} to {call['to_number']}: {call['outcome'] or call['status']}"
                    f" ({call['receipt'] or 'ringing'})")  # fmt: skip
