"""Feature area: RSS and Atom feeds (parsed by feedparser).

``read_feeds`` fetches each followed feed (conditional GET with ETag/Last-Modified), keeps new
items and lists the unread ones. ``mark_feed_items_read`` is staged: items are marked read only
when the reply that showed them was delivered, so a briefing nobody received leaves them unread.
"""

from __future__ import annotations

import calendar
import logging
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import feedparser
import httpx

from core.errors import InvalidInput
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.registry import Tool, ToolContext, ToolOutcome

log = logging.getLogger(__name__)

AREA = "feeds"
MAX_BYTES = 5 * 1024 * 1024


class FeedError(Exception):
    pass


async def fetch(connectors: Connectors, url: str, etag: str | None = None, modified: str | None = None) -> Any:
    """The parsed feed, or None when the server says it has not changed. Raises ``FeedError``."""
    headers = {"User-Agent": "Pepper feed reader", "Accept": "application/rss+xml, application/atom+xml, */*"}
    if etag:
        headers["If-None-Match"] = etag
    if modified:
        headers["If-Modified-Since"] = modified
    try:
        async with connectors.http(follow_redirects=True) as http:
            response = await http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise FeedError("the feed did not answer") from exc
    if response.status_code == 304:
        return None
    if response.status_code != 200:
        raise FeedError(f"the feed answered {response.status_code}")
    if len(response.content) > MAX_BYTES:
        raise FeedError("the feed is too large")
    parsed = feedparser.parse(response.content)
    if not parsed.get("version") and not parsed.entries:
        raise FeedError("that address is not an RSS or Atom feed")
    parsed["_etag"] = response.headers.get("ETag")
    parsed["_modified"] = response.headers.get("Last-Modified")
    return parsed


def _published(entry: Any) -> datetime | None:
    stamp = entry.get("published_parsed") or entry.get("updated_parsed")
    return datetime.fromtimestamp(calendar.timegm(stamp), UTC) if stamp else None


async def store_items(db: Queries, feed_id: int, parsed: Any) -> int:
    """Keep new items (by guid, else link, else title); returns how many were new."""
    new = 0
    for entry in parsed.entries:
        guid = entry.get("id") or entry.get("link") or entry.get("title")
        if not guid:
            continue
        inserted = await db.fetchval(
            """
            INSERT INTO feed_items (feed_id, guid, title, link, summary, published) VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (feed_id, guid) DO NOTHING RETURNING id
            """,
            feed_id,
            guid,
            (entry.get("title") or "(untitled)").strip(),
            entry.get("link"),
            (entry.get("summary") or "")[:1000],
            _published(entry),
        )
        new += inserted is not None
    return new


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _plan_follow(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            url = await connectors.check_public_url(args["url"])
            parsed = await fetch(connectors, url)
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message)
        except FeedError as exc:
            return ToolOutcome.failed(str(exc))
        title = (parsed.feed.get("title") if parsed else None) or url
        return ToolOutcome.planned({"url": url, "title": title}, f"now following {title!r}")

    async def _apply_follow(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        await conn.execute(
            "INSERT INTO feeds (account_id, url, title) VALUES ($1, $2, $3) ON CONFLICT (account_id, url) DO NOTHING",
            account_id,
            p["url"],
            p["title"],
        )

    async def _list_feeds(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        rows = await ctx.db.fetch(
            """
            SELECT f.id, f.title, f.url, count(i.id) FILTER (WHERE i.read_at IS NULL) AS unread
            FROM feeds f LEFT JOIN feed_items i ON i.feed_id = f.id
            WHERE f.account_id = $1 GROUP BY f.id ORDER BY f.id
            """,
            ctx.session.account_id,
        )
        if not rows:
            return ToolOutcome.empty("the person follows no feeds")
        return ToolOutcome.ok("\n".join(f"- #{r['id']} {r['title']} ({r['unread']} unread) {r['url']}" for r in rows))

    async def _plan_unfollow(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        title = await ctx.db.fetchval(
            "SELECT title FROM feeds WHERE id = $1 AND account_id = $2", args["feed"], ctx.session.account_id
        )
        if title is None:
            return ToolOutcome.failed(f"there is no feed #{args['feed']}")
        return ToolOutcome.planned({"feed": args["feed"]}, f"stopped following {title!r}")

    async def _apply_unfollow(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        await conn.execute("DELETE FROM feeds WHERE id = $1 AND account_id = $2", p["feed"], account_id)

    async def _read(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        feeds = await ctx.db.fetch(
            "SELECT id, url, title, etag, modified FROM feeds WHERE account_id = $1 AND ($2::bigint IS NULL OR id = $2)"
            " ORDER BY id",
            ctx.session.account_id,
            args.get("feed"),
        )
        if not feeds:
            return ToolOutcome.empty("the person follows no feeds" if args.get("feed") is None else "no such feed")
        failed: list[str] = []
        for feed in feeds:
            try:
                parsed = await fetch(connectors, feed["url"], feed["etag"], feed["modified"])
            except FeedError as exc:
                log.warning("feed fetch failed: feed=%s error=%s", feed["id"], type(exc).__name__)
                failed.append(f"{feed['title']} ({exc})")
                continue
            if parsed is not None:
                await store_items(ctx.db, feed["id"], parsed)
                await ctx.db.execute(
                    "UPDATE feeds SET etag = $2, modified = $3, last_fetched = now() WHERE id = $1",
                    feed["id"],
                    parsed["_etag"],
                    parsed["_modified"],
                )
        items = await ctx.db.fetch(
            """
            SELECT i.id, i.title, i.link, i.published, f.title AS feed
            FROM feed_items i JOIN feeds f ON f.id = i.feed_id
            WHERE f.id = ANY($1::bigint[]) AND i.read_at IS NULL
            ORDER BY i.published DESC NULLS LAST, i.id DESC LIMIT $2
            """,
            [f["id"] for f in feeds],
            args.get("limit", 30),
        )
        note = f"Could not read: {'; '.join(failed)}. Items from those feeds are unknown, not absent." if failed else ""
        if not items:
            if failed:
                return ToolOutcome.failed(note)
            return ToolOutcome.empty("no unread feed items")
        lines = [
            f"- [{r['id']}] {r['feed']}: {r['title']}"
            + (f" ({r['published']:%Y-%m-%d})" if r["published"] else "")
            + (f" {r['link']}" if r["link"] else "")
            for r in items
        ]
        tail = ["Mark the items you report as read with mark_feed_items_read."]
        return ToolOutcome.ok("\n".join(["Unread items:", *lines, *([note] if note else []), *tail]))

    async def _plan_mark(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        ids = sorted(set(args["items"]))
        found = await ctx.db.fetch(
            """
            SELECT i.id FROM feed_items i JOIN feeds f ON f.id = i.feed_id
            WHERE f.account_id = $1 AND i.id = ANY($2::bigint[])
            """,
            ctx.session.account_id,
            ids,
        )
        known = [r["id"] for r in found]
        if not known:
            return ToolOutcome.failed("none of those items exist; use the numbers from read_feeds")
        return ToolOutcome.planned({"items": known}, f"{len(known)} feed items marked read")

    async def _apply_mark(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        await conn.execute(
            """
            UPDATE feed_items i SET read_at = coalesce(i.read_at, now()) FROM feeds f
            WHERE f.id = i.feed_id AND f.account_id = $1 AND i.id = ANY($2::bigint[])
            """,
            account_id,
            p["items"],
        )

    feed_id = {"type": "integer", "minimum": 1}
    return (
        Tool(
            name="follow_feed",
            description="Follow an RSS or Atom feed by its URL.",
            parameters={
                "type": "object",
                "properties": {"url": {"type": "string", "minLength": 8, "maxLength": 2000}},
                "required": ["url"],
                "additionalProperties": False,
            },
            handler=_plan_follow,
            apply=_apply_follow,
            area=AREA,
            writes=True,
        ),
        Tool(
            name="list_feeds",
            description="The feeds the person follows, with unread counts.",
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
            handler=_list_feeds,
            area=AREA,
        ),
        Tool(
            name="unfollow_feed",
            description="Stop following a feed, by its number from list_feeds.",
            parameters={
                "type": "object",
                "properties": {"feed": feed_id},
                "required": ["feed"],
                "additionalProperties": False,
            },
            handler=_plan_unfollow,
            apply=_apply_unfollow,
            area=AREA,
            writes=True,
        ),
        Tool(
            name="read_feeds",
            description="Fetch followed feeds and list unread items (newest first), each with a number.",
            parameters={
                "type": "object",
                "properties": {"feed": feed_id, "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
                "additionalProperties": False,
            },
            handler=_read,
            area=AREA,
        ),
        Tool(
            name="mark_feed_items_read",
            description="Mark the feed items you told the person about as read (saved once the reply is delivered).",
            parameters={
                "type": "object",
                "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
                "required": ["items"],
                "additionalProperties": False,
            },
            handler=_plan_mark,
            apply=_apply_mark,
            area=AREA,
            writes=True,
            staged=True,
        ),
    )


TOOLS = make_tools(Connectors())

__all__ = ["TOOLS", "fetch", "make_tools", "store_items"]
