"""``pepper suggestions`` and ``pepper places``: the calendar's suggestion cards, and saved places.

pepper suggestions list ACCOUNT [--shadow|--all]   open cards (--shadow: what shadow detectors would show)
pepper suggestions run ACCOUNT                     run the calendar's detectors now
pepper suggestions accept ACCOUNT ID               run the card's action, through the tool gate
pepper suggestions dismiss ACCOUNT ID              close the card for good
pepper places add ACCOUNT NAME --at LAT,LON        save a place the detectors and travel_time can find
pepper places list ACCOUNT

Accepting runs the card's action as the owner's own live call on channel ``cli``: the same tool,
gate and rules as a turn (``core.suggestions.accept``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from core import identity
from core.errors import InvalidInput, NotFound
from core.scheduling.tasks import account_timezone
from core.settings import Settings
from core.store import Database
from core.suggestions import accept, cards, dismiss, parse_id, run_detectors
from core.tools.areas.places import list_places, save_place
from core.tools.areas.places.routing import coordinates_in
from core.tools.connectors import Connectors, account_connections
from core.tools.context import SessionContext
from core.tools.gate import default_gate
from core.tools.starter import starter_registry


def _now() -> datetime:
    return datetime.now(UTC)


# Tests set these: a fixed instant, and connectors that reach loopback peers.
clock: Callable[[], datetime] = _now
connectors_factory: Callable[[Settings], Connectors] = Connectors.from_settings


def add_commands(subparsers: Any) -> None:
    sub = subparsers.add_parser("suggestions", help="the calendar's suggestion cards").add_subparsers(
        dest="action", required=True
    )
    listing = sub.add_parser("list", help="open cards")
    listing.add_argument("account", help="account id or unique name")
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--shadow", action="store_true", help="what detectors in shadow found (never shown)")
    which.add_argument("--all", action="store_true", help="decided and gone ones too")
    running = sub.add_parser("run", help="run the calendar's detectors now")
    running.add_argument("account")
    for name, text in (("accept", "run the card's action through the tool gate"), ("dismiss", "close it for good")):
        p = sub.add_parser(name, help=text)
        p.add_argument("account")
        p.add_argument("id", help="the card's number from `pepper suggestions list`")

    places = subparsers.add_parser("places", help="saved places (travel time)").add_subparsers(
        dest="action", required=True
    )
    adding = places.add_parser("add", help="save a place by name with its coordinates")
    adding.add_argument("account")
    adding.add_argument("name", help="as events write it, e.g. 'Office' or '1 Rue de Rivoli, Paris'")
    adding.add_argument("--at", required=True, metavar="LAT,LON", help="latitude,longitude, e.g. 48.8566,2.3522")
    shown = places.add_parser("list", help="saved and geocoded places")
    shown.add_argument("account")


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command not in ("suggestions", "places"):
        return False
    account = await identity.get_account(db, args.account)
    if args.command == "places":
        if args.action == "add":
            point = coordinates_in(args.at)
            if point is None or "," not in args.at:
                raise InvalidInput(f"--at wants latitude,longitude such as 48.8566,2.3522 (got {args.at!r})")
            await save_place(db, account.id, args.name, point.lat, point.lon)
            out(f"saved {args.name.strip()} at {point.lat:.5f}, {point.lon:.5f}")
        else:
            rows = await list_places(db, account.id)
            if not rows:
                out("no places saved")
            for r in rows:
                out(f"{r['label']}: {r['lat']:.5f}, {r['lon']:.5f} ({r['source']})")
        return True
    connectors = connectors_factory(settings)
    if args.action == "run":
        report = await run_detectors(db, connectors, account.id, clock())
        found = ", ".join(f"{name} {n}" for name, n in report.found.items()) or "no detector running"
        out(f"found: {found}; {report.new} new; {report.shown} card(s) open")
        for name, error in report.failed.items():
            out(f"detector {name} failed ({error}); its cards were left as they were")
        if report.unavailable:
            out(f"could not read: {', '.join(report.unavailable)} (nothing there was counted as gone)")
        return True
    if args.action == "list":
        states = ("shadow",) if args.shadow else (
            ("open", "accepting", "accepted", "dismissed", "gone") if args.all else ("open",))  # fmt: skip
        shown = await cards(db, account.id, states=states)
        if not shown:
            out("no shadow findings" if args.shadow else "no suggestions")
        for c in shown:
            state = "" if c.state == "open" else f" ({c.state})"
            out(f"#{c.id} {c.detector}{state}: {c.title}")
            out(f"    {c.detail}")
            out(f"    accept: {c.does}" + (f"; last: {c.result}" if c.result else ""))
        return True
    card_id = parse_id(args.id)
    if card_id is None:
        raise InvalidInput(f"a suggestion id is a number from `pepper suggestions list` (got {args.id!r})")
    if args.action == "dismiss":
        decision = await dismiss(db, account.id, card_id)
    else:
        session = SessionContext(
            "live", "owner_verified", "cli", account.id, None, None, await account_timezone(db, account.id),
            await account_connections(db, account.id, connectors),
        )  # fmt: skip
        decision = await accept(db, starter_registry(connectors), default_gate(), session, card_id, clock())
    if decision is None:
        raise NotFound(f"no open suggestion #{card_id} for {account.name} (decided already?)")
    out(decision.message)
    if not decision.ok:
        raise InvalidInput("the suggestion's action was not done; the card stays open")
    return True
