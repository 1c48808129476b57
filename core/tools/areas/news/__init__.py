"""Feature area: news, over the feeds the person follows (the feeds area fetches them), filtered
by the person's topics. Headlines are other people's words: each is quoted (``core.untrusted``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import quoted

AREA = "news"
MAX_TOPICS = 20


async def _topics(db: Queries, account_id: UUID) -> list[str]:
    rows = await db.fetch("SELECT topic FROM news_topics WHERE account_id = $1 ORDER BY topic", account_id)
    return [r["topic"] for r in rows]


async def _headlines(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    topics = [args["topic"]] if args.get("topic") else await _topics(ctx.db, ctx.session.account_id)
    patterns = ["%" + t.replace("%", "").replace("_", "") + "%" for t in topics]
    rows = await ctx.db.fetch(
        """
        SELECT i.title, i.published, f.title AS feed FROM feed_items i JOIN feeds f ON f.id = i.feed_id
        WHERE f.account_id = $1 AND (cardinality($2::text[]) = 0 OR i.title ILIKE ANY($2) OR i.summary ILIKE ANY($2))
        ORDER BY i.published DESC NULLS LAST, i.id DESC LIMIT $3
        """,
        ctx.session.account_id, patterns, args.get("limit", 10),
    )  # fmt: skip
    if not rows:
        about = f" about {', '.join(topics)}" if topics else ""
        return ToolOutcome.empty(f"no stored news items{about} (read_feeds fetches new ones)")
    head = f"News on {', '.join(topics)}" if topics else "Latest news (no topics set)"
    lines = [f"- {r['feed']}: {quoted(r['title'])}" + (f" ({r['published']:%d %b})" if r["published"] else "")
             for r in rows]  # fmt: skip
    return ToolOutcome.ok(f"{head}; headlines are quoted from the feeds:\n" + "\n".join(lines))


async def _plan_topics(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    topics = sorted({" ".join(t.split()).lower() for t in args["topics"] if t.strip()})
    if len(topics) > MAX_TOPICS:
        return ToolOutcome.failed(f"at most {MAX_TOPICS} topics")
    return ToolOutcome.planned({"topics": topics}, f"news topics: {', '.join(topics) or 'none'}")


async def _apply_topics(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await conn.execute("DELETE FROM news_topics WHERE account_id = $1", account_id)
    await conn.execute(
        "INSERT INTO news_topics (account_id, topic) SELECT $1, t FROM unnest($2::text[]) AS t", account_id,
        payload["topics"],
    )  # fmt: skip


TOOLS: tuple[Tool, ...] = (
    Tool("news_headlines", "Stored feed headlines on the person's topics, or one topic.",
         {"type": "object", "properties": {"topic": {"type": "string", "minLength": 1, "maxLength": 60},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 30}},
          "additionalProperties": False}, _headlines, AREA),
    Tool("set_news_topics", "Replace the person's news topics.",
         {"type": "object", "properties": {"topics": {"type": "array", "maxItems": MAX_TOPICS,
                                                      "items": {"type": "string", "minLength": 1, "maxLength": 60}}},
          "required": ["topics"], "additionalProperties": False}, _plan_topics, AREA, writes=True, apply=_apply_topics),
)  # fmt: skip
