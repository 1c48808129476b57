"""``pepper skills``: the shipped skills, and the owner's own (add, list, show, remove).

A skill file that does not parse, takes a shipped skill's name, or asks for more than a user
skill may (see ``text_loop.skills.SkillLimits``) is refused with one line saying why; nothing is
stored. ``list`` shows every skill with whether it can run in this Pepper, and why not: a skill whose
required steps need an account that is not connected shows what it needs ("needs Gmail or IMAP")
instead of "ready" (with an account given, for what that account connected).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import identity
from core.errors import InvalidInput
from core.records.skills import get_skill, list_skills, remove_skill
from core.settings import Settings
from core.store.queries import Queries
from core.tools.connectors import Connectors, account_connections
from core.tools.starter import starter_registry
from text_loop.skills import Skill, SkillCatalog, SkillError, limit_problem, parse_skill
from text_loop.skills.store import add_user_skill

MAX_FILE_BYTES = 64 * 1024


def add_commands(subparsers: Any) -> None:
    skills = subparsers.add_parser("skills", help="skills: shipped ones and your own").add_subparsers(
        dest="action", required=True
    )
    listing = skills.add_parser("list", help="every skill and whether it can run here")
    listing.add_argument("account", nargs="?", help="also list this account's own skills (id or unique name)")
    show = skills.add_parser("show", help="print a skill file")
    show.add_argument("name")
    show.add_argument("--account", help="look among this account's own skills")
    add = skills.add_parser("add", help="add your own skill from a Markdown file ('-' reads stdin)")
    add.add_argument("account", help="account id or unique name")
    add.add_argument("file")
    add.add_argument("--replace", action="store_true", help="replace your skill of the same name")
    remove = skills.add_parser("remove", help="remove one of your own skills")
    remove.add_argument("account", help="account id or unique name")
    remove.add_argument("name")


def _read(file: str) -> str:
    if file == "-":
        return sys.stdin.read()
    path = Path(file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read {file}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InvalidInput(f"{file} is too large for a skill ({len(data)} bytes, at most {MAX_FILE_BYTES})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{file} is not UTF-8 text") from None


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command != "skills":
        return False
    catalog = SkillCatalog.load_builtin()
    registry = starter_registry()
    if args.action == "list":
        # Whether a skill is ready depends on what the person connected: the account's, or nothing.
        account = await identity.get_account(db, args.account) if args.account else None
        connected = await account_connections(db, account.id, _connectors(settings)) if account else frozenset()
        for problem in catalog.problems:
            out(f"{problem.skill:<22} shipped  BROKEN: {problem.problem}")
        for skill in catalog.builtins.values():
            kind = "worker " + ",".join(skill.header.toolsets) if skill.is_worker else "inline"
            out(f"{skill.name:<22} shipped  {kind:<34} {_state(catalog, skill, registry, connected, account)}")
        if account is not None:
            stored = await list_skills(db, account.id)
            if not stored:
                out(f"{account.name} has no skills of their own")
            for row in stored:
                out(f"{row.name:<22} own      {_user_state(row.source, row.name, catalog, registry, connected)}")
        return True
    if args.action == "show":
        if args.account:
            account = await identity.get_account(db, args.account)
            out((await get_skill(db, account.id, args.name)).source.rstrip("\n"))
            return True
        skill = catalog.get(args.name)
        if skill is None:
            raise InvalidInput(f"no shipped skill named {args.name!r} (give --account for your own skills)")
        out(skill.text.rstrip("\n"))
        return True
    account = await identity.get_account(db, args.account)
    if args.action == "add":
        text = _read(args.file)
        source = "from stdin" if args.file == "-" else Path(args.file).name
        skill, status = await add_user_skill(db, account.id, text, catalog, replace=args.replace, source=source)
        note = {"added": "added", "replaced": "replaced", "unchanged": "already there, unchanged,"}[status]
        out(f"skill {skill.name} {note} for {account.name}")
        reason = catalog.unavailable(skill, registry)
        if reason:
            out(f"note: it cannot run yet: {reason}")
        return True
    await remove_skill(db, account.id, args.name)
    out(f"skill {args.name} removed for {account.name}")
    return True


def _connectors(settings: Settings) -> Connectors:
    """Enough of the connectors to tell which connections an account has (no secret is opened)."""
    return Connectors(smtp_host=settings.smtp_host, smtp_from=settings.smtp_from)


def _state(catalog: SkillCatalog, skill: Skill, registry: Any, connected: frozenset[str], account: Any) -> str:
    reason = catalog.unavailable(skill, registry)
    if reason:
        return f"unavailable: {reason}"
    needs = catalog.needs(skill, registry, connected)
    if needs:
        return needs if account is not None else f"{needs} (give an account to check what it connected)"
    return "ready"


def _user_state(text: str, stored_name: str, catalog: SkillCatalog, registry: Any, connected: frozenset[str]) -> str:
    try:
        skill = parse_skill(text, source=repr(stored_name), origin="user")
    except SkillError as exc:
        return f"BROKEN: {exc.message}"
    kind = "worker " + ",".join(skill.header.toolsets) if skill.is_worker else "inline"
    problem = limit_problem(skill, catalog.limits, catalog.toolsets)
    if problem:
        return f"{kind:<34} REFUSED when run: {problem}"
    return f"{kind:<34} {_state(catalog, skill, registry, connected, True)}"
