"""Feature area: following web pages, calendar feeds, teams and TV shows (``core.following``).

``follow_add`` resolves what the person named (a web address, ``team:NAME``, ``show:NAME``)
before anything is stored, so a refusal stores nothing; the same source twice is one follow.
Followed events show in the agenda (the calendar's ``list_events``) but are copied into the
person's calendar (Google, CalDAV, else Pepper's own: ``core.following.copies``) only when the
person opts in for that source (``write_to_calendar``), and copies never carry attendees, so no
invitation goes out. A scheduled run can neither start nor stop following (each
follow costs fetches and model calls for as long as it lasts); the gate also forces
``write_to_calendar`` off there.
A person or a topic is followed through its RSS or Atom feed: ``follow_add`` with the feed's
address puts it in the feeds area's list (``read_feeds`` reads its items) and checks it here.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.errors import PepperError
from core.following import copies, store
from core.following.checks import Following
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "following"
# Each follow costs a fetch every few hours and a model call per change, for as long as it lasts:
# only the person starts or stops one, never a run nobody watches (what it read could ask for it).
NOT_IN_SCHEDULED_RUNS = "a scheduled run cannot start or stop following anything; the person asks in a conversation"


def describe(row: Any) -> str:
    """One line per follow: what, its last check (failures said, never hidden), its events."""
    kinds = {"page": "web page", "calendar": "calendar feed", "feed": "news feed", "team": "team", "show": "TV show"}
    kind = kinds[row["kind"]]
    where = f" {row['target']}" if row["kind"] in ("page", "calendar", "feed") else ""
    if row["last_checked_at"] is None:
        last = "not checked yet"
    else:
        last = f"last check {row['last_checked_at']:%Y-%m-%d %H:%M} UTC: {row['last_status']}"
        if row["last_detail"]:
            last += f" ({row['last_detail']})"
    if row["failures"]:
        last += f"; FAILING: {row['failures']} check(s) in a row"
    if row["kind"] == "calendar":
        events = "its events in the agenda as the feed has them"
    elif row["kind"] == "feed":
        events = "its items in read_feeds"
    else:
        events = f"{row['shown']} events shown" + (f", {row['hidden']} hidden" if row["hidden"] else "")
    mirror = ""
    if row["write_to_calendar"]:
        mirror = f"; copied to {row['write_calendar'] or 'the primary connected calendar'}"
        if row["copied"]:
            mirror += f" ({row['copied']} in {row['copied_to']})"
    if row["copy_failures"]:
        mirror += f"; CALENDAR WRITES FAILING: {row['copy_failures']} check(s) in a row ({row['copy_error']})"
    return f"- #{row['id']} {row['title']} [{kind}]{where}: {events}{mirror}; {last}"


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _plan_add(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if ctx.session.kind == "scheduled":
            return ToolOutcome.failed(NOT_IN_SCHEDULED_RUNS)
        following = Following.from_connectors(ctx.db, connectors)
        try:
            kind, target, title = await following.resolve(args["source"])
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        write = bool(args.get("write_to_calendar", False))
        calendar_id = None
        if write and args.get("calendar"):  # only with write_to_calendar, which the gate turns off where it must
            try:
                calendar_id = str((await copies.choose_calendar(ctx.db, ctx.session.account_id, args["calendar"])).id)
            except PepperError as exc:
                return ToolOutcome.failed(exc.message)
        payload = {"kind": kind, "target": target, "title": title, "write_to_calendar": write,
                   "calendar_id": calendar_id}  # fmt: skip
        found = await store.find(ctx.db, ctx.session.account_id, kind, target)
        if found is not None:  # the apply finds it too and changes nothing: the same source is one follow
            return ToolOutcome.planned(payload, f"already following {found.title!r} (#{found.id}); nothing changed")
        where = "shown in the agenda and copied to the person's calendar" if write else "shown in the agenda only"
        return ToolOutcome.planned(payload, f"now following {title!r}; its events will be {where}")

    async def _apply_add(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        following = Following.from_connectors(conn, connectors)
        named = UUID(p["calendar_id"]) if p.get("calendar_id") and p["write_to_calendar"] else None
        await following.add_resolved(account_id, p["kind"], p["target"], p["title"],
                                     write_to_calendar=p["write_to_calendar"], write_calendar_id=named)  # fmt: skip

    async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        rows = await store.listing(ctx.db, ctx.session.account_id)
        if not rows:
            return ToolOutcome.empty("the person follows no pages, calendar feeds, teams or shows")
        return ToolOutcome.ok("\n".join(["Followed:", *(describe(r) for r in rows)]))

    async def _plan_remove(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if ctx.session.kind == "scheduled":
            return ToolOutcome.failed(NOT_IN_SCHEDULED_RUNS)
        row = await ctx.db.fetchrow(
            "SELECT title FROM follows WHERE id = $1 AND account_id = $2", args["follow"], ctx.session.account_id
        )
        if row is None:
            return ToolOutcome.failed(f"there is no follow #{args['follow']}; use the numbers from follow_list")
        return ToolOutcome.planned({"follow": args["follow"]}, f"stopped following {row['title']!r}")

    async def _apply_remove(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        await store.remove(conn, account_id, p["follow"])

    return (
        Tool(
            name="follow_add",
            description=(
                "Follow a web page (a school calendar, a club's fixtures), an iCalendar feed, an RSS/Atom feed (a"
                " person, a topic), a team (team:NAME) or a TV show (show:NAME): events show in the agenda, feed"
                " items in read_feeds. write_to_calendar also copies events into the person's own calendar (Google,"
                " CalDAV, else Pepper's), never with invitations; only when asked."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "source": {"type": "string", "minLength": 3, "maxLength": 2000},
                    "write_to_calendar": {"type": "boolean"},
                    "calendar": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 200,
                        "description": "with write_to_calendar: which calendar (default: the primary one)",
                    },
                },
                "required": ["source"],
                "additionalProperties": False,
            },
            handler=_plan_add,
            apply=_apply_add,
            area=AREA,
            writes=True,
            scheduled=(("write_to_calendar", False),),
        ),
        Tool(
            name="follow_list",
            description="What the person follows, each with its number, its last check (and failures) and events.",
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
            handler=_list,
            area=AREA,
        ),
        Tool(
            name="follow_remove",
            description="Stop following something, by its number from follow_list.",
            parameters={
                "type": "object",
                "properties": {"follow": {"type": "integer", "minimum": 1}},
                "required": ["follow"],
                "additionalProperties": False,
            },
            handler=_plan_remove,
            apply=_apply_remove,
            area=AREA,
            writes=True,
        ),
    )


TOOLS = make_tools(Connectors())

__all__ = ["TOOLS", "describe", "make_tools"]
