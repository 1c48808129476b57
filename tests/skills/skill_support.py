"""Shared pieces of the skills tests (imported by name: a conftest cannot be imported twice).

Skills tests run the real router and OpenAI adapter against a loopback OpenAI peer.

Tiers map to distinct model names (gpt-small, gpt-medium, gpt-large) so a test can read from the
wire which tier a request ran on. The registry is the starter areas plus a small calendar area
(read-only, test-made) that sits behind a worker.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from core.store import Database
from core.testing.peers import Received
from core.tools import Tool, ToolOutcome
from text_loop.skills import SkillCatalog, parse_skill

NOW = datetime(2025, 6, 2, 7, 30, tzinfo=UTC)


async def _list_events(ctx: Any, args: dict[str, Any]) -> ToolOutcome:
    if args.get("day") == "sunday":
        return ToolOutcome.empty("no events on sunday")
    return ToolOutcome.ok("09:00-09:30 Dentist (Dr Wu)\n14:00-15:00 Design review")


async def _free_time(ctx: Any, args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome.ok("free: 10:00-13:30, 15:00-18:00")


CALENDAR_TOOLS = (
    Tool(
        "list_events",
        "List calendar events on a day.",
        {"type": "object", "properties": {"day": {"type": "string"}}, "additionalProperties": False},
        _list_events,
        area="calendar",
    ),
    Tool(
        "find_free_time",
        "Free times on a day.",
        {"type": "object", "properties": {"day": {"type": "string"}}, "additionalProperties": False},
        _free_time,
        area="calendar",
    ),
)

SKILLS = {
    "tidy-todos": """---
name: tidy-todos
description: Look over the open todos and suggest what to drop.
required: [todos]
---
1. List the open todos.
2. Suggest which to drop.
""",
    "deep-review": """---
name: deep-review
description: A careful review that needs a larger model and more rounds.
model: large
rounds: 4
---
1. List the todos.
2. Search the notes.
3. Write the review.
""",
    "quick-look": """---
name: quick-look
description: A quick look that asks for a small model and few rounds.
model: small
rounds: 3
---
1. Look quickly.
""",
    "agenda": """---
name: agenda
description: Say what is on the calendar on a day.
toolsets: [calendar]
rounds: 4
required: [list_events]
---
1. List the events of the day.
2. Report them in one line each.
""",
    "email-digest": """---
name: email-digest
description: Summarise the unread mail.
toolsets: [github]
---
1. List unread mail.
""",
}


def make_catalog(*names: str) -> SkillCatalog:
    chosen = names or tuple(SKILLS)
    return SkillCatalog([parse_skill(SKILLS[n], source=f"{n}.md") for n in chosen])


# Reading what went over the wire.
def tool_names(request: Received) -> list[str]:
    return [t["name"] for t in request.body.get("tools", [])]


def outputs(request: Received) -> list[str]:
    return [i["output"] for i in request.body["input"] if i.get("type") == "function_call_output"]


def user_texts(request: Received) -> list[str]:
    return [i["content"] for i in request.body["input"] if i.get("role") == "user"]


async def turn_record(db: Database, turn_id: Any) -> dict[str, Any]:
    row = await db.fetchrow("SELECT * FROM turns WHERE id = $1", turn_id)
    out = dict(row)
    for key in ("skills", "rounds", "tool_calls", "staged_writes"):
        if out.get(key) is not None:
            out[key] = json.loads(out[key])
    return out
