"""One text turn from the person's message to a reply, and what happens once it was delivered.

The gateway records the inbound message first (idempotent on the provider's id), then calls
:func:`run_turn`, sends ``TurnOutcome.reply`` and reports the result with :func:`deliver`, which
commits the writes the turn staged (delivered) or drops them (not delivered).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from core.conversation import PromptPart, PromptRecord, open_turn, update_turn
from core.memory import MemoryConfig
from core.metrics import metrics
from core.models.select import ModelPlan, SelectRequest, TierInfo, select_models
from core.models.types import ChatMessage, ModelService, ToolCall
from core.owner_context import context_reads, owner_context, session_tools
from core.quality.detectors import TurnView, detector_states, record_firings, run_detectors
from core.records.folders import active_for
from core.records.rooms import room_skill_sources
from core.records.skills import USER_SKILLS_SELECT, skill_sources
from core.store.pool import connection
from core.store.queries import Queries
from core.tools.connectors import Connectors, web_window
from core.tools.context import SessionContext, SessionKind, Trust
from core.tools.folder import CONNECTION as FOLDER
from core.tools.folder import folder_tools
from core.tools.gate import Gate, default_gate
from core.tools.mcp import McpHub, account_tools, server_toolsets
from core.tools.registry import ToolContext, ToolRegistry
from core.tools.runner import CallOutcome, run_call
from core.tools.staging import ResolvedWrite, commit_turn_writes, drop_turn_writes
from core.tools.starter import starter_registry
from core.tracing import remember_turn, traced
from core.usage.breaker import (
    BREAKER_SELECT,
    PAUSE_FOR,
    PAUSED_REPLY,
    STRIKES,
    conversation_key_for,
    tripped_notice,
)
from core.usage.breaker import record as record_strike
from core.usage.config import UsageConfig
from core.usage.ledger import (
    add_usage,
    calls_usage,
    rounds_usage,
    tier_change,
    tier_notice,
    usage_select,
    usage_state,
)
from text_loop.config import HarnessConfig
from text_loop.harness import drive
from text_loop.loop import NO_MODEL_REPLY, CallRunner, LoopResult, TurnLoop
from text_loop.prompt import PERSONA, RULES, newest_message, stable_prefix
from text_loop.records import prompt_record
from text_loop.repair import RepairResult, repair_reply
from text_loop.skills.catalog import SkillCatalog
from text_loop.skills.runtime import Interceptor, OpenRound, SkillRuntime
from text_loop.skills.toolsets import worker_only_areas

log = logging.getLogger(__name__)

# Prompt parts a process remembers as stored before it forgets them all (and stores each again once).
MAX_KNOWN_PARTS = 10_000


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class HarnessDeps:
    """Everything a turn needs, built once at start-up and shared by every turn."""

    db: Queries
    models: ModelService
    registry: ToolRegistry = field(default_factory=starter_registry)
    gate: Gate = field(default_factory=default_gate)
    config: HarnessConfig = field(default_factory=HarnessConfig)
    clock: Callable[[], datetime] = _utc_now
    persona: str = PERSONA
    rules: str = RULES
    # Skills and workers (``text_loop.skills``); None: no skills, every visible tool on the orchestrator.
    skills: SkillCatalog | None = None
    # Outside services configured on this server (SMTP, Google); with the person's connections in
    # Postgres they decide which connected tools a turn sees.
    connectors: Connectors | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # Prices, caps and usage tiers (``core.usage``), applied by the ``model_select`` slot.
    usage: UsageConfig = field(default_factory=UsageConfig)
    # The process's MCP sessions (``core.tools.mcp``); None: MCP servers people connected are not used.
    mcp: McpHub | None = None
    # Hashes of the prompt parts (``core.conversation.PromptPart``) this process stored durably or
    # found stored: a turn record names them without sending them again.
    stored_prompt_parts: set[bytes] = field(default_factory=set)


@dataclass(frozen=True)
class TurnOutcome:
    """What the gateway needs after a turn. ``reply`` is always set, even when the model failed.

    ``status``: replied, capped, recovered (an empty reply was rescued), empty (not rescued),
    no-model (none configured, or the ``model_select`` slot chose none), model-error, over-cap (the
    person is at the day's usage cap: a fixed line, no model call), harness-error (the ``harness``
    slot's occupant failed; the turn was not run again), paused (the circuit breaker paused the
    conversation, ``core.usage.breaker``). When the model did not answer, the reply is a plain
    apology and the turn's staged writes are already dropped.
    """

    turn_id: UUID
    reply: str
    status: str
    rounds: int
    staged_writes: int
    model: str | None
    repaired: bool
    harness_ms: float
    model_ms: float

    @property
    def capped(self) -> bool:
        return self.status == "capped"


def session_record(session: SessionContext) -> dict[str, Any]:
    return session.as_record()


def turn_parts(
    result: LoopResult,
    *,
    prompt: PromptRecord,
    repair: RepairResult | None,
    started: float,
    extra_model_ms: float = 0.0,
) -> dict[str, Any]:
    """The JSON parts of a finished turn record."""
    total_ms = (time.perf_counter() - started) * 1000
    model_ms = result.model_ms + extra_model_ms
    calls = [o.as_record() for o in result.calls]
    rounds = list(result.rounds)
    if repair is not None:
        rounds.append({"n": len(rounds) + 1, "purpose": "repair", **repair.as_record()})
    return {
        "prompt": prompt,
        "rounds": rounds,
        "tool_calls": calls,
        "gate_decisions": [
            {"call_id": o.call.id, "name": o.call.name, **o.gate.as_record()} for o in result.calls if o.gate
        ],
        "staged_writes": [
            {"call_id": o.call.id, "tool": o.call.name, **o.write}
            for o in result.calls
            if o.write is not None and o.write.get("staged")
        ],
        "usage": result.usage,
        "timings": {
            "total_ms": round(total_ms, 3),
            "model_ms": round(model_ms, 3),
            "harness_ms": round(total_ms - model_ms, 3),
        },
    }


def _turn_span(arguments: Any) -> dict[str, Any]:
    return {
        "account_id": arguments["account_id"],
        "channel": arguments["channel"],
        "kind": arguments.get("kind", "live"),
        "trust": arguments.get("trust", "owner_verified"),
    }


def _turn_outcome(outcome: TurnOutcome, _: Any) -> dict[str, Any]:
    remember_turn(outcome.turn_id)  # inside the turn's span: its delivery, reported later, joins it
    return {"turn_id": outcome.turn_id, "status": outcome.status, "rounds": outcome.rounds, "model": outcome.model}


@traced("pepper.turn", _turn_span, _turn_outcome)
async def run_turn(
    deps: HarnessDeps,
    account_id: UUID,
    channel: str,
    text: str,
    *,
    kind: SessionKind = "live",
    trust: Trust = "owner_verified",
    inbound_message_ids: Sequence[int] = (),
    connections: frozenset[str] | None = None,
    tier: str | None = None,
    room_id: UUID | None = None,
    progress: Callable[[dict[str, str]], None] | None = None,
) -> TurnOutcome:
    """Run one turn for ``text`` from the account's person and return the reply to send.

    ``progress``, when given, is told what an open chat can show while the turn runs (the reply's
    text as it streams, each tool as it starts), as ``{"conversation_id", "turn_id", "kind", "text"}``.

    Records the turn (every round, call, gate decision and staged write) in ``turns``. Raises
    ``NotFound`` for an unknown account; model failures do not raise (see ``TurnOutcome.status``).

    ``tier`` given: the turn runs on it and the ``model_select`` slot is not asked; otherwise the
    slot's occupant plans the turn once (``core.models.select``), from the person's usage tier.
    Cancelling the task cancels the turn: its staged writes stay staged and the crash rule in
    ``core.tools.staging`` drops them later. ``room_id``: the room a ``room`` turn speaks in (its
    tools reach that room's data only).
    """
    started = time.perf_counter()
    db = deps.db
    now = deps.clock()
    explicit_tier = tier
    tier = tier or deps.config.tier
    # Memory and the dossier are personal: only a verified owner outside a room sees them.
    personal = trust == "owner_verified" and kind != "room"
    # A turn holds at most one pool connection at a time: a query on ``db`` while ``conn`` is held
    # would wait for a second one, and concurrent turns holding the whole pool would wait forever.
    turn_id: UUID | None = None
    try:
        # Skills are the verified owner's: their workers' tools are the person's (a caller who has
        # not proved who they are would be shown skills whose every tool the gate hides).
        catalog = deps.skills if trust == "owner_verified" else None
        # The reads that come before the first model call ride on the statement that opens the turn.
        # The owner context (``core.owner_context``, as a verified call builds it) and the skills.
        reads = context_reads(deps.connectors, personal=personal, connections=connections is None)
        if catalog and trust == "owner_verified" and kind != "room":
            # A person's own skills are theirs: a room turn lists the built-in ones and those shared with the room.
            reads["skills"] = USER_SKILLS_SELECT
        reads["usage"] = usage_select(now)
        if kind != "scheduled":  # a scheduled task has a breaker of its own (``text_loop.scheduler``)
            reads["breaker"] = BREAKER_SELECT
        wanted = list(reads)
        async with connection(db, stateless=True) as conn:
            opened = await open_turn(
                conn, account_id, channel=channel, kind=kind, inbound_message_ids=inbound_message_ids,
                extra=[reads[name] for name in wanted],
            )  # fmt: skip
            turn_id, conversation_id, timezone = opened.turn_id, opened.conversation_id, opened.timezone
            got = dict(zip(wanted, opened.extra, strict=True))
            # The person's connected accounts decide which tools exist for this turn.
            context = await owner_context(
                conn, account_id, conversation_id, timezone, now, got, personal=personal, memory=deps.memory,
                connections=connections, exclude_message_ids=inbound_message_ids,
                web=web_window(deps.connectors, deps.registry), text=text,
            )  # fmt: skip
            names = context.connections
            # A folder lent from `pepper chat --folder`: its read-only tools, in that session's turns.
            lent = (
                await active_for(conn, account_id, inbound_message_ids)
                if channel == "web" and personal and kind == "live"
                else None
            )
            lent_tools = folder_tools(*lent) if lent is not None else []
            if lent_tools:
                names = names | {FOLDER}
            session = SessionContext(
                kind, trust, channel, account_id, conversation_id, turn_id, timezone, names, room_id=room_id
            )
            dossier, memory = context.dossier, context.memory
            own_skills = skill_sources(got["skills"]) if "skills" in got else []
            if catalog is not None and kind == "room" and room_id is not None:
                # Skills members shared with the room, read by reference: their current text, with
                # their limits checked again when one is activated here.
                own_skills = await room_skill_sources(conn, room_id)
            # The person's approved MCP tools exist for this turn only, behind their tool sets.
            servers = sorted(n.removeprefix("mcp:") for n in context.connections if n.startswith("mcp:"))
            mcp_tools = await account_tools(conn, deps.mcp, account_id) if deps.mcp and servers and catalog else []
    except Exception as exc:
        if turn_id is not None:
            await _failed(deps, turn_id, exc, channel, kind)  # after the connection went back to the pool
        raise
    wrote = False  # whether a call of this turn (a worker's included) wrote or staged anything
    try:
        usage = usage_state(got["usage"], deps.usage)
        notice = None
        if usage.tier != usage.told:
            notice = tier_notice(usage.tier)
            await tier_change(db, account_id, now, usage.tier)
        if explicit_tier is None:
            request = SelectRequest(account_id, tier, kind, usage.tier, deps.usage, tier_infos(deps.models))
            plan = await select_models(db, request)
        else:
            plan = ModelPlan((explicit_tier,))
        # The orchestrator's tools come from the shared registry only; MCP tools join the turn's.
        tools = session_tools(deps.registry, deps.gate, session)
        registry = deps.registry.with_tools([*mcp_tools, *lent_tools]) if mcp_tools or lent_tools else deps.registry
        if lent_tools:
            lent_shown = [t for t in lent_tools if not deps.gate.hides(t, session)]
            tools = sorted([*tools, *lent_shown], key=lambda t: t.name)
        if plan.read_only:
            tools = [t for t in tools if not t.writes]
        messages = [newest_message(text, now, timezone)]

        def open_round(names: frozenset[str], intercept: Interceptor | None) -> AbstractAsyncContextManager[CallRunner]:
            @asynccontextmanager
            async def tool_round() -> AsyncIterator[CallRunner]:
                # One pool connection for the round's calls, taken when a call first needs it and
                # given back before an intercepted call (a worker skill runs rounds of its own):
                # a turn never holds one connection while waiting for another.
                stack = AsyncExitStack()
                held: list[Any] = []

                async def execute(call: ToolCall) -> CallOutcome:
                    nonlocal stack, wrote
                    if intercept is not None:
                        if held:
                            held.clear()
                            await stack.aclose()
                            stack = AsyncExitStack()
                        handled = await intercept(call)
                        if handled is not None:
                            return handled
                    if not held:
                        held.append(await stack.enter_async_context(connection(db, stateless=True)))
                    # The turn's finished record is a durable commit made before the reply goes
                    # out whenever a call wrote or staged something: the calls need not wait.
                    ctx = ToolContext(session, held[0], now, flushed_later=True)
                    outcome = await run_call(registry, deps.gate, ctx, call, visible=names)
                    if outcome.write is not None:
                        wrote = True
                    return outcome

                try:
                    yield execute
                finally:
                    await stack.aclose()

            return tool_round()

        runtime: SkillRuntime | None = None
        if catalog is not None:
            if servers:
                catalog = catalog.with_servers(server_toolsets(servers))
            # Tool sets behind workers reach a prompt only when a worker skill that names them runs.
            hidden = worker_only_areas(catalog.toolsets)
            tools = [t for t in tools if t.area not in hidden]
            runtime = skill_runtime(
                deps, catalog, session, open_round, messages[0], own_skills,
                conversation_key=str(conversation_id), background=kind == "scheduled", registry=registry,
            )  # fmt: skip
        specs = [t.spec for t in tools]
        visible = frozenset(t.name for t in tools)
        skill_spec = runtime.spec if runtime is not None else None
        if skill_spec is not None:
            specs = sorted([*specs, skill_spec], key=lambda spec: spec.name)
        listing = runtime.view.listing() if runtime is not None else ()
        system_stable = stable_prefix(persona=deps.persona, rules=deps.rules, skills=listing, dossier=dossier)

        if plan.tiers:
            tier = plan.tiers[0]
        loop = TurnLoop(
            deps.models,
            deps.config,
            system_stable=system_stable,
            system_dynamic=memory,
            tools=specs,
            messages=messages,
            tool_round=lambda: open_round(visible, runtime.intercept if runtime is not None else None),
            round_cap=deps.config.round_cap(kind),
            conversation_key=str(conversation_id),
            tier=tier,
            background=kind == "scheduled",
            time_budget=deps.config.time_budget(kind),
            fallback_tiers=plan.tiers[1:],
        )
        if runtime is not None:
            runtime.attach(loop)
        if progress is not None:
            ids = {"conversation_id": str(conversation_id), "turn_id": str(turn_id)}
            loop.progress = lambda kind, piece: progress({**ids, "kind": kind, "text": piece})
        breaker = got.get("breaker")
        if breaker is not None and now - breaker < PAUSE_FOR:
            result = LoopResult(PAUSED_REPLY, "paused")
        elif plan.reply is not None:
            result = LoopResult(plan.reply, "over-cap")
        elif not plan.tiers:
            result = LoopResult(NO_MODEL_REPLY, "no-model", error="no-model-selected")
        else:
            result = await drive(db, account_id, loop)
        # The turn's model calls, its skill workers' and those its tools made (the research helper's).
        workers = [r for w in runtime.workers for r in w.get("rounds", ())] if runtime is not None else []
        await _count(deps, account_id, rounds_usage([*result.rounds, *workers], deps.usage),
                     calls_usage((u for c in result.calls for u in c.model_usage), deps.usage),
                     labels=(channel, kind))  # fmt: skip
        if "breaker" in got and (result.status in STRIKES or breaker is not None) and result.status != "paused":
            key = conversation_key_for(account_id)
            if await record_strike(db, key, account_id, result.status, now, deps.usage.breaker_failures):
                notice = tripped_notice("this conversation", deps.usage.breaker_failures)
        if notice is not None and plan.reply is None:
            result.reply = f"{result.reply}\n\n({notice})"
        return await finish_turn(
            deps,
            session,
            result,
            tier=loop.tier,
            started=started,
            skills=runtime.record(result) if runtime is not None else None,
            wrote=wrote,
            prompt=prompt_record(system_stable=system_stable, system_dynamic=memory, tools=specs, messages=messages),
        )
    except Exception as exc:
        await _failed(deps, turn_id, exc, channel, kind)
        raise


async def _count(deps: HarnessDeps, account_id: UUID, *used: tuple[int, Decimal, int], labels: tuple[str, str]) -> None:
    """A turn's model use into the account's usage and the metrics (``labels``: channel, kind)."""
    tokens = sum(u[0] for u in used)
    cost = sum((u[1] for u in used), Decimal(0))
    calls = sum(u[2] for u in used)
    if calls:
        await add_usage(deps.db, account_id, deps.clock(), tokens=tokens, cost=cost, model_calls=calls)
        counted = metrics()
        counted.turn_tokens.labels(*labels).inc(tokens)
        counted.turn_cost.labels(*labels).inc(float(cost))


def tier_infos(models: Any) -> tuple[TierInfo, ...]:
    """The model service's configured tiers, for ``model_select`` (none from a service without
    tiers, such as a scripted one)."""
    found = getattr(models, "tiers", None)
    if not isinstance(found, dict):
        return ()
    return tuple(TierInfo(name, tuple(c.model for c in tier.mix)) for name, tier in found.items())


async def _failed(deps: HarnessDeps, turn_id: UUID, exc: Exception, channel: str, kind: str) -> None:
    log.error("turn failed: turn=%s error=%s", turn_id, type(exc).__name__, exc_info=exc)
    metrics().turns.labels(channel, kind, "crashed").inc()
    await drop_turn_writes(deps.db, deps.registry, turn_id)
    await update_turn(deps.db, turn_id, status="failed", error=type(exc).__name__, finished_at=deps.clock())


async def _record_finished_turn(
    conn: Queries,
    session: SessionContext,
    result: LoopResult,
    tier: str,
    reply: str,
    finished_at: datetime,
    columns: dict[str, Any],
    parts: dict[str, Any],
    *,
    wait_for_disk: bool,
    store_parts: Sequence[PromptPart],
) -> None:
    assert session.turn_id is not None
    await update_turn(
        conn,
        session.turn_id,
        wait_for_disk=wait_for_disk,
        store_parts=store_parts,
        status="replied",
        model=result.model,
        tier=tier,
        trust=session.trust,
        session=session.as_record(),
        reply=reply,
        error=result.error,
        finished_at=finished_at,
        **columns,
        **parts,
    )  # fmt: skip


def skill_runtime(
    deps: HarnessDeps, catalog: SkillCatalog, session: SessionContext, open_round: OpenRound,
    person_message: ChatMessage, own_skills: Sequence[tuple[str, str]], *, conversation_key: str,
    background: bool, worker_tier: str | None = None, registry: ToolRegistry | None = None,
) -> SkillRuntime:  # fmt: skip
    """The skills of one turn (or of its replay, whose workers run on ``worker_tier``); ``registry``:
    the turn's own, when it has tools the shared one lacks (the person's MCP tools, a lent folder)."""
    registry = registry or deps.registry
    view = catalog.view(registry, own_skills)
    for problem in view.problems:
        if problem.origin == "user":
            log.warning("user skill unusable: skill=%s problem=%s", problem.skill, problem.problem)
    view.problems = [p for p in view.problems if p.origin == "user"]
    return SkillRuntime(
        catalog=catalog, view=view, models=deps.models, config=deps.config, registry=registry, gate=deps.gate,
        session=session, open_round=open_round, persona=deps.persona, rules=deps.rules,
        person_message=person_message, conversation_key=conversation_key, background=background,
        worker_tier=worker_tier,
    )  # fmt: skip


async def _detect(
    db: Queries, result: LoopResult, reply: str, skills: dict[str, Any] | None
) -> tuple[str, list[dict[str, Any]]]:
    """The quality detectors over the finished reply (``core.quality.detectors``): shadow ones
    only record, promoted ones may change the reply. Anything broken lets the reply through."""
    try:
        view = TurnView(reply, [c.as_record() for c in result.calls], (skills or {}).get("flags", ()))
        applied = run_detectors(view, await detector_states(db))
        return applied.reply, applied.firings
    except Exception as exc:
        log.warning("quality detectors failed; the reply goes out as it was: error=%s", type(exc).__name__)
        return reply, []


async def finish_turn(
    deps: HarnessDeps,
    session: SessionContext,
    result: LoopResult,
    *,
    tier: str,
    started: float,
    prompt: PromptRecord,
    replay_of: UUID | None = None,
    skills: dict[str, Any] | None = None,
    wrote: bool = True,
) -> TurnOutcome:
    """Record the finished turn in one statement and return its outcome.

    ``wrote``: a call of the turn wrote or staged something without waiting for the disk. The
    record's commit then waits for it, which flushes those writes too, before the reply can go
    out. Otherwise the record is bookkeeping (the gateway records the reply as a message, durably)
    and does not wait.
    """
    assert session.turn_id is not None
    db = deps.db
    reply = result.reply
    repair: RepairResult | None = None
    if result.answered and session.channel in deps.config.repair_channels:
        repair = await repair_reply(deps.models, reply, deps.config, conversation_key=str(session.conversation_id))
        reply = repair.text
        await _count(deps, session.account_id, calls_usage(repair.usage, deps.usage),
                     labels=(session.channel, session.kind))  # fmt: skip
    firings: list[dict[str, Any]] = []
    if result.answered and replay_of is None:
        reply, firings = await _detect(db, result, reply, skills)
    if not result.answered:
        # The reply is an apology that describes none of the turn's work: nothing it staged may commit.
        await drop_turn_writes(db, deps.registry, session.turn_id)
    parts = turn_parts(
        result, prompt=prompt, repair=repair, started=started, extra_model_ms=repair.model_ms if repair else 0.0
    )
    columns: dict[str, Any] = {"replay_of": replay_of} if replay_of is not None else {}
    if skills is not None:
        columns["skills"] = skills
    known = deps.stored_prompt_parts
    new_parts = [p for p in prompt.parts if p.hash not in known]
    async with connection(db, stateless=True) as conn:
        # A record that stores a part always waits for the disk (``update_turn``): later records
        # name the part without storing it. Once per new system prefix or tool set, not per turn.
        await _record_finished_turn(
            conn, session, result, tier, reply, deps.clock(), columns, parts,
            wait_for_disk=wrote, store_parts=new_parts,
        )  # fmt: skip
    if firings:
        try:
            await record_firings(db, session.turn_id, session.account_id, firings)
        except Exception as exc:  # a shadow record must never cost the reply
            log.warning("recording detector firings failed: error=%s", type(exc).__name__)
    if new_parts:
        if len(known) >= MAX_KNOWN_PARTS:  # many accounts' prefixes over a long uptime
            known.clear()
        known.update(p.hash for p in new_parts)
    timings = parts["timings"]
    # The outcome's figure also covers writing the record itself, which the record cannot hold.
    elapsed = time.perf_counter() - started
    harness_ms = elapsed * 1000 - timings["model_ms"]
    rounds = len([r for r in result.rounds if r.get("counted")])
    counted = metrics()
    counted.turns.labels(session.channel, session.kind, result.status).inc()
    counted.turn_seconds.labels(session.channel).observe(elapsed)
    counted.turn_rounds.labels(session.channel).observe(rounds)
    counted.turn_model_rounds.labels(session.channel, session.kind).inc(rounds)
    if repair and repair.changed:
        counted.turns_repaired.labels(session.channel, session.kind).inc()
    return TurnOutcome(
        turn_id=session.turn_id,
        reply=reply,
        status=result.status,
        rounds=rounds,
        staged_writes=len(parts["staged_writes"]) if result.answered else 0,
        model=result.model,
        repaired=bool(repair and repair.changed),
        harness_ms=round(harness_ms, 3),
        model_ms=timings["model_ms"],
    )


@traced(
    "pepper.delivery",
    lambda a: {"turn_id": a["turn_id"], "delivered": a["ok"]},
    lambda writes, _: {"writes": len(writes)},
    turn="turn_id",
)
async def deliver(
    deps: HarnessDeps, turn_id: UUID, ok: bool, *, detail: dict[str, Any] | None = None
) -> list[ResolvedWrite]:
    """Report whether the turn's reply reached the person.

    ``ok=True`` commits every write the turn staged, ``ok=False`` drops them; either way the turn
    record gets the delivery. Safe to call twice: the second call finds nothing staged.
    """
    delivery = {"ok": ok, **(detail or {})}
    if ok:
        writes = await commit_turn_writes(deps.db, deps.registry, turn_id)
        await update_turn(
            deps.db,
            turn_id,
            status="delivered",
            delivered_at=deps.clock(),
            delivery=delivery,
            committed_writes=[w.as_record() for w in writes if w.status == "committed"],
        )
    else:
        writes = await drop_turn_writes(deps.db, deps.registry, turn_id)
        await update_turn(deps.db, turn_id, status="failed", delivery={**delivery, "dropped": len(writes)})
    return writes
