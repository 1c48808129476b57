"""The ``pepper`` command: run the server, check the setup, and administer accounts and lines.

Every failure the operator can cause (bad settings, a busy port, an unreachable database, an
unknown account) ends in one line on stderr starting with ``pepper: error:`` and exit status 1,
never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import getpass
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pydantic import ValidationError

from core import identity
from core.errors import PepperError
from core.settings import VOICE_ENGINES, VOICE_TRANSPORTS, Settings, config_warnings, load_settings
from core.store import Database, open_store
from gateway.logs import setup_logging

log = logging.getLogger("pepper")


class CommandError(PepperError):
    code = "command-error"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes follow the rule of every other mistake: one line and status 1."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found[2])
            close = difflib.get_close_matches(found[1], choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; choose from {', '.join(choices)}"
            message = f"{message[: found.start()]}invalid choice {found[1]!r}{hint}"
        self.exit(1, f"pepper: error: {message} (see {self.prog} --help)\n")


def _engine_name(value: str) -> str:
    if value in (*VOICE_ENGINES, "default") or (value.startswith("plugin:") and len(value) > len("plugin:")):
        return value
    raise argparse.ArgumentTypeError(f"not a voice engine: {value!r} (one of {', '.join(VOICE_ENGINES)}, plugin:NAME)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pepper", description="Pepper, a voice-first personal assistant.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server (embedded Postgres unless DATABASE_URL is set)")
    serve.add_argument("--host", help="listen address (PEPPER_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (PEPPER_PORT, default 8080)")
    serve.add_argument("--data-dir", help="data folder (PEPPER_DATA_DIR, default ~/.pepper)")

    doctor = sub.add_parser("doctor", help="say what is configured and missing, and the webhook URLs")
    doctor.add_argument("--host", help="as for pepper serve: the listen address it would use")
    doctor.add_argument("--port", type=int, help="as for pepper serve: the listen port it would use")
    doctor.add_argument("--data-dir", help="as for pepper serve: the data folder")
    doctor.add_argument(
        "--online", action="store_true", help="also try each configured credential with one read-only call"
    )

    account = sub.add_parser("account", help="people's accounts").add_subparsers(dest="action", required=True)
    create = account.add_parser("create", help="create an account")
    create.add_argument("name")
    create.add_argument("--timezone", default="UTC", help="IANA zone, e.g. Europe/Paris")
    account.add_parser("list", help="list accounts")
    rename = account.add_parser("rename", help="give an account another name")
    rename.add_argument("account", help="account id or unique name")
    rename.add_argument("new_name")
    delete = account.add_parser("delete", help="delete an account and everything Pepper holds about the person")
    delete.add_argument("account", help="account id or unique name")
    delete.add_argument("--yes", action="store_true", help="do not ask to type the name to confirm")
    show = account.add_parser("show", help="an account with its handles and lines")
    show.add_argument("account", help="account id or unique name")
    limits = account.add_parser("limits", help="an account's daily caps, its use today and this month, its tier")
    limits.add_argument("account", help="account id or unique name")
    limits.add_argument("--tokens", help="daily token cap ('default': the settings' cap)")
    limits.add_argument("--cost", help="daily cost cap in US dollars ('default': the settings' cap)")
    limits.add_argument("--minutes", help="daily call-minute cap ('default': the settings' cap)")

    handle = sub.add_parser("handle", help="phone numbers, emails, web logins and Matrix IDs").add_subparsers(
        dest="action", required=True
    )
    add = handle.add_parser("add", help="attach a handle to an account")
    add.add_argument("account", help="account id or unique name")
    add.add_argument("kind", choices=identity.HANDLE_KINDS)
    add.add_argument("value")
    add.add_argument("--verified", action="store_true", help="mark it verified now")
    verify = handle.add_parser("verify", help="mark a handle verified (or --unverify)")
    verify.add_argument("kind", choices=identity.HANDLE_KINDS)
    verify.add_argument("value")
    verify.add_argument("--unverify", action="store_true")

    pin = sub.add_parser("pin", help="the owner PIN callers prove themselves with").add_subparsers(
        dest="action", required=True
    )
    pin_set = pin.add_parser("set", help="set the PIN (asked for, or one line on stdin)")
    pin_set.add_argument("account", help="account id or unique name")

    line = sub.add_parser("line", help="the Twilio numbers Pepper answers").add_subparsers(dest="action", required=True)
    assign = line.add_parser("assign", help="tie a Twilio number to an account")
    assign.add_argument("number")
    assign.add_argument("kind", choices=identity.LINE_KINDS, help="personal line or answering service")
    assign.add_argument("account", help="account id or unique name")
    assign.add_argument("--label")
    line.add_parser("list", help="list the numbers Pepper answers")
    engine = line.add_parser("engine", help="the realtime engine calls on a line run on")
    engine.add_argument("number")
    engine.add_argument(
        "engine",
        type=_engine_name,
        help=f"{', '.join(VOICE_ENGINES)}, plugin:NAME (a voice_provider plugin) or 'default' (PEPPER_VOICE_ENGINE)",
    )
    transport = line.add_parser("transport", help="how calls reach a line's voice model: Media Streams or SIP direct")
    transport.add_argument("number")
    transport.add_argument(
        "transport",
        choices=(*VOICE_TRANSPORTS, "default"),
        help="media-streams (through Pepper), sip (a Twilio Elastic SIP trunk to OpenAI, gpt-live only)"
        " or 'default' (PEPPER_VOICE_TRANSPORT)",
    )

    replay = sub.add_parser("replay", help="run a recorded turn again on another tier; tools return recorded results")
    replay.add_argument("turn", nargs="?", help="the turn id")
    replay.add_argument(
        "--batch", action="store_true", help="replay a set of turns: the judge's failing ones, or --flagged ones"
    )
    replay.add_argument("--flagged", action="store_true", help="with --batch: turns with a record flag instead")
    replay.add_argument("--since", default="7d", metavar="WHEN", help="with --batch: turns since (default 7d)")
    replay.add_argument("--account", help="with --batch: only this account (id or unique name)")
    replay.add_argument("--limit", type=int, default=10, metavar="N", help="with --batch: at most N turns (10)")
    replay.add_argument(
        "--case", metavar="FILE", help="run a quality issue's replay case (pepper quality issues --case ID --out FILE)"
    )
    replay.add_argument("--tier", help="model tier to run it on (default: the tier it ran on)")
    for module in _command_modules():
        module.add_commands(sub)
    return parser


# Command groups that live beside their feature, one module each (keeps this file from growing a
# branch per feature). Each module has ``add_commands(subparsers)`` and
# ``async def run(args, settings, db, out) -> bool`` returning True when it handled ``args``.
COMMAND_MODULES: tuple[str, ...] = (
    "gateway.cli_web",
    "gateway.cli_skills",
    "gateway.cli_tasks",
    "gateway.cli_memory",
    "gateway.cli_answering",
    "gateway.cli_connect",
    "gateway.cli_follow",
    "gateway.cli_mcp",
    "gateway.cli_setup",
    "gateway.cli_backup",
    "gateway.cli_turns",
    "gateway.cli_slots",
    "gateway.cli_rooms",
    "gateway.cli_quality",
    "gateway.cli_suggestions",
    "gateway.cli_calls",
)


def _command_modules() -> list[Any]:
    import importlib

    return [importlib.import_module(name) for name in COMMAND_MODULES]


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "data_dir"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    try:
        settings = load_settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise CommandError(f"bad setting {where}: {first['msg']}") from None
    serving = getattr(args, "command", None) == "serve"
    # The server logs at PEPPER_LOG_LEVEL; an admin command at WARNING unless it is set.
    level = settings.log_level if serving or "log_level" in settings.model_fields_set else "WARNING"
    setup_logging(level, settings.log_format, process="web" if serving else "cli")
    for warning in config_warnings():
        print(f"pepper: warning: {warning}", file=sys.stderr)
    return settings


def _read_pin() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New PIN (4-12 digits): ")
        if getpass.getpass("Repeat the PIN: ") != first:
            raise CommandError("the two PINs differ; nothing changed")
        return first
    return sys.stdin.readline().strip()


async def _admin(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> None:
    region = settings.default_region
    if args.command == "account":
        if args.action == "create":
            await _create_account(args, db, out)
        elif args.action == "rename":
            account = await identity.get_account(db, args.account)
            if await identity.accounts_named(db, args.new_name) and args.new_name.strip() != account.name:
                raise CommandError(f"another account is already named {args.new_name.strip()!r}; nothing changed")
            renamed = await identity.rename_account(db, account.id, args.new_name)
            out(f"renamed account {account.id} from {account.name!r} to {renamed.name!r}")
        elif args.action == "delete":
            account = await identity.get_account(db, args.account)
            if not args.yes:
                _confirm_deletion(account.name)
            # Google keeps a grant until it is revoked: ask it to forget Pepper before Pepper forgets
            # the token (a refusal is said, and the deletion goes on).
            from gateway.cli_connect import revoke_google_grants  # the Google client, only when needed

            note = await revoke_google_grants(db, settings, account.id)
            await identity.delete_account(db, account.id)
            out(f"deleted account {account.id} ({account.name}) and everything Pepper held about them{note}")
        elif args.action == "limits":
            from gateway.cli_slots import account_limits

            await account_limits(args, settings, db, out)
        elif args.action == "list":
            for account in await identity.list_accounts(db):
                pin = "PIN set" if account.has_pin else "no PIN"
                out(f"{account.id}  {account.name}  {account.timezone}  {pin}")
        else:
            account = await identity.get_account(db, args.account)
            out(f"{account.id}  {account.name}  {account.timezone}  {'PIN set' if account.has_pin else 'no PIN'}")
            for h in await identity.list_handles(db, account.id):
                out(f"  {h.kind:<6} {h.value}  {'verified' if h.verified else 'unverified'}")
            for line in await identity.list_lines(db):
                if line.account_id == account.id:
                    out(f"  line   {line.number}  {line.kind}")
    elif args.command == "handle":
        if args.action == "add":
            account = await identity.get_account(db, args.account)
            if await _handle_already_there(args, account, db, region, out):
                return
            h = await identity.add_handle(
                db, account.id, args.kind, args.value, verified=args.verified, default_region=region
            )
            out(f"attached {h.kind} {h.value} to {account.name} ({'verified' if h.verified else 'unverified'})")
        else:
            h = await identity.set_handle_verified(db, args.kind, args.value, not args.unverify, default_region=region)
            out(f"{h.kind} {h.value} is now {'verified' if h.verified else 'unverified'}")
    elif args.command == "pin":
        account = await identity.get_account(db, args.account)
        await identity.set_pin(db, account.id, _read_pin())
        out(f"PIN set for {account.name}")
    elif args.command == "line":
        if args.action == "assign":
            account = await identity.get_account(db, args.account)
            line = await identity.assign_line(
                db, args.number, args.kind, account.id, label=args.label, default_region=region
            )
            out(f"{line.number} is now the {line.kind} line of {account.name}")
        elif args.action == "engine":
            await _set_line_engine(args, settings, db, out)
        elif args.action == "transport":
            await _set_line_transport(args, settings, db, out)
        else:
            from voice.engines import resolve_engine

            accounts = {a.id: a.name for a in await identity.list_accounts(db)}
            for line in await identity.list_lines(db):
                engine = line.voice_engine or f"{resolve_engine(settings)} (default)"
                transport = line.voice_transport or f"{settings.voice_transport} (default)"
                who = accounts.get(line.account_id, line.account_id)
                out(f"{line.number}  {line.kind:<9}  {who}  {engine}  {transport}")


async def _create_account(args: argparse.Namespace, db: Database, out: Callable[[str], None]) -> None:
    """Create an account, or find the one already of that name (so a setup script can run twice)."""
    existing = await identity.accounts_named(db, args.name)
    if len(existing) > 1:
        raise CommandError(f"{len(existing)} accounts are named {args.name.strip()!r}; nothing changed")
    if existing:
        account = existing[0]
        note = "" if account.timezone == args.timezone else f"; its time zone stays {account.timezone}"
        out(f"account {account.id} ({account.name}) already exists; nothing changed{note}")
        return
    account = await identity.create_account(db, args.name, timezone=args.timezone)
    out(f"created account {account.id} ({account.name}, {account.timezone})")


async def _handle_already_there(
    args: argparse.Namespace, account: identity.Account, db: Database, region: str, out: Callable[[str], None]
) -> bool:
    """True (with a note) when this handle is already this account's; on another account, an error."""
    found = await identity.find_handle(db, args.kind, args.value, default_region=region)
    if found is None:
        return False
    if found.account_id != account.id:
        raise CommandError(f"that {args.kind} handle already belongs to another account; nothing changed")
    if args.verified and not found.verified:
        await identity.set_handle_verified(db, args.kind, found.value, True, default_region=region)
        out(f"{found.kind} {found.value} was already on {account.name}; now verified")
    else:
        out(f"{found.kind} {found.value} is already on {account.name}; nothing changed")
    return True


def _confirm_deletion(name: str) -> None:
    print(f"This deletes {name!r} and everything Pepper holds about them. Type the name to confirm: ",
          end="", file=sys.stderr, flush=True)  # fmt: skip
    if sys.stdin.readline().strip() != name:
        raise CommandError("the name typed does not match; nothing deleted (--yes deletes without asking)")


async def _set_line_engine(
    args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]
) -> None:
    from voice.engines import engine_available, resolve_engine

    engine = None if args.engine == "default" else args.engine
    if engine is not None and not engine_available(engine):
        raise CommandError(f"the {engine} voice engine is not part of this build; nothing changed")
    line = await identity.set_line_engine(db, args.number, engine, default_region=settings.default_region)
    out(f"calls on {line.number} now run on {line.voice_engine or resolve_engine(settings) + ' (the default)'}")


async def _set_line_transport(
    args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]
) -> None:
    from voice.engines import resolve_engine, sip_line_problems

    transport = None if args.transport == "default" else args.transport
    before = await identity.find_line(db, args.number, default_region=settings.default_region)
    if before is not None and before.voice_transport == transport:
        shown = transport or f"{settings.voice_transport} (the default)"
        out(f"calls to {before.number} already come over {shown}; nothing changed")
        return
    line = await identity.set_line_transport(db, args.number, transport, default_region=settings.default_region)
    now = line.voice_transport or settings.voice_transport
    out(f"calls to {line.number} now come over {line.voice_transport or now + ' (the default)'}")
    if now == "sip":
        for problem in sip_line_problems(line.voice_engine or resolve_engine(settings), settings, line.kind):
            out(f"note: {problem}")


def _model_service(settings: Settings) -> Any:
    """The ModelService for commands that call models (the router of ``core.models``)."""
    from core.models.router import ModelRouter

    return ModelRouter.from_settings(settings)


# Tests replace this to run commands against a scripted model.
model_service_factory: Callable[[Settings], Any] = _model_service


async def _replay(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> int:
    from uuid import UUID

    from core.quality.cases import load_case
    from text_loop.replay import replay_turn, side_by_side

    if args.batch:
        if args.turn or args.case:
            raise CommandError("--batch replays a set of turns: give no turn id or --case with it")
        return await _replay_batch(args, settings, db, out)
    case = load_case(args.case) if args.case else None
    if (case is None) == (args.turn is None):
        raise CommandError("give a turn id or --case FILE (one of them)")
    raw = case["turn_id"] if case is not None else args.turn
    try:
        turn_id = UUID(raw)
    except ValueError:
        raise CommandError(f"not a turn id: {raw!r}") from None
    deps = _replay_deps(settings, db)
    result = await replay_turn(deps, turn_id, tier=args.tier or (case or {}).get("tier"))
    out(f"replayed turn {result.original_turn_id} as {result.replay_turn_id} (tier {result.tier}, {result.status})")
    if result.unmatched_calls:
        out(f"{result.unmatched_calls} call(s) had no recorded result and were answered as failed")
    for line in side_by_side(
        f"before ({result.old_model or 'no model'})",
        result.old_reply,
        f"replay ({result.new_model or 'no model'})",
        result.new_reply,
    ):
        out(line)
    if case is None:
        return 0
    from core.quality.replay_check import check_replayed

    problem = await check_replayed(db, deps.models, case, result.replay_turn_id)
    if problem is None:
        out(f"case passes: the replay no longer fails on {case['point']}")
        return 0
    out(f"case fails on {case['point']}: {problem}")
    return 1


def _replay_deps(settings: Settings, db: Database) -> Any:
    from core.tools.connectors import Connectors
    from core.tools.starter import starter_registry
    from text_loop import HarnessDeps
    from text_loop.skills.catalog import SkillCatalog

    # As the server builds them (gateway.composition): a skill's worker runs again in a replay.
    connectors = Connectors.from_settings(settings)
    return HarnessDeps(
        db=db, models=model_service_factory(settings), registry=starter_registry(connectors),
        skills=SkillCatalog.load_builtin(), connectors=connectors,
    )  # fmt: skip


async def _replay_batch(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> int:
    """Replay the judge's failing turns (or flagged ones) on ``--tier`` and show both replies and
    both sets of grades; the replays are graded by the judge, not stored as grades."""
    from datetime import UTC, datetime

    from core.quality.jobs import QualityConfig, judged_failing, stored_grades
    from core.quality.judge import MalformedGrades, grade_turn, load_turn
    from core.quality.points import POINTS
    from core.records.turns import TurnFilter, list_turns
    from gateway.cli_turns import parse_since
    from text_loop.replay import replay_turn, side_by_side

    if not args.tier:
        raise CommandError("--batch needs --tier: the tier to compare against")
    now = datetime.now(UTC)
    account = await identity.get_account(db, args.account) if args.account else None
    account_id = account.id if account else None
    since = parse_since(args.since, now=now, timezone=account.timezone if account else "UTC")
    if args.flagged:
        found = await list_turns(db, TurnFilter(account_id=account_id, since=since, flagged=True, limit=args.limit * 3))
        turn_ids = [r["id"] for r in found if r["kind"] in ("live", "scheduled", "room")][: args.limit]
    else:
        turn_ids = await judged_failing(db, since=since, account_id=account_id, limit=args.limit)
    if not turn_ids:
        out("no turns to replay (the judge failed none in that period)" if not args.flagged else "no flagged turns")
        return 0
    deps = _replay_deps(settings, db)
    tier = QualityConfig().tier

    def summary(grades: dict[str, str]) -> str:
        failing = [p for p in POINTS if grades.get(p) == "fail"]
        return "not graded" if not grades else ("fails " + ", ".join(failing) if failing else "passes all")

    rows: list[tuple[str, str, str, str, str]] = []
    for turn_id in turn_ids:
        result = await replay_turn(deps, turn_id, tier=args.tier)
        replayed = await load_turn(db, result.replay_turn_id)
        try:
            verdict = await grade_turn(db, deps.models, replayed, tier=tier) if replayed else None
            after = {p: g.grade for p, g in verdict.grades.items()} if verdict else {}
        except MalformedGrades:
            after = {}
        before = await stored_grades(db, turn_id)
        rows.append((str(turn_id), result.old_model or "-", result.new_model or "-", summary(before), summary(after)))
        out(f"turn {turn_id}: {result.old_model or '-'} -> {result.new_model or '-'} (tier {args.tier})")
        for line in side_by_side(f"before: {summary(before)}", result.old_reply, f"replay: {summary(after)}",
                                 result.new_reply):  # fmt: skip
            out(line)
        out("")
    out(f"{'turn':<36}  {'before':<24} {'replay':<24} {'grades before':<30} grades on replay")
    for turn, old, new, before_text, after_text in rows:
        out(f"{turn:<36}  {old:<24} {new:<24} {before_text:<30} {after_text}")
    return 0


async def _doctor(settings: Settings, out: Callable[[str], None], *, online: bool = False) -> int:
    from gateway.app import create_app
    from gateway.doctor import BAD, check_online, diagnose, render
    from gateway.webhooks import served_paths

    report = await diagnose(settings, served_paths(create_app(settings, None)))
    if online:
        report.online = await check_online(settings)
    out(render(report))
    return 0 if report.can_serve and not any(c.status == BAD for c in report.online) else 1


async def _run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    if args.command == "setup":
        from gateway.cli_setup import setup

        return await setup(args, out, _settings, lambda settings: _doctor(settings, out))
    settings = _settings(args)
    if args.command == "serve":
        from gateway.server import serve

        await serve(settings)
        return 0
    if args.command == "doctor":
        return await _doctor(settings, out, online=args.online)
    if args.command in ("backup", "restore"):
        from gateway.cli_backup import run_command

        return await run_command(args, settings, out)
    if args.command == "chat":
        import os

        from gateway.cli_web import chat

        return await asyncio.to_thread(
            chat, args, settings, args.token or os.environ.get("PEPPER_TOKEN"), sys.stdin, out
        )
    async with open_store(settings, serving=False) as db:
        if args.command == "replay":
            return await _replay(args, settings, db, out)
        for module in _command_modules():
            if await module.run(args, settings, db, out):
                return int(getattr(args, "exit_code", 0))  # a module may set it (replay-call: 1 on a difference)
        await _admin(args, settings, db, out)
    return 0


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], None] = print) -> int:
    args = _parser().parse_args(argv)
    # Until the settings are read (then ``_settings`` sets PEPPER_LOG_LEVEL and PEPPER_LOG_FORMAT).
    setup_logging("WARNING", process="web" if args.command == "serve" else "cli")
    try:
        if args.command == "serve":
            # libuv's event loop: measurably less CPU per request in the web server (bench/sms_webhook.py).
            import uvloop

            return uvloop.run(_run(args, out))
        return asyncio.run(_run(args, out))
    except PepperError as exc:
        print(f"pepper: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
