"""``pepper mcp``: MCP servers a person connects, and the approval of each of their tools.

pepper mcp add ACCOUNT NAME [URL|COMMAND] [--token [TOKEN]]   check it answers, store it (token sealed)
pepper mcp add ACCOUNT github [--local] --token                 GitHub's remote server, or its local binary
pepper mcp list [ACCOUNT]                                       servers and how many tools wait or are held
pepper mcp remove ACCOUNT NAME
pepper mcp tools ACCOUNT NAME                                   list again; each tool's state, what changed
pepper mcp approve ACCOUNT NAME TOOL... [--all] [--safe-unattended]
pepper mcp reject ACCOUNT NAME TOOL...

``--token`` without a value reads ``$PEPPER_MCP_TOKEN``, else asks, else reads one line of stdin
(a value typed on the command line stays in the shell's history).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from core import identity
from core.adapters.mcp.client import McpUnavailable, ToolDefinition
from core.errors import InvalidInput
from core.records import mcp as records
from core.records.mcp import McpToolRow
from core.settings import Settings
from core.store.queries import Queries
from core.tools.mcp import GITHUB, McpHub, connect_server, definition_diff, unusable
from gateway import cli_connect

TOKEN_ENV = "PEPPER_MCP_TOKEN"
ASK = "\0ask"


def add_commands(sub: Any) -> None:
    top = sub.add_parser("mcp", help="MCP servers (GitHub's and your own) and approving their tools")
    actions = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="connect an MCP server: an http(s) URL or a command run over stdio")
    add.add_argument("account", help="account id or unique name")
    add.add_argument("name", help="the server's name, also its tool set's (github: GitHub's own server)")
    add.add_argument("target", nargs="?", help="URL or command (github: GitHub's remote server by default)")
    add.add_argument("--local", action="store_true", help="github: run GitHub's local github-mcp-server binary")
    add.add_argument(
        "--token", nargs="?", const=ASK, help=f"a bearer token; without a value: ${TOKEN_ENV}, a prompt or stdin"
    )
    listing = actions.add_parser("list", help="connected MCP servers and the state of their tools")
    listing.add_argument("account", nargs="?", help="account id or unique name (default: every account)")
    remove = actions.add_parser("remove", help="forget a server, its token and every approval of its tools")
    remove.add_argument("account")
    remove.add_argument("name")
    tools = actions.add_parser("tools", help="list a server's tools again: approved, waiting, held (with changes)")
    tools.add_argument("account")
    tools.add_argument("name")
    approve = actions.add_parser("approve", help="approve tools as last listed (their full definitions)")
    approve.add_argument("account")
    approve.add_argument("name")
    approve.add_argument("tool", nargs="*")
    approve.add_argument("--all", action="store_true", help="every tool that waits or is held")
    approve.add_argument(
        "--safe-unattended", action="store_true", help="a tool that writes may also run in scheduled runs"
    )
    reject = actions.add_parser("reject", help="reject tools as last listed: never offered")
    reject.add_argument("account")
    reject.add_argument("name")
    reject.add_argument("tool", nargs="+")


def _read_token(value: str | None) -> str | None:
    if value != ASK:
        return value
    token = os.environ.get(TOKEN_ENV)
    if not token:
        token = getpass.getpass("Token: ") if sys.stdin.isatty() else sys.stdin.readline().strip()
    if not token:
        raise InvalidInput("no token given (set PEPPER_MCP_TOKEN, type it, or leave --token out)")
    return token


def _state(row: McpToolRow) -> str:
    definition = ToolDefinition.from_dict(row.definition)
    kind = "read" if definition.read_only else "WRITES"
    if row.safe_unattended and row.state == "approved":
        kind += ", safe unattended"
    problem = unusable(definition)
    state = row.state if problem is None else f"never offered: {problem}"
    return f"{state:<10} {kind}"


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command != "mcp":
        return False
    hub = McpHub(cli_connect.connectors_factory(settings), timeout=settings.mcp_call_seconds)
    try:
        await _run(args, db, hub, out)
    finally:
        await hub.close()
    return True


async def _run(args: argparse.Namespace, db: Queries, hub: McpHub, out: Callable[[str], None]) -> None:
    if args.action == "list":
        accounts = [await identity.get_account(db, args.account)] if args.account else await identity.list_accounts(db)
        for account in accounts:
            servers = await records.servers_of(db, account.id)
            out(f"{account.name} ({account.id})")
            if not servers:
                out("  no MCP server connected")
            for server in servers:
                rows = await records.tools_of(db, server.id)
                counts = {s: sum(1 for r in rows if r.state == s) for s in ("approved", "waiting", "held")}
                where = server.config.get("url") or " ".join(server.config.get("command", []))
                token = "token sealed" if server.sealed else "no token"
                out(
                    f"  {server.name}  {server.config['transport']} {where}  [{token}]  {counts['approved']} approved, "
                    f"{counts['waiting']} waiting, {counts['held']} held"
                )
        return
    account = await identity.get_account(db, args.account)
    if args.action == "add":
        server, rows = await connect_server(
            db, hub, account.id, args.name, args.target, _read_token(args.token), local=args.local
        )
        out(
            f"connected the MCP server {server.name} for {account.name}: {len(rows)} tool(s), each waiting for approval"
        )
        _print_tools(rows, out)
        out(f"approve with: pepper mcp approve {account.name} {server.name} TOOL (or --all)")
        if server.name == GITHUB:
            out("GitHub's tools are used by the shipped github skills, once approved")
        return
    server = await records.server_named(db, account.id, args.name)
    if args.action == "remove":
        await records.remove_server(db, server.id)
        out(f"removed the MCP server {server.name} of {account.name}, its token and its tools' approvals")
        return
    if args.action == "tools":
        try:
            rows = await hub.refresh(db, server)
        except McpUnavailable as exc:
            out(f"note: {exc.message}; showing the last listing")
            rows = await records.tools_of(db, server.id)
        if not rows:
            out(f"{server.name} lists no tools")
        _print_tools(rows, out)
        return
    rows = await records.tools_of(db, server.id)
    names = list(args.tool)
    if args.action == "approve" and args.all:
        names += [r.name for r in rows if r.state in ("waiting", "held") and r.name not in names]
    if not names:
        raise InvalidInput("name the tools to approve, or give --all")
    for name in names:
        row = await records.decide(
            db, server.id, name, approve=args.action == "approve", safe_unattended=args.safe_unattended
            if args.action == "approve" else False,
        )  # fmt: skip
        out(f"{args.action}d {server.name} {name} as last listed ({row.fingerprint[:12]})")


def _print_tools(rows: list[McpToolRow], out: Callable[[str], None]) -> None:
    for row in rows:
        out(f"  {row.name:<32} {_state(row)}")
        if row.state == "held":
            for line in definition_diff(row.approved, row.definition):
                out(f"      changed {line}")
        elif row.state == "waiting":
            text = " ".join((row.definition.get("description") or "").split())
            out(f"      {text[:200]}")
            out(f"      input: {json.dumps(row.definition.get('input_schema'), sort_keys=True)[:300]}")
