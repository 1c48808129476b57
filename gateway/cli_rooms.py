"""``pepper rooms``: shared chats on the Matrix homeserver, where Pepper is a member.

pepper rooms link ACCOUNT @name:server          send a code to that Matrix ID in a direct message
pepper rooms verify ACCOUNT @name:server CODE   link it with the code it got
pepper rooms create NAME --member ACCOUNT ...   a new room; Pepper and the members (invited)
pepper rooms invite ROOM ACCOUNT ...            add members
pepper rooms list
pepper rooms share ROOM ACCOUNT CALENDAR LEVEL  what ACCOUNT shares of one of their calendars with
                                                ROOM: nothing, free_busy, titles or everything
pepper rooms shares ROOM ACCOUNT                what ACCOUNT shares with ROOM
pepper rooms skill ROOM ACCOUNT NAME [--unshare] share one of ACCOUNT's skills with ROOM, by reference

The homeserver must be running (``pepper serve`` runs the embedded one). Sharing levels are the
member's own: this command and the web app set them; no tool of Pepper's model can.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from core import identity
from core.adapters.matrix import MatrixClient, MatrixError
from core.errors import InvalidInput
from core.records import rooms
from core.settings import Settings
from core.store import Database
from core.store.queries import Queries
from core.tools.areas.calendar import calendars
from core.tools.areas.calendar.sources import find_calendar


def add_commands(subparsers: Any) -> None:
    top = subparsers.add_parser("rooms", help="shared rooms on Matrix: members, invitations, calendar sharing")
    sub = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    link = sub.add_parser("link", help="send a code to a person's Matrix ID in a direct message")
    link.add_argument("account")
    link.add_argument("matrix_id", help="@name:server")
    verify = sub.add_parser("verify", help="link a Matrix ID with the code Pepper sent to it")
    verify.add_argument("account")
    verify.add_argument("matrix_id")
    verify.add_argument("code")
    create = sub.add_parser("create", help="create a room with Pepper and the members in it")
    create.add_argument("name")
    create.add_argument("--member", action="append", default=[], metavar="ACCOUNT", required=True)
    invite = sub.add_parser("invite", help="add members to a room")
    invite.add_argument("room")
    invite.add_argument("accounts", nargs="+", metavar="ACCOUNT")
    sub.add_parser("list", help="the rooms and their members")
    share = sub.add_parser("share", help="set what a member shares of one of their calendars with a room")
    share.add_argument("room")
    share.add_argument("account", help="the member whose level changes")
    share.add_argument("calendar", help="the calendar's name or ref (pepper calendars are listed by 'shares')")
    share.add_argument("level", choices=rooms.SHARE_LEVELS)
    shares = sub.add_parser("shares", help="what a member shares with a room, per calendar")
    shares.add_argument("room")
    shares.add_argument("account")
    skill = sub.add_parser("skill", help="share one of a member's own skills with a room (by reference)")
    skill.add_argument("room")
    skill.add_argument("account", help="the member whose skill it is")
    skill.add_argument("name")
    skill.add_argument("--unshare", action="store_true")


@asynccontextmanager
async def _homeserver(settings: Settings) -> AsyncIterator[MatrixClient]:
    from gateway.rooms.homeserver import pepper_client

    try:
        client = await pepper_client(settings)
    except MatrixError as exc:
        raise InvalidInput(f"the homeserver cannot be reached ({exc.message}); is pepper serve running?") from None
    try:
        yield client
    finally:
        await client.close()


async def _matrix_ids(db: Queries, refs: list[str]) -> list[tuple[identity.Account, str]]:
    found = []
    for ref in refs:
        account = await identity.get_account(db, ref)
        matrix_id = await rooms.verified_matrix_id(db, account.id)
        if matrix_id is None:
            raise InvalidInput(
                f"{account.name} has no verified Matrix ID; run pepper rooms link {account.name} @name:server"
            )
        found.append((account, matrix_id))
    return found


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command != "rooms":
        return False
    action = args.action
    if action == "list":
        listed = await rooms.list_rooms(db)
        for room, names in listed:
            out(f"{room.name}  {room.matrix_id}  members: {', '.join(names) or '(none)'}")
        if not listed:
            out("no rooms yet (pepper rooms create NAME --member ACCOUNT)")
    elif action == "link":
        from gateway.rooms.linking import send_link_code

        account = await identity.get_account(db, args.account)
        async with _homeserver(settings) as client:
            sent = await send_link_code(db, client, account.id, args.matrix_id)
        out(f"sent a code to {args.matrix_id} in a direct message; then: pepper rooms verify {account.name}"
            f" {args.matrix_id} CODE" if sent else f"{args.matrix_id} is already linked to {account.name}")  # fmt: skip
    elif action == "verify":
        from gateway.rooms.linking import verify_link_code

        account = await identity.get_account(db, args.account)
        await verify_link_code(db, account.id, args.matrix_id, args.code)
        out(f"linked {args.matrix_id} to {account.name}")
    elif action == "create":
        members = await _matrix_ids(db, args.member)
        async with _homeserver(settings) as client:
            matrix_id = await client.create_room(args.name, [m for _, m in members])
        async with db.transaction() as conn:
            room = await rooms.create_room(conn, matrix_id, args.name)
            for account, _ in members:
                await rooms.add_member(conn, room.id, account.id)
        out(f"created room {room.name} ({room.matrix_id}); invited {', '.join(a.name for a, _ in members)}")
    elif action == "invite":
        room = await rooms.get_room(db, args.room)
        members = await _matrix_ids(db, args.accounts)
        async with _homeserver(settings) as client:
            for account, matrix_id in members:
                if await rooms.add_member(db, room.id, account.id):
                    await client.invite(room.matrix_id, matrix_id)
                    out(f"invited {account.name} ({matrix_id}) to {room.name}")
                else:
                    out(f"{account.name} is already a member of {room.name}")
    elif action == "skill":
        room = await rooms.get_room(db, args.room)
        account = await identity.get_account(db, args.account)
        if args.unshare:
            done = await rooms.unshare_skill(db, room.id, account.id, args.name)
            out(f"{account.name} no longer shares {args.name!r} with {room.name}" if done
                else f"{account.name} does not share {args.name!r} with {room.name}")  # fmt: skip
        else:
            await rooms.share_skill(db, room.id, account.id, args.name)
            out(f"{account.name} shares skill {args.name!r} with {room.name} (its current text, each time it runs)")
    elif action in ("share", "shares"):
        room = await rooms.get_room(db, args.room)
        account = await identity.get_account(db, args.account)
        if not await rooms.is_member(db, room.id, account.id):
            raise InvalidInput(f"{account.name} is not a member of {room.name}")
        if action == "share":
            cal = await find_calendar(db, account.id, args.calendar)
            await rooms.set_share(db, room.id, account.id, cal.id, args.level)
            out(f"{account.name} shares calendar {cal.name!r} with {room.name}: {args.level}")
        else:
            levels = await rooms.shares(db, room.id)
            for cal in await calendars(db, account.id):
                out(f"{cal.ref}  {cal.name}: {levels.get((account.id, cal.id), 'nothing')}")
    return True
