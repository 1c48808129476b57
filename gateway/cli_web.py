"""CLI for web and API access (``pepper web password``, ``pepper token``) and ``pepper chat``."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from core import access, identity
from core.errors import PepperError
from core.settings import Settings
from core.store.queries import Queries


class ChatError(PepperError):
    code = "chat-failed"


def add_commands(sub: Any) -> None:
    web = sub.add_parser("web", help="the owner's web chat login").add_subparsers(dest="action", required=True)
    password = web.add_parser("password", help="set the web login and password (asked, or one line on stdin)")
    password.add_argument("account", help="account id or unique name")
    password.add_argument("login", help="the login name to sign in with")

    token = sub.add_parser("token", help="API tokens for `pepper chat`").add_subparsers(dest="action", required=True)
    create = token.add_parser("create", help="make a token (printed once)")
    create.add_argument("account", help="account id or unique name")
    create.add_argument("--name", default="cli")
    revoke = token.add_parser("revoke", help="revoke every token of an account")
    revoke.add_argument("account", help="account id or unique name")

    chat = sub.add_parser("chat", help="talk to Pepper through a running server's API")
    chat.add_argument("--url", help="the server (default http://PEPPER_HOST:PEPPER_PORT)")
    chat.add_argument("--token", help="an API token (default: $PEPPER_TOKEN)")
    chat.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each reply")
    chat.add_argument(
        "--folder", help="lend this folder for the chat, read-only: Pepper may list, read and search it (docs/mcp.md)"
    )


def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New password: ")
        if getpass.getpass("Repeat it: ") != first:
            raise PepperError("the two passwords differ; nothing changed")
        return first
    return sys.stdin.readline().rstrip("\n")


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command == "web":
        account = await identity.get_account(db, args.account)
        handle = await access.set_web_password(db, account.id, args.login, _read_password())
        out(f"{account.name} signs in to /chat as {handle.value}")
        return True
    if args.command == "token":
        account = await identity.get_account(db, args.account)
        if args.action == "create":
            token = await access.create_api_token(db, account.id, args.name)
            out(token)
        else:
            out(f"revoked {await access.revoke_api_tokens(db, account.id)} token(s) of {account.name}")
        return True
    return False


def chat(
    args: argparse.Namespace, settings: Settings, token: str | None, lines: Any, out: Callable[[str], None]
) -> int:
    """Send each line of ``lines`` and print Pepper's reply, as the web page does (same API)."""
    if not token:
        raise ChatError("give an API token with --token or PEPPER_TOKEN (make one with `pepper token create`)")
    base = (args.url or f"http://{settings.host}:{settings.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {token}"}
    folder = None
    if getattr(args, "folder", None):
        from gateway.cli_folder import LentFolder

        try:
            folder = LentFolder(args.folder)
        except OSError as exc:
            raise ChatError(f"cannot lend {args.folder}: {exc.strerror or exc}") from None
    with httpx.Client(base_url=base, headers=headers, timeout=args.timeout) as client:
        if folder is None:
            return _chat(client, base, lines, out)
        from gateway.cli_folder import FolderLending

        # The folder's calls are answered on a client of their own, from a thread of their own.
        with httpx.Client(base_url=base, headers=headers, timeout=30.0) as side:
            try:
                lending = FolderLending(side, folder)
                with lending:
                    return _chat(client, base, lines, out, folder_id=lending.id)
            except (httpx.TransportError, RuntimeError) as exc:
                raise ChatError(str(exc)) from exc


def _chat(
    client: httpx.Client, base: str, lines: Any, out: Callable[[str], None], *, folder_id: str | None = None
) -> int:
    """Send each line and print the reply; ``folder_id``: the folder this session lends, named on
    each message so that only this session's turns see its tools."""
    try:
        history = client.get("/api/messages", params={"limit": 1})
    except httpx.TransportError as exc:
        raise ChatError(f"cannot reach Pepper at {base}: {exc}") from exc
    if history.status_code == 401:
        raise ChatError("the server refused the API token")
    history.raise_for_status()
    known = [m["id"] for m in history.json()["messages"]]
    after = max(known, default=0)
    for line in lines:
        text = line.strip()
        if not text:
            continue
        body = {"text": text, "client_id": str(uuid.uuid4())}
        if folder_id is not None:
            body["folder_id"] = folder_id
        sent = client.post("/api/messages", json=body)
        if sent.status_code >= 400:
            raise ChatError(f"the server refused the message: {sent.json().get('message', sent.text)}")
        mine = sent.json()["message_id"]
        reply = _wait_for_reply(client, after=max(after, mine), asked=mine)
        after = reply["id"]
        out(reply["body"])
        client.post(f"/api/messages/{reply['id']}/ack")
    return 0


def _wait_for_reply(client: httpx.Client, *, after: int, asked: int) -> dict[str, Any]:
    """Read the event stream until the reply to our message (the next outbound web message)."""
    while True:
        with client.stream("GET", "/api/events", params={"after": after}) as stream:
            event: dict[str, Any] | None = None
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    after = max(after, event["id"])
                    if event["direction"] == "outbound" and event["channel"] == "web" and event["id"] > asked:
                        return event
        # The server closed a long stream; reconnect from where we were.
