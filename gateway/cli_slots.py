"""``pepper slot``, ``pepper plugin``, ``pepper household`` and ``pepper sandbox``.

pepper slot list                                  every slot, its occupant, its default, fallbacks
pepper slot set SLOT NAME [--household H | --account A]
pepper slot clear SLOT [--household H | --account A]
pepper plugin list                                installed plugins (entry points in pepper.plugins)
pepper plugin install PATH|PACKAGE                pip-installs it into Pepper's environment
pepper household create NAME | list | add NAME ACCOUNT | remove ACCOUNT | delete NAME
pepper sandbox run PROGRAM [ARG ...]              runs it through the sandbox slot
pepper breaker list | reset [KEY]                 what the circuit breaker paused (core.usage.breaker)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from core import identity
from core.errors import InvalidInput
from core.settings import Settings
from core.slots import BUILTIN, SLOT_NAMES, SlotRegistry
from core.slots.catalog import registry
from core.slots.settings import (
    clear_slot,
    create_household,
    delete_household,
    fallback_counts,
    get_household,
    join_household,
    list_households,
    set_slot,
    slot_settings,
    stale_settings,
)
from core.store import Database
from core.store.queries import Queries


def slots() -> SlotRegistry:
    import text_loop.harness  # noqa: F401  (registers the harness slot, which lives above core)

    return registry()


def add_commands(subparsers: Any) -> None:
    slot = subparsers.add_parser("slot", help="which plugin occupies each slot").add_subparsers(
        dest="action", required=True
    )
    slot.add_parser("list", help="every slot, its occupant, its default and its fallbacks")
    for action, what in (("set", "pin a slot to an installed plugin"), ("clear", "revert a slot to the default")):
        parser = slot.add_parser(action, help=what)
        parser.add_argument("slot", choices=SLOT_NAMES)
        if action == "set":
            parser.add_argument("name", help=f"the plugin's own name, or {BUILTIN}")
        scope = parser.add_mutually_exclusive_group()
        scope.add_argument("--household", help="only this household's accounts")
        scope.add_argument("--account", help="only this account (id or unique name)")

    plugin = subparsers.add_parser("plugin", help="installed plugins").add_subparsers(dest="action", required=True)
    plugin.add_parser("list", help="plugins installed in Pepper's environment")
    install = plugin.add_parser("install", help="pip-install a plugin (a folder, a wheel or a package name)")
    install.add_argument("source")

    household = subparsers.add_parser("household", help="accounts that share one configuration").add_subparsers(
        dest="action", required=True
    )
    household.add_parser("list", help="households and their accounts")
    create = household.add_parser("create", help="create a household")
    create.add_argument("name")
    add = household.add_parser("add", help="put an account in a household")
    add.add_argument("name")
    add.add_argument("account")
    remove = household.add_parser("remove", help="take an account out of its household")
    remove.add_argument("account")
    delete = household.add_parser("delete", help="delete a household and its slot settings (its accounts stay)")
    delete.add_argument("name")

    sandbox = subparsers.add_parser("sandbox", help="run a program the way the sandbox slot runs it").add_subparsers(
        dest="action", required=True
    )
    run_cmd = sandbox.add_parser("run", help="run PROGRAM with no secrets in its environment")
    run_cmd.add_argument("--seconds", type=float, default=30.0, help="time limit (default 30)")
    run_cmd.add_argument("program")
    run_cmd.add_argument("args", nargs=argparse.REMAINDER)
    add_breaker_commands(subparsers)


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command == "slot":
        await _slot(args, db, out)
    elif args.command == "plugin":
        _plugin(args, out)
    elif args.command == "household":
        await _household(args, db, out)
    elif args.command == "sandbox":
        return await _sandbox(args, settings, db, out)
    elif args.command == "breaker":
        await run_breaker(args, db, out)
    else:
        return False
    return True


async def _scope(args: argparse.Namespace, db: Queries) -> tuple[str, UUID | None, str]:
    if getattr(args, "account", None):
        account = await identity.get_account(db, args.account)
        return "account", account.id, f"account {account.name}"
    if getattr(args, "household", None):
        household = await get_household(db, args.household)
        return "household", household.id, f"household {household.name}"
    return "installation", None, "the installation"


async def _slot(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    reg = slots()
    if args.action == "list":
        for line in await slot_lines(db, reg):
            out(line)
        return
    scope, scope_id, where = await _scope(args, db)
    if args.action == "set":
        problem = None if args.name == BUILTIN else reg.problem(args.slot, args.name)
        if problem is not None:
            raise InvalidInput(f"{args.name} cannot occupy the {args.slot} slot: {problem}; nothing changed")
        await set_slot(db, args.slot, args.name, scope=scope, scope_id=scope_id, registry=reg)
        out(f"the {args.slot} slot of {where} is now {args.name}")
    else:
        found = await clear_slot(db, args.slot, scope=scope, scope_id=scope_id, registry=reg)
        out(
            f"the {args.slot} slot of {where} is back to the default"
            if found
            else f"{where} had no {args.slot} setting"
        )


async def slot_lines(db: Queries, reg: SlotRegistry) -> list[str]:
    """What ``pepper slot list`` prints: each slot, its settings, their problems and fallbacks."""
    settings = await slot_settings(db)
    stale = {(s.scope, s.scope_id, s.slot): why for s, why in stale_settings(settings, reg)}
    counts = await fallback_counts(db)
    lines = []
    for name in SLOT_NAMES:
        spec = reg.specs.get(name)
        mine = [s for s in settings if s.slot == name]
        top = next((s.occupant for s in mine if s.scope == "installation"), BUILTIN)
        lines.append(f"{name:<19} {top:<24} default: {BUILTIN}  ({spec.summary if spec else 'not loaded'})")
        for s in mine:
            where = "installation" if s.scope == "installation" else f"{s.scope} {s.scope_name or s.scope_id}"
            why = stale.get((s.scope, s.scope_id, s.slot))
            note = f": using the default instead ({why})" if why else ""
            lines.append(f"  {where}: {s.occupant}{note}")
        for (slot, occupant), reasons in sorted(counts.items()):
            if slot == name:
                told = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
                lines.append(f"  fallbacks from {occupant}: {told}")
    return lines


def _plugin(args: argparse.Namespace, out: Callable[[str], None]) -> None:
    reg = slots()
    if args.action == "install":
        before = set(reg.plugins())
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", args.source],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise InvalidInput(f"pip could not install {args.source}: {last}")
        reg.invalidate(plugins=True)
        new = sorted(set(reg.plugins()) - before)
        if not new:
            out(f"installed {args.source}; it declares no new plugin in the pepper.plugins group")
        for name in new:
            out(f"installed plugin {name} ({_describe(reg, name)})")
        out("a running server picks new plugins up when it restarts")
        return
    plugins = reg.plugins()
    if not plugins:
        out("no plugins installed (a plugin is a package with an entry point in the pepper.plugins group)")
    for name in sorted(plugins):
        out(f"{name:<24} {_describe(reg, name)}  [{plugins[name].entry_point}]")


def _describe(reg: SlotRegistry, name: str) -> str:
    plugin = reg.plugins()[name]
    if plugin.error is not None:
        return f"does not load: {plugin.error}"
    if plugin.slot is not None:
        problem = reg.problem(plugin.slot, name) if plugin.slot in reg.specs else "no such slot"
        return f"claims the {plugin.slot} slot" + (f" but {problem}" if problem else "")
    if plugin.kind == "channel":
        ways = [
            w
            for w, attr in (("a webhook", "routes"), ("a connection", "run"))
            if callable(getattr(plugin.obj, attr, None))
        ]
        if not ways or not callable(getattr(plugin.obj, "send", None)):
            return "adds a channel but lacks a way in (routes or run) or a send: it carries nothing"
        return f"adds a text channel ({' and '.join(ways)})"
    return f"adds a {plugin.kind}" if plugin.kind else "claims no slot and declares no kind"


async def _household(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    reg = slots()
    if args.action == "create":
        household = await create_household(db, args.name)
        out(f"created household {household.name}")
    elif args.action == "list":
        households = await list_households(db)
        if not households:
            out("no households")
        for h in households:
            out(f"{h.name}: {', '.join(h.members) if h.members else 'no accounts'}")
    elif args.action == "add":
        household = await get_household(db, args.name)
        account = await identity.get_account(db, args.account)
        await join_household(db, account.id, household.id, reg)
        out(f"{account.name} is now in household {household.name}")
    elif args.action == "remove":
        account = await identity.get_account(db, args.account)
        await join_household(db, account.id, None, reg)
        out(f"{account.name} is in no household")
    else:
        household = await get_household(db, args.name)
        await delete_household(db, household.id, reg)
        out(f"deleted household {household.name}; its accounts stay")


async def _sandbox(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    from core.slots.sandbox import run_sandboxed

    slots()
    # The command's own environment is the base; the sandbox strips every secret from it.
    result = await run_sandboxed(db, None, args.program, args.args, env=dict(os.environ),
                                 secrets=settings.secret_values(), time_limit=args.seconds)  # fmt: skip
    if result.output:
        out(result.output.rstrip("\n"))
    out(f"(exit status {result.exit_status}{', stopped at the time limit' if result.timed_out else ''})")
    return True


def _cap(value: str | None, current: Any, kind: type) -> Any:
    if value is None:
        return current
    if value == "default":
        return None
    try:
        number = kind(value)
    except ValueError:
        raise InvalidInput(f"not a number: {value!r}") from None
    if number < 0:
        raise InvalidInput("a cap cannot be negative")
    return number


async def account_limits(
    args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]
) -> None:
    """``pepper account limits ACCOUNT [--tokens N] [--cost USD] [--minutes M]``."""
    from datetime import UTC, datetime

    from core.usage.ledger import caps_for, day_usage, month_usage, own_limits, set_limits, usage_tier

    account = await identity.get_account(db, args.account)
    config = settings.usage
    if args.tokens is not None or args.cost is not None or args.minutes is not None:
        own = await own_limits(db, account.id)
        await set_limits(
            db, account.id, tokens=_cap(args.tokens, own.tokens, int), cost=_cap(args.cost, own.cost, float),
            minutes=_cap(args.minutes, own.minutes, float),
        )  # fmt: skip
    now = datetime.now(UTC)
    caps = await caps_for(db, account.id, config)
    today, month = await day_usage(db, account.id, now.date()), await month_usage(db, account.id, now.date())

    def cap(value: Any, unit: str = "") -> str:
        return "no cap" if value is None else f"{unit}{value}"

    out(f"{account.name}: daily caps {cap(caps.tokens)} tokens, {cap(caps.cost, '$')} cost, "
        f"{cap(caps.minutes)} call minutes")  # fmt: skip
    for label, used in (("today (UTC)", today), ("this month", month)):
        out(f"  {label}: {used.tokens} tokens, ${used.cost:.4f}, {used.minutes:.1f} call minutes, "
            f"{used.model_calls} model calls")  # fmt: skip
    out(f"  tier now: {await usage_tier(db, account.id, now, config)}")


def add_breaker_commands(subparsers: Any) -> None:
    breaker = subparsers.add_parser(
        "breaker", help="conversations and tasks the circuit breaker paused"
    ).add_subparsers(dest="action", required=True)
    breaker.add_parser("list", help="strikes and pauses")
    reset = breaker.add_parser("reset", help="resume a paused conversation or task (every one without KEY)")
    reset.add_argument("key", nargs="?", help="conversation:ACCOUNT_ID or task:ID, as listed")


async def run_breaker(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    from core.usage import breaker

    if args.action == "reset":
        n = await breaker.reset(db, args.key)
        out(f"cleared {n} breaker(s)")
        return
    rows = await breaker.list_breakers(db)
    if not rows:
        out("no strikes and nothing paused")
    for b in rows:
        state = f"paused since {b.paused_at:%Y-%m-%d %H:%M} UTC" if b.paused_at else "running"
        out(f"{b.key}  {b.strikes} strike(s), last {b.reason}  {state}")
