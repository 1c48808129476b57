"""The full record of what a period covers: its messages and its turns, as summary input.

Summaries are built from these records only, never from other summaries (errors compound).
Scheduled runs are included here: the summaries are how they are remembered (the search index
leaves them out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.conversation import Message, _message
from core.memory.config import MemoryConfig
from core.memory.exchanges import render_exchanges, split_exchanges
from core.store.queries import Queries
from core.untrusted import CALLER_LABEL, quoted

TOOL_RESULT_CHARS = 300
TOOL_ARGS_CHARS = 200
# Turns of someone other than the person: what their tool calls carry is a caller's words.
STRANGERS = {
    "third_party": "the answering service, with a caller who is not the person",
    "owner_unverified": "a caller who had not proved they are the person",
}


@dataclass(frozen=True)
class TurnRecord:
    id: UUID
    kind: str
    channel: str
    started_at: datetime
    tool_calls: tuple[dict[str, Any], ...]
    reply: str | None
    trust: str | None = None  # the session's at the end of the turn; None for an unfinished one


@dataclass(frozen=True)
class PeriodRecords:
    messages: tuple[Message, ...]
    turns: tuple[TurnRecord, ...]

    @property
    def empty(self) -> bool:
        return not self.messages and not self.turns

    @property
    def callers(self) -> bool:
        """Whether the records hold words of someone other than the person."""
        return any(m.author is not None for m in self.messages) or any(
            _stranger(t) is not None or any(_stranger_call(c) for c in t.tool_calls) for t in self.turns
        )


def _stranger_call(call: Any) -> bool:
    """A tool call made before the caller proved who they are (in a call verified later)."""
    return isinstance(call, dict) and str(call.get("trust")) in STRANGERS


def _stranger(turn: TurnRecord) -> str | None:
    """Who the turn's tool calls speak for when it is not the person; None for the person."""
    trust = turn.trust or ("owner_unverified" if turn.kind == "call" else "")  # an unfinished call: unproven
    return STRANGERS.get(trust)


async def period_records(db: Queries, conversation_id: UUID, start: datetime, until: datetime) -> PeriodRecords:
    """Every message and every turn (replays excepted) in ``[start, until)``."""
    messages = await db.fetch(
        "SELECT * FROM messages WHERE conversation_id = $1 AND created_at >= $2 AND created_at < $3"
        " ORDER BY created_at, id",
        conversation_id,
        start,
        until,
    )
    turns = await db.fetch(
        "SELECT id, kind, channel, started_at, tool_calls, reply, trust, session->>'channel' AS session_channel"
        " FROM turns"
        " WHERE conversation_id = $1 AND started_at >= $2 AND started_at < $3 AND kind <> 'replay'"
        " ORDER BY started_at, id",
        conversation_id,
        start,
        until,
    )
    return PeriodRecords(
        tuple(_message(r) for r in messages),
        tuple(
            TurnRecord(
                r["id"],
                r["kind"],
                r["session_channel"] or r["channel"],
                r["started_at"],
                tuple(_json(r["tool_calls"]) or ()),
                r["reply"],
                r["trust"],
            )
            for r in turns
        ),
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_records(records: PeriodRecords, timezone: str, config: MemoryConfig) -> str:
    """The records as plain text for the summarising model, within ``summary_input_chars``.

    Messages come in exchanges. Each turn that used tools lists its calls with a short result;
    a scheduled run with no message of its own shows its reply. When the text is too long, long
    message bodies are cut first, then the oldest exchanges are dropped, and the text says so.
    """
    zone = ZoneInfo(timezone)
    replied = {m.turn_id for m in records.messages if m.direction == "outbound" and m.turn_id}
    turn_lines: list[str] = []
    for turn in records.turns:
        calls = [c for c in turn.tool_calls if isinstance(c, dict)]
        silent_run = turn.kind == "scheduled" and turn.id not in replied and turn.reply
        if not calls and not silent_run:
            continue
        what = "scheduled run" if turn.kind == "scheduled" else f"{turn.kind} turn on {turn.channel}"
        stranger = _stranger(turn)
        if stranger is not None:
            what += f" ({stranger})"
        turn_lines.append(f"{turn.started_at.astimezone(zone):%a %H:%M} {what}:")
        for c in calls:
            args = _short(json.dumps(c.get("arguments", {}), sort_keys=True, default=str), TOOL_ARGS_CHARS)
            result = _short(c.get("content", ""), TOOL_RESULT_CHARS)
            # A call made before the caller proved who they are, in a call verified later.
            if stranger is None and not _stranger_call(c):
                turn_lines.append(f"  - {c.get('name')}({args}) -> {c.get('status')}: {result}")
            else:
                # The arguments (and a result echoing them) are a caller's words: quoted data.
                turn_lines.append(
                    f"  - {_short(str(c.get('name')), 60)} -> {c.get('status')}. {CALLER_LABEL}"
                    f" arguments {quoted(args)}; result {quoted(result)}"
                )
        if silent_run:
            turn_lines.append(f"  reply (not sent as a message): {_short(turn.reply or '', 1_000)}")
    exchanges = split_exchanges(records.messages, config.exchange_gap)
    for trim in (None, config.summary_message_chars, config.summary_message_chars // 4):
        lines = render_exchanges(exchanges, timezone, trim=trim)
        text = _assemble(lines, turn_lines)
        if len(text) <= config.summary_input_chars:
            return text
    dropped = 0
    while len(text) > config.summary_input_chars and exchanges:
        exchanges = exchanges[1:]
        dropped += 1
        lines = render_exchanges(exchanges, timezone, trim=config.summary_message_chars // 4)
        text = _assemble(lines, turn_lines, dropped=dropped)
    return text[: config.summary_input_chars]


def _assemble(lines: list[str], turn_lines: list[str], *, dropped: int = 0) -> str:
    parts = []
    if dropped:
        parts.append(f"(The {dropped} earliest exchanges are left out: the record is too long.)")
    parts.append("Messages, in exchanges:\n" + ("\n".join(lines) if lines else "(none)"))
    if turn_lines:
        parts.append("What Pepper did (tool calls and scheduled runs):\n" + "\n".join(turn_lines))
    return "\n\n".join(parts)
