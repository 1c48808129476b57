"""Building the prompt: a byte-stable prefix first, then the memory block, the clock last.

The prefix (persona, rules, the skills list, the dossier) and the tool list change only when
their sources change, never with the time or the turn, so providers can reuse their cache. The
memory block (``core.memory.block``) follows it. The current time rides on the newest message.

Every message the harness itself adds for the model starts with :data:`LABEL`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from core.models.types import ChatMessage
from core.owner_context import dossier_section
from core.persona import CONFIRM_FIRST, NEVER_PRETEND, RESULT_WORDING, runtime_label, runtime_note_rule
from core.untrusted import neutralise_labels

LABEL = runtime_label("user")

PERSONA = f"""You are Pepper, a personal assistant that people reach by text, email and phone.
You are warm, brief and plain-spoken. You write for a phone screen: short sentences, no markdown
tables, no headings. {NEVER_PRETEND}"""

RULES = f"""Rules:
- Use the tools to look things up or change things; never invent their results.
- {RESULT_WORDING}
- {CONFIRM_FIRST}
- {runtime_note_rule("user")}
- When you have what you need, answer with text and no tool calls."""


def labelled(text: str) -> str:
    return f"{LABEL}\n{text}"


def harness_message(text: str) -> ChatMessage:
    return ChatMessage("user", labelled(text))


def skills_block(skills: Sequence[tuple[str, str]]) -> str:
    if not skills:
        return "Skills: none are installed."
    return (
        "Skills (name: what it is for). When a request matches one, call use_skill with its name first;"
        " only these skills exist:\n" + "\n".join(f"- {name}: {desc}" for name, desc in skills)
    )


def stable_prefix(*, persona: str, rules: str, skills: Sequence[tuple[str, str]], dossier: str) -> str:
    """The cacheable part. Must not contain the time, ids, or anything that varies per turn."""
    parts = [persona.strip(), rules.strip(), skills_block(skills)]
    parts.append(dossier_section(dossier))
    return "\n\n".join(parts)


def clock_line(now: datetime, timezone: str) -> str:
    local = now.astimezone(ZoneInfo(timezone))
    return labelled(f"Now: {local:%A %d %B %Y, %H:%M} ({timezone}).")


def newest_message(text: str, now: datetime, timezone: str) -> ChatMessage:
    """The person's message with the clock appended under a label. Anything in it that could pass
    for the label is neutralised first: only the harness starts a message with it."""
    return ChatMessage("user", f"{neutralise_labels(text)}\n\n{clock_line(now, timezone)}")


def canonical_arguments(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def plain_text_transcript(messages: Sequence[ChatMessage]) -> str:
    """The turn so far without tool structure, for recovery and the capped summary."""
    lines: list[str] = []
    for m in messages:
        if m.role == "user":
            lines.append(m.content if m.content.startswith(LABEL) else f"The person wrote:\n{m.content}")
        elif m.role == "assistant":
            if m.content.strip():
                lines.append(f"You wrote:\n{m.content}")
            for call in m.tool_calls:
                lines.append(f"You called {call.name} with {canonical_arguments(call.arguments)}.")
        elif m.tool_result is not None:
            lines.append(f"Result of {m.tool_result.name}:\n{m.tool_result.content}")
    return "\n\n".join(lines)
