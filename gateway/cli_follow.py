"""``pepper follow``: follow web pages, calendar and news feeds, teams and TV shows; list and remove.

pepper follow add ACCOUNT URL|team:NAME|show:NAME [--write-to-calendar] [--calendar NAME]
pepper follow set ACCOUNT ID --write-to-calendar [NAME] | --no-write
pepper follow list [ACCOUNT]        each source with its last check (failures said) and recent checks
pepper follow remove ACCOUNT ID
pepper follow check ACCOUNT [ID]    check now (a page's one extraction call uses the configured models)

The server's scheduler checks what is followed (``core.following.checks``); ``add`` resolves
the source now (a page or feed is fetched once, a team or show looked up), so a refusal stores
nothing, and the same source twice is one follow.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from core import identity
from core.errors import NotFound
from core.following import copies, store
from core.following.checks import Following
from core.settings import Settings
from core.store.queries import Queries
from core.tools.areas.following import describe
from core.tools.connectors import Connectors


def add_commands(sub: Any) -> None:
    top = sub.add_parser("follow", help="follow web pages, calendar feeds, teams and TV shows; list and remove")
    actions = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="follow a web page, calendar or news feed (URL), team:NAME or show:NAME")
    add.add_argument("account", help="account id or unique name")
    add.add_argument("source", help="a web address, team:NAME (TheSportsDB) or show:NAME (TVmaze)")
    add.add_argument(
        "--write-to-calendar", action="store_true",
        help="also copy its events into the primary connected calendar (Google, else CalDAV, else Pepper's);"
        " never with invitations (default: no)",
    )  # fmt: skip
    add.add_argument("--calendar", metavar="NAME", help="copy its events into this calendar (name or ref; opts in)")
    change = actions.add_parser("set", help="copy a source's events into a calendar, another one, or stop")
    change.add_argument("account", help="account id or unique name")
    change.add_argument("id", type=int, help="the number shown by `pepper follow list`")
    how = change.add_mutually_exclusive_group(required=True)
    how.add_argument("--write-to-calendar", nargs="?", const="", metavar="NAME",
                     help="copy into NAME (default: the primary connected calendar)")  # fmt: skip
    how.add_argument("--no-write", action="store_true", help="stop copying; the copies made are deleted")
    listing = actions.add_parser("list", help="what is followed, with each source's last checks and failures")
    listing.add_argument("account", nargs="?", help="account id or unique name (default: every account)")
    check = actions.add_parser("check", help="check now, due or not, and say what each check found")
    check.add_argument("account", help="account id or unique name")
    check.add_argument("id", type=int, nargs="?", help="one follow (default: all of the account's)")
    remove = actions.add_parser("remove", help="stop following (its events go with it)")
    remove.add_argument("account", help="account id or unique name")
    remove.add_argument("id", type=int, help="the number shown by `pepper follow list`")


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    if args.command != "follow":
        return False
    if args.action == "list":
        accounts = [await identity.get_account(db, args.account)] if args.account else await identity.list_accounts(db)
        for account in accounts:
            rows = await store.listing(db, account.id)
            out(f"{account.name}: " + (f"{len(rows)} followed" if rows else "follows nothing"))
            for row in rows:
                out(describe(row))
                for check in await store.recent_checks(db, row["id"], limit=3):
                    detail = f" ({check['detail']})" if check["detail"] else ""
                    failed = f"; calendar copies FAILED: {check['calendar_error']}" if check["calendar_error"] else ""
                    out(f"    {check['checked_at']:%Y-%m-%d %H:%M} {check['status']}{detail}{failed}")
            if left := await copies.orphans(db, account.id):
                out(f"  {left} copies of removed follows still to delete from a calendar (retried each pass)")
        return True
    account = await identity.get_account(db, args.account)
    if args.action == "add":
        following = Following.from_connectors(db, Connectors.from_settings(settings))
        follow, created = await following.add(
            account.id, args.source, write_to_calendar=args.write_to_calendar, calendar=args.calendar
        )
        if not created:
            out(f"{account.name} already follows {follow.title!r} (#{follow.id}); nothing changed"
                " (`pepper follow set` changes where its events are copied)")  # fmt: skip
            return True
        where = "the agenda only"
        if follow.write_to_calendar:
            where = f"the agenda and are copied to {await _where(db, follow)} at each check, without invitations"
        out(f"{account.name} now follows {follow.title!r} (#{follow.id}, {follow.kind}); its events show in {where};"
            " the server checks it on its scheduler")  # fmt: skip
    elif args.action == "check":
        await _check(args, settings, db, account, out)
    elif args.action == "set":
        calendar_id = None
        if args.write_to_calendar:
            calendar_id = (await copies.choose_calendar(db, account.id, args.write_to_calendar)).id
        changed = await store.set_writing(db, account.id, args.id, not args.no_write, calendar_id)
        if changed is None:
            raise NotFound(f"{account.name} follows nothing numbered {args.id}; see `pepper follow list`")
        if changed.write_to_calendar:
            where = await _where(db, changed)
            out(f"#{changed.id} {changed.title}: its events are copied to {where}, without invitations")
        else:
            out(f"#{changed.id} {changed.title}: its events show in the agenda only; the copies made are deleted")
        await _check(args, settings, db, account, out, after_set=True)  # now, not at the next scheduled check
    else:
        title = await store.remove(db, account.id, args.id)
        if title is None:
            raise NotFound(f"{account.name} follows nothing numbered {args.id}; see `pepper follow list`")
        out(f"{account.name} no longer follows {title!r}")
        removed, error = await copies.sweep(db, Connectors.from_settings(settings), account.id)
        if removed:
            out(f"  {removed} of its copies deleted from the calendar")
        if error:
            out(f"  some of its copies could not be deleted yet ({error}); the server retries each pass")
    return True


async def _where(db: Queries, follow: store.Follow) -> str:
    cal = await copies.target(db, follow)
    if cal is not None and cal.kind == "pepper" and cal.id == follow.write_calendar_id:
        return "Pepper's calendar"
    if cal is None or cal.kind == "pepper":
        return "Pepper's calendar (no Google or CalDAV calendar is connected)"
    return f"{cal.name} ({cal.kind})"


async def _check(
    args: argparse.Namespace, settings: Settings, db: Queries, account: identity.Account, out: Callable[[str], None],
    *, after_set: bool = False,
) -> None:  # fmt: skip
    from gateway import cli
    from gateway.scheduled import follow_config

    models = cli.model_service_factory(settings)
    following = Following.from_connectors(db, Connectors.from_settings(settings), models, follow_config(settings))
    following.owner = f"cli:{os.getpid()}"
    try:
        claimed = await store.claim_now(db, following.owner, following.clock(), account.id, args.id,
                                        lease=following.config.lease)  # fmt: skip
        if not claimed and after_set:  # the server's scheduler took it first (it was made due): its check writes
            out("  the server is checking it now; `pepper follow list` shows what that check did")
            return
        if not claimed:
            what = f"nothing numbered {args.id}" if args.id else "nothing"
            raise NotFound(f"{account.name} follows {what} that can be checked now; see `pepper follow list`")
        for follow in claimed:
            outcome = await following.check(follow)
            out(f"#{follow.id} {follow.title}: {outcome.status}" + (f" ({outcome.detail})" if outcome.detail else ""))
            if outcome.calendar_error:
                out(f"  calendar copies FAILED ({outcome.calendar_error}); the next check retries them")
    finally:
        close = getattr(models, "aclose", None)
        if close is not None:
            await close()
