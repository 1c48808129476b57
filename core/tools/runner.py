"""Run one tool call the same way for text turns and voice calls: look up, gate, run, write.

The model sees a short text; the log gets the full exception. Writes are applied at once or
staged with the turn, as the tool declares.

Writing calls of one turn run one after another (a per-turn lock from the gate's decision to the
applied write): a call runs the model's tool calls at once, and a per-turn limit a tool checks
against what the turn already changed (at most two cancelled tasks without ``bulk``) must see the
turn's earlier writes, not race them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from core.errors import PepperError
from core.models.types import ToolCall, ToolResult
from core.store.pool import transaction
from core.tools.gate import Gate, GateDecision
from core.tools.registry import Tool, ToolContext, ToolRegistry, check_arguments
from core.tools.staging import stage_write
from core.tracing import traced
from core.untrusted import neutralise_labels

log = logging.getLogger(__name__)

CallStatus = Literal["ok", "empty", "failed", "denied", "unknown", "repeat"]

# One lock per running turn for its writing calls; gone once no call holds or waits for it.
_turn_writes: weakref.WeakValueDictionary[UUID, asyncio.Lock] = weakref.WeakValueDictionary()


def _writes_lock(turn_id: UUID) -> asyncio.Lock:
    lock = _turn_writes.get(turn_id)
    if lock is None:
        lock = _turn_writes[turn_id] = asyncio.Lock()
    return lock


@dataclass(frozen=True)
class CallOutcome:
    """One call after it ran (or did not). ``content`` is exactly what the model reads."""

    call: ToolCall
    status: CallStatus
    content: str
    arguments: dict[str, Any]
    gate: GateDecision | None = None
    writes: bool = False
    write: dict[str, Any] | None = None  # {"summary", "staged", "id"} when a write happened or was staged
    duration_ms: float = 0.0
    repeat_of: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status in ("ok", "empty")

    @property
    def wasted(self) -> bool:
        """An unknown tool or a refusal: the round did nothing the model asked for."""
        return self.status in ("unknown", "denied")

    def result(self) -> ToolResult:
        return ToolResult(self.call.id, self.call.name, self.content, is_error=not self.succeeded)

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.call.id,
            "name": self.call.name,
            "arguments": self.call.arguments,
            "status": self.status,
            "content": self.content,
            "writes": self.writes,
            "duration_ms": round(self.duration_ms, 3),
        }
        if self.arguments != self.call.arguments:
            out["gated_arguments"] = self.arguments
        if self.gate is not None:
            out["gate"] = self.gate.as_record()
        if self.write is not None:
            out["write"] = self.write
        if self.repeat_of is not None:
            out["repeat_of"] = self.repeat_of
        return out


def render_empty(what: str) -> str:
    return f"Found nothing: {what}. The lookup worked; there is no data to report."


def render_failed(reason: str) -> str:
    return f"Failed: {reason}. This is an error, not an empty result: do not say there is nothing."


def render_denied(reason: str) -> str:
    return f"Refused by Pepper's rules: {reason}. The call did not run."


def render_unknown(name: str) -> str:
    return f"Unknown tool {name!r}: no such tool is available in this conversation. Nothing ran."


@traced(
    "pepper.tool",
    lambda a: {"tool": a["call"].name, "turn_id": a["ctx"].session.turn_id},
    lambda outcome, _: {"tool_status": outcome.status},
)
async def run_call(
    registry: ToolRegistry,
    gate: Gate,
    ctx: ToolContext,
    call: ToolCall,
    *,
    visible: Collection[str] | None = None,
) -> CallOutcome:
    """Run one call. Never raises for a tool's own failure; ``CancelledError`` passes through."""
    started = time.perf_counter()
    tool = registry.get(call.name)
    if tool is None or (visible is not None and call.name not in visible):
        return CallOutcome(call, "unknown", render_unknown(call.name), call.arguments)
    turn_id = ctx.session.turn_id
    if not tool.writes or turn_id is None:
        return await _run(tool, gate, ctx, call, started)
    async with _writes_lock(turn_id):
        return await _run(tool, gate, ctx, call, started)


async def _run(tool: Tool, gate: Gate, ctx: ToolContext, call: ToolCall, started: float) -> CallOutcome:
    def done(status: CallStatus, content: str, arguments: dict[str, Any], **kw: Any) -> CallOutcome:
        return CallOutcome(
            call,
            status,
            # A result may hold someone else's words (a mail, a caller's message): never the label.
            neutralise_labels(content),
            arguments,
            writes=tool.writes,
            duration_ms=(time.perf_counter() - started) * 1000,
            **kw,
        )

    problem = check_arguments(tool.parameters, call.arguments)
    if problem is not None:
        return done("failed", render_failed(problem), call.arguments)
    decision = await gate.decide(tool, call.arguments, ctx.session)
    if not decision.allowed:
        return done("denied", render_denied(decision.reason), decision.arguments, gate=decision)
    args = decision.arguments
    try:
        outcome = await tool.handler(ctx, args)
    except Exception as exc:
        log.exception("tool failed: tool=%s", tool.name)
        return done(
            "failed", render_failed(f"{tool.name} hit an internal error ({type(exc).__name__})"), args, gate=decision
        )
    note = f" (changed by Pepper's rules: {decision.reason})" if decision.changed else ""
    if outcome.status == "empty":
        return done("empty", render_empty(outcome.content) + note, args, gate=decision)
    if outcome.status == "failed":
        return done("failed", render_failed(outcome.content), args, gate=decision)
    if outcome.write is None:
        if tool.writes:
            log.error("writing tool returned no planned write: tool=%s", tool.name)
            return done("failed", render_failed(f"{tool.name} did not say what to change"), args, gate=decision)
        return done("ok", outcome.content + note, args, gate=decision)
    if not tool.writes:
        log.error("reading tool returned a write; ignored: tool=%s", tool.name)
        return done("failed", render_failed(f"{tool.name} may not change data"), args, gate=decision)
    try:
        if tool.staged:
            write_id = await stage_write(ctx.db, ctx.session, tool, outcome.write, wait_for_disk=not ctx.flushed_later)
            content = f"Done: {outcome.write.summary}. It is saved when your reply is delivered."
            write = {"summary": outcome.write.summary, "staged": True, "id": write_id}
        else:
            # With an after-commit step the record of what is about to happen must be on disk first.
            durable = tool.after_commit is not None or not ctx.flushed_later
            async with transaction(ctx.db, wait_for_disk=durable) as conn:
                await tool.apply(conn, ctx.session.account_id, outcome.write.payload)  # type: ignore[misc]
            if tool.after_commit is not None:
                try:
                    await tool.after_commit(ctx.db, ctx.session.account_id, outcome.write.payload)
                except PepperError as exc:
                    log.warning("tool write's outside effect failed: tool=%s code=%s", tool.name, exc.code)
                    return done("failed", render_failed(exc.message), args, gate=decision)
            content = f"Done: {outcome.write.summary}."
            write = {"summary": outcome.write.summary, "staged": False}
    except Exception as exc:
        log.exception("tool write failed: tool=%s", tool.name)
        return done(
            "failed", render_failed(f"saving did not work ({type(exc).__name__}); nothing changed"), args, gate=decision
        )
    return done("ok", content + note, args, gate=decision, write=write)
