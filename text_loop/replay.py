"""Replay: run a recorded turn again on another model tier or setting.

The replay starts from the recorded prompt (prefix, memory block, tools, the person's message).
Tools never run: each call gets the result recorded for the same tool and arguments in the
original turn, or a plain failure when the original made no such call. Writes therefore never
run again, and nothing is staged. The replay is itself recorded, as a turn of kind ``replay``
pointing at the original (``replay_of``).
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.conversation import start_turn, turn_record
from core.errors import InvalidInput, NotFound
from core.models.types import ChatMessage, ToolCall
from core.records.skills import list_skills
from core.tools.context import SessionContext
from core.tools.runner import CallOutcome, render_failed
from text_loop.loop import CallRunner, TurnLoop
from text_loop.prompt import canonical_arguments
from text_loop.records import message_from_record, prompt_record_from_json, tool_spec_from_record
from text_loop.skills.runtime import Interceptor, OpenRound, SkillRuntime
from text_loop.turn import HarnessDeps, finish_turn, skill_runtime

NOT_RECORDED = "the original turn made no such call, so replay has no result for it"


@dataclass(frozen=True)
class ReplayOutcome:
    original_turn_id: UUID
    replay_turn_id: UUID
    old_reply: str
    new_reply: str
    old_model: str | None
    new_model: str | None
    tier: str
    status: str
    unmatched_calls: int


def _recorded_results(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        if record["status"] == "repeat":
            continue
        found.setdefault((record["name"], canonical_arguments(record["arguments"])), []).append(record)
    return found


async def replay_turn(deps: HarnessDeps, turn_id: UUID, *, tier: str | None = None) -> ReplayOutcome:
    """Replay one turn on ``tier`` (default: the tier it ran on); never runs a tool or a write."""
    started = time.perf_counter()
    row = await turn_record(deps.db, turn_id)
    if row is None:
        raise NotFound(f"no turn {turn_id}")
    if row["whole_prompt"] is None or row["session"] is None:
        raise InvalidInput(f"turn {turn_id} has no recorded prompt to replay")
    prompt = json.loads(row["whole_prompt"])
    stored = (row["prompt_prefix"], row["prompt_tools"])
    if (stored[0] is not None and prompt.get("system_stable") is None) or (
        stored[1] is not None and prompt.get("tools") is None
    ):
        raise InvalidInput(f"turn {turn_id}: a part of its recorded prompt is missing from prompt_parts")
    if "system_stable" not in prompt:  # a call's record: its prompt is only the opening notice
        raise InvalidInput(f"turn {turn_id} has no recorded prompt to replay")
    original = json.loads(row["session"])
    recorded = _recorded_results(json.loads(row["tool_calls"]))
    tier = tier or row["tier"] or deps.config.tier
    new_turn = await start_turn(deps.db, row["conversation_id"], channel=row["channel"], kind="replay")
    session = SessionContext(
        original["kind"],
        original["trust"],
        row["channel"],
        UUID(original["account_id"]),
        row["conversation_id"],
        new_turn,
        original.get("timezone", "UTC"),
        frozenset(original.get("connections", ())),
    )
    unmatched = 0

    async def execute(call: ToolCall) -> CallOutcome:
        nonlocal unmatched
        queue = recorded.get((call.name, canonical_arguments(call.arguments)))
        if not queue:
            unmatched += 1
            return CallOutcome(call, "failed", render_failed(NOT_RECORDED), call.arguments)
        record = queue.pop(0) if len(queue) > 1 else queue[0]
        write = {"summary": record["write"]["summary"], "replayed": True} if record.get("write") else None
        return CallOutcome(
            call,
            record["status"],
            record["content"],
            record.get("gated_arguments", record["arguments"]),
            writes=record.get("writes", False),
            write=write,
        )

    def open_round(names: frozenset[str], intercept: Interceptor | None) -> AbstractAsyncContextManager[CallRunner]:
        @asynccontextmanager
        async def tool_round() -> AsyncIterator[CallRunner]:
            async def run(call: ToolCall) -> CallOutcome:
                # A skill's activation runs its worker again (on this tier, with recorded results).
                handled = await intercept(call) if intercept is not None else None
                return handled if handled is not None else await execute(call)

            yield run

        return tool_round()

    messages = [message_from_record(m) for m in prompt["messages"]]
    runtime = await _skill_runtime(deps, session, row, messages, open_round, tier)
    loop = TurnLoop(
        deps.models,
        deps.config,
        system_stable=prompt["system_stable"],
        system_dynamic=prompt["system_dynamic"],
        tools=[tool_spec_from_record(t) for t in prompt["tools"]],
        messages=messages,
        tool_round=lambda: open_round(frozenset(), runtime.intercept if runtime is not None else None),
        round_cap=deps.config.round_cap(original["kind"]),
        conversation_key=str(row["conversation_id"]),
        tier=tier,
    )
    if runtime is not None:
        runtime.attach(loop)
    result = await loop.run()
    outcome = await finish_turn(
        deps,
        session,
        result,
        tier=tier,
        started=started,
        replay_of=turn_id,
        skills=runtime.record(result) if runtime is not None else None,
        prompt=prompt_record_from_json(prompt, prefix_hash=stored[0], tools_hash=stored[1]),
    )
    return ReplayOutcome(
        original_turn_id=turn_id,
        replay_turn_id=new_turn,
        old_reply=row["reply"] or "",
        new_reply=outcome.reply,
        old_model=row["model"],
        new_model=outcome.model,
        tier=tier,
        status=outcome.status,
        unmatched_calls=unmatched,
    )


async def _skill_runtime(
    deps: HarnessDeps, session: SessionContext, row: Any, messages: list[ChatMessage], open_round: OpenRound,
    tier: str,
) -> SkillRuntime | None:  # fmt: skip
    """The skills of a turn that listed some, so a worker runs again rather than its recorded
    report coming back, and a worker's direct report stays the reply (no extra generation)."""
    if deps.skills is None or row["skills"] is None or session.trust == "third_party" or not messages:
        return None
    own = [(s.name, s.source) for s in await list_skills(deps.db, session.account_id)]
    return skill_runtime(
        deps, deps.skills, session, open_round, messages[0], own,
        conversation_key=str(row["conversation_id"]), background=False, worker_tier=tier,
    )  # fmt: skip


def side_by_side(left_title: str, left: str, right_title: str, right: str, width: int = 58) -> list[str]:
    """Two texts in columns, wrapped to ``width`` characters each."""

    def column(text: str) -> list[str]:
        lines: list[str] = []
        for paragraph in text.splitlines() or [""]:
            lines.extend(textwrap.wrap(paragraph, width) or [""])
        return lines

    a, b = column(left), column(right)
    a += [""] * (len(b) - len(a))
    b += [""] * (len(a) - len(b))
    out = [f"{left_title:<{width}} | {right_title}", f"{'-' * width}-+-{'-' * width}"]
    out += [f"{x:<{width}} | {y}" for x, y in zip(a, b, strict=True)]
    return out
