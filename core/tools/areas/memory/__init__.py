"""Feature area: search on request over the person's past messages and the documents Pepper made.

The memory block in the prompt holds summaries and recent messages only; this is how the model
recalls details, when it decides to. Results carry their date and channel. Every query is scoped
to the session's person.
"""

from __future__ import annotations

import logging
from typing import Any
from zoneinfo import ZoneInfo

from core.memory.search import MEMORY_SEARCH, SearchHit
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import quoted

log = logging.getLogger(__name__)


def render_hit(hit: SearchHit, timezone: str) -> str:
    when = hit.created_at.astimezone(ZoneInfo(timezone))
    stamp = f"{when:%Y-%m-%d %H:%M}"
    if hit.source == "document":
        return f"- {stamp}, {hit.kind or 'document'} Pepper wrote, {hit.title!r}: {hit.snippet}"
    if hit.direction == "inbound" and hit.author is not None:
        # A caller who never proved they are the person: their words, quoted, never the person's.
        return f"- {stamp}, {hit.channel}, a caller who had not proved they are the person said: {quoted(hit.snippet)}"
    who = "the person wrote" if hit.direction == "inbound" else "Pepper wrote"
    return f"- {stamp}, {hit.channel}, {who}: {hit.snippet}"


async def _search(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    query = " ".join(args["query"].split())
    if not query:
        return ToolOutcome.failed("the search query is empty")
    limit = args.get("limit", 8)
    try:
        hits = await MEMORY_SEARCH.search(ctx.db, ctx.session.account_id, query, limit=limit)
    except Exception as exc:  # CancelledError is a BaseException and passes
        log.exception("memory search failed: error=%s", type(exc).__name__)
        return ToolOutcome.failed("the memory search is not working right now")
    if not hits:
        return ToolOutcome.empty(f"no past messages or documents match {query!r}")
    words = sum(1 for h in hits if h.match == "words")
    head = f"{len(hits)} results, best first"
    if words:
        head += f" ({words} contain the quoted words as written)"
    return ToolOutcome.ok(head + ":\n" + "\n".join(render_hit(h, ctx.session.timezone) for h in hits))


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="search_memory",
        description=(
            "Search everything the person and Pepper said before, on every channel, and documents Pepper "
            "made, by meaning. Put exact words in double quotes to also find messages containing them as "
            "written. Use it when the memory in the prompt lacks a detail you need."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 300},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        handler=_search,
        area="memory",
    ),
)
