"""Skills inside one turn: activation, inline tier and cap changes, workers, hand back, ask the user.

The orchestrator sees one extra tool, ``use_skill``, whose ``name`` can only be a listed skill.

* **Inline** skill: the steps come back as the tool result. Its ``model`` moves the rest of the
  turn to a larger tier and its ``rounds`` raises the turn's cap; a smaller tier or a lower cap is
  refused (recorded, never applied).
* **Worker** skill: a separate :class:`~text_loop.loop.TurnLoop` with the skill's steps, only the
  tools of its tool sets (as the gate lets this session see them), its own round budget and no
  ``use_skill``, so a worker cannot start another worker. Its calls pass the same gate and join the
  turn's record and staged writes.

  - *Direct report*: when the activation was the only call of its round and the orchestrator did
    not say there is more to do, the worker's report is the turn's reply; no further generation.
  - *Hand back*: a worker can call ``hand_back`` once per turn; its run ends, the orchestrator gets
    what it asked for and activates the skill again with ``details``. That second run is not
    offered ``hand_back`` at all.
  - *Ask the user*: ``ask_user`` ends the run and the turn; the question is the reply, and the
    answer starts a normal new turn.

After the turn :meth:`SkillRuntime.record` gives the ``skills`` part of the turn record, with the
required-step detector's flags.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from core.models.types import ChatMessage, ModelService, ToolCall, ToolSpec
from core.tools.connectors import CONNECTION_NAMES
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolRegistry, check_arguments
from core.tools.runner import CallOutcome, render_failed
from text_loop.config import HarnessConfig
from text_loop.loop import CallRunner, LoopResult, TurnLoop
from text_loop.prompt import LABEL
from text_loop.skills.catalog import SkillCatalog, SkillView, limit_problem
from text_loop.skills.detector import required_step_flags
from text_loop.skills.model import Skill
from text_loop.skills.toolsets import tools_of

log = logging.getLogger(__name__)

USE_SKILL = "use_skill"
HAND_BACK = "hand_back"
ASK_USER = "ask_user"

# Opens one round of tool calls: ``open_round(visible tool names, interceptor)``. The interceptor
# answers calls the registry does not hold (the skill tools); ``None`` lets the registry run it.
Interceptor = Callable[[ToolCall], Awaitable[CallOutcome | None]]
OpenRound = Callable[[frozenset[str], Interceptor | None], AbstractAsyncContextManager[CallRunner]]

HAND_BACK_SPEC = ToolSpec(
    HAND_BACK,
    "Hand one step back to Pepper's main assistant when it needs a tool you do not have. Say exactly what "
    "information you need. Your run ends; you are started again with the answer.",
    {
        "type": "object",
        "properties": {"need": {"type": "string", "minLength": 1, "maxLength": 1000}},
        "required": ["need"],
        "additionalProperties": False,
    },
)
ASK_USER_SPEC = ToolSpec(
    ASK_USER,
    "Ask the person one short question when you cannot go on without their answer or decision. "
    "Your run ends and the question is sent to them; their answer starts a new conversation turn.",
    {
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1, "maxLength": 600}},
        "required": ["question"],
        "additionalProperties": False,
    },
)


def use_skill_spec(names: Sequence[str]) -> ToolSpec:
    return ToolSpec(
        USE_SKILL,
        "Start one of the listed skills. Call it before anything else when the person's request matches a "
        "skill. You get the skill's steps to follow, or the skill runs as a worker and you get its report.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": sorted(names)},
                "request": {
                    "type": "string",
                    "maxLength": 2000,
                    "description": "What the skill should do, with anything it needs from this conversation.",
                },
                "details": {
                    "type": "string",
                    "maxLength": 4000,
                    "description": "Only after a worker handed a step back: the information it asked for.",
                },
                "more_to_do": {
                    "type": "boolean",
                    "description": "True when the person asked for more than this skill does; its report "
                    "then comes back to you instead of going straight to the person.",
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    )


WORKER_RULES = """You are running one skill as a worker for Pepper's main assistant.
- You have only the tools of this skill. Follow its steps in order; do not skip a step.
- When you are done, write your report as the reply to the person: short and plain, saying what
  you found and what you changed. It may be sent to them as it is.
- Say plainly what you could not do. Never claim a change that a tool did not confirm."""
HAND_BACK_RULE = (
    "- If a step needs information that none of your tools can get, call hand_back saying exactly what you "
    "need. Your run ends, and you are started again with the answer. This works once."
)
ASK_USER_RULE = "- If you need the person to decide or tell you something, call ask_user with one short question."


@dataclass
class _WorkerState:
    """What one worker run asked for through its control tools."""

    handed_back: str | None = None
    asked: str | None = None


@dataclass
class _Activation:
    skill: Skill
    call_id: str
    kind: str  # inline | worker
    calls_from: int  # index into the turn's calls where this skill's work starts
    record: dict[str, Any] = field(default_factory=dict)
    worker_calls: list[CallOutcome] = field(default_factory=list)
    finished: bool = False  # ended with a report or reply, not a hand back or a question


class SkillRuntime:
    """One turn's skills. Create it, :meth:`attach` the orchestrator's loop, route its calls through
    :meth:`intercept`, and read :meth:`record` after the loop ran."""

    def __init__(
        self,
        *,
        catalog: SkillCatalog,
        view: SkillView,
        models: ModelService,
        config: HarnessConfig,
        registry: ToolRegistry,
        gate: Gate,
        session: SessionContext,
        open_round: OpenRound,
        persona: str,
        rules: str,
        person_message: ChatMessage,
        conversation_key: str,
        background: bool,
        worker_tier: str | None = None,
    ):
        self.catalog = catalog
        # The tier a worker whose skill names none runs on (a replay's tier); None: the config's.
        self.worker_tier = worker_tier
        self.view = view
        self.models = models
        self.config = config
        self.registry = registry
        self.gate = gate
        self.session = session
        self.open_round = open_round
        self.persona = persona
        self.rules = rules
        self.person_message = person_message
        self.conversation_key = conversation_key
        self.background = background
        self.loop: TurnLoop | None = None
        self.activations: list[_Activation] = []
        self.workers: list[dict[str, Any]] = []
        self.hand_back_used = False
        self.pending_hand_back: str | None = None
        self.ended_by: str | None = None
        self._end: tuple[str, str] | None = None
        self._refusals: list[dict[str, Any]] = []

    @property
    def spec(self) -> ToolSpec | None:
        """The ``use_skill`` tool for this turn, or None when no skill is listed."""
        return use_skill_spec(list(self.view.skills)) if self.view.skills else None

    def attach(self, loop: TurnLoop) -> None:
        self.loop = loop
        loop.after_round = self._after_round

    def _after_round(self, outcomes: Sequence[CallOutcome]) -> tuple[str, str] | None:
        end, self._end = self._end, None
        return end

    async def intercept(self, call: ToolCall) -> CallOutcome | None:
        if call.name != USE_SKILL or self.spec is None:
            return None
        return await self._activate(call)

    # Activation.
    def _outcome(self, call: ToolCall, status: str, content: str) -> CallOutcome:
        return CallOutcome(call, status, content, call.arguments)  # type: ignore[arg-type]

    async def _activate(self, call: ToolCall) -> CallOutcome:
        assert self.loop is not None, "attach the loop first"
        args = call.arguments
        name = args.get("name") if isinstance(args, dict) else None
        skill = self.view.skills.get(name) if isinstance(name, str) else None
        if skill is None:
            listed = ", ".join(self.view.skills)
            return self._outcome(
                call, "unknown", f"There is no skill named {name!r}. Nothing ran. The skills are: {listed}."
            )
        problem = check_arguments(self.spec.parameters, args)  # type: ignore[union-attr]
        if problem is not None:
            return self._outcome(call, "failed", render_failed(problem))
        limit = limit_problem(skill, self.catalog.limits, self.catalog.toolsets)
        if limit is not None:
            log.warning("skill refused by its limits: skill=%s origin=%s", skill.name, skill.origin)
            self._problem(skill, limit)
            return self._outcome(call, "denied", f"Refused by Pepper's rules: the skill {skill.name} {limit}.")
        if skill.is_worker:
            return await self._start_worker(call, skill)
        return self._inline(call, skill)

    def _problem(self, skill: Skill, problem: str) -> None:
        self._refusals.append({"skill": skill.name, "origin": skill.origin, "problem": problem})

    def _inline(self, call: ToolCall, skill: Skill) -> CallOutcome:
        loop = self.loop
        assert loop is not None
        if any(a.skill.name == skill.name and a.kind == "inline" for a in self.activations):
            return self._outcome(call, "ok", f"The skill {skill.name} is already active; keep following its steps.")
        activation = _Activation(skill, call.id, "inline", len(loop.result.calls))
        notes: list[str] = []
        tier = skill.header.model
        if tier is not None:
            order = self.catalog.limits.tier_order
            if tier == loop.tier:
                activation.record["tier"] = {"asked": tier, "result": "same"}
            elif tier in order and loop.tier in order and order.index(tier) > order.index(loop.tier):
                activation.record["tier"] = {"asked": tier, "from": loop.tier, "result": "raised"}
                loop.tier = tier
                notes.append(f"The rest of this turn runs on the {tier} model tier.")
            else:
                activation.record["tier"] = {"asked": tier, "from": loop.tier, "result": "refused-lower"}
        rounds = skill.header.rounds
        if rounds is not None:
            if rounds > loop.round_cap:
                activation.record["rounds"] = {"asked": rounds, "from": loop.round_cap, "result": "raised"}
                loop.round_cap = rounds
                notes.append(f"This turn may now use up to {rounds} rounds.")
            elif rounds < loop.round_cap:
                activation.record["rounds"] = {"asked": rounds, "from": loop.round_cap, "result": "refused-lower"}
            else:
                activation.record["rounds"] = {"asked": rounds, "result": "same"}
        self.activations.append(activation)
        text = f"The skill {skill.name} is active. Follow its steps now, in order:\n\n{skill.steps}"
        if notes:
            text += "\n\n" + " ".join(notes)
        return self._outcome(call, "ok", text)

    # Workers.
    def _worker_tools(self, skill: Skill) -> tuple[list[Tool], str | None]:
        """The session's tools of the skill's sets, or why it cannot run here."""
        hides = self.gate.hides
        shown: dict[str, Tool] = {}
        for name in skill.header.toolsets:
            members = tools_of(name, self.registry, self.catalog.toolsets)
            if not members:
                return [], f"its {name} tool set is not installed in this Pepper"
            connected = self.session.connections
            visible = [t for t in members if t.needs_connection is None or t.needs_connection in connected]
            if not visible:
                needed = sorted({CONNECTION_NAMES.get(n, n) for t in members if (n := t.needs_connection)})
                return [], f"its {name} tools need an account that is not connected ({', '.join(needed)})"
            allowed = [t for t in visible if not hides(t, self.session)]
            if not allowed:
                return [], f"its {name} tools are not available in this conversation"
            shown.update((t.name, t) for t in allowed)
        return [shown[n] for n in sorted(shown)], None

    async def _start_worker(self, call: ToolCall, skill: Skill) -> CallOutcome:
        loop = self.loop
        assert loop is not None
        earlier = [a for a in self.activations if a.skill.name == skill.name]
        second_run = self.pending_hand_back == skill.name
        if earlier and not second_run:
            return self._outcome(
                call,
                "failed",
                render_failed(
                    f"the skill {skill.name} already ran in this turn; "
                    "it runs again only to finish a step it handed back"
                ),
            )
        tools, reason = self._worker_tools(skill)
        if reason is None and (needs := self.catalog.needs(skill, self.registry, self.session.connections)):
            reason = f"it {needs} connected (the person connects it)"
        if reason is not None:
            log.info("worker skill cannot run: skill=%s", skill.name)
            return self._outcome(call, "failed", render_failed(f"the skill {skill.name} cannot run: {reason}"))
        activation = earlier[0] if second_run else _Activation(skill, call.id, "worker", len(loop.result.calls))
        if not second_run:
            self.activations.append(activation)
        self.pending_hand_back = None
        run_number = 2 if second_run else 1
        offer_hand_back = not self.hand_back_used
        offer_ask = self.session.person_present
        control = [s for s, on in ((ASK_USER_SPEC, offer_ask), (HAND_BACK_SPEC, offer_hand_back)) if on]
        specs = [t.spec for t in tools] + control
        visible = frozenset(t.name for t in tools)
        state = _WorkerState()

        async def worker_intercept(worker_call: ToolCall) -> CallOutcome | None:
            if worker_call.name == HAND_BACK and offer_hand_back:
                return self._control(worker_call, HAND_BACK_SPEC, state, "handed_back", "need")
            if worker_call.name == ASK_USER and offer_ask:
                return self._control(worker_call, ASK_USER_SPEC, state, "asked", "question")
            return None

        rules = [WORKER_RULES, *([HAND_BACK_RULE] if offer_hand_back else []), *([ASK_USER_RULE] if offer_ask else [])]
        system = "\n\n".join(
            [
                self.persona.strip(),
                self.rules.strip(),
                "\n".join(rules),
                f"Skill {skill.name}: {skill.description}\nSteps:\n{skill.steps}",
            ]
        )
        tier = skill.header.model or self.worker_tier or self.config.tier
        cap = skill.header.rounds or self.catalog.limits.worker_rounds
        worker = TurnLoop(
            self.models,
            self.config,
            system_stable=system,
            system_dynamic="",
            tools=specs,
            messages=[self._request_message(call)],
            tool_round=lambda: self.open_round(visible, worker_intercept),
            round_cap=cap,
            conversation_key=self.conversation_key,
            tier=tier,
            background=self.background,
            time_budget=loop.time_left(),
        )
        worker.after_round = lambda outcomes: (
            ("handed-back", state.handed_back)
            if state.handed_back is not None
            else ("asked", state.asked)
            if state.asked is not None
            else None
        )
        result = await worker.run()
        self._merge(result)
        activation.worker_calls.extend(result.calls)
        self.workers.append(
            {
                "skill": skill.name,
                "origin": skill.origin,
                "call_id": call.id,
                "run": run_number,
                "status": result.status,
                "tier": tier,
                "round_cap": cap,
                "tools": [s.name for s in specs],
                "rounds": result.rounds,
                "calls": [o.call.id for o in result.calls],
                "report": result.reply,
                "model": result.model,
            }
        )
        return self._worker_outcome(call, skill, activation, result)

    def _control(self, call: ToolCall, spec: ToolSpec, state: _WorkerState, attr: str, key: str) -> CallOutcome:
        problem = check_arguments(spec.parameters, call.arguments)
        if problem is not None:
            return self._outcome(call, "failed", render_failed(problem))
        setattr(state, attr, call.arguments[key].strip())
        return self._outcome(call, "ok", "Done: your run ends after this round.")

    def _request_message(self, call: ToolCall) -> ChatMessage:
        args = call.arguments
        parts = [f"{LABEL}\nRequest from Pepper's main assistant: {args.get('request') or 'do what the person asked.'}"]
        if args.get("details"):
            parts.append("The information you handed back for, found by the main assistant:\n" + args["details"])
        parts.append("The person's message:\n" + self.person_message.content)
        return ChatMessage("user", "\n\n".join(parts))

    def _merge(self, result: LoopResult) -> None:
        """The worker's calls, usage and model time become part of the turn's."""
        assert self.loop is not None
        mine = self.loop.result
        mine.calls.extend(result.calls)
        mine.model_ms += result.model_ms
        for key, value in result.usage.items():
            mine.usage[key] = mine.usage.get(key, 0) + value

    def _worker_outcome(self, call: ToolCall, skill: Skill, activation: _Activation, result: LoopResult) -> CallOutcome:
        loop = self.loop
        assert loop is not None
        if result.status == "handed-back":
            self.hand_back_used = True
            self.pending_hand_back = skill.name
            return self._outcome(
                call,
                "ok",
                f"The {skill.name} worker stopped: it needs something its tools cannot get: {result.reply}\n"
                f"Get that with your own tools, then call use_skill again with name {skill.name!r}, the same "
                "request, and what you found in details. It can be started again once.",
            )
        if result.status == "asked":
            self._end = ("replied", result.reply)
            self.ended_by = "ask_user"
            return self._outcome(
                call, "ok", f"The {skill.name} worker asked the person: {result.reply}\nThe turn ends with it."
            )
        if not result.answered:
            return self._outcome(
                call,
                "failed",
                render_failed(f"the {skill.name} worker could not finish ({result.error or result.status})"),
            )
        activation.finished = True
        alone = bool(loop.history) and len(loop.history[-1].tool_calls) == 1
        if skill.header.direct_report and alone and not call.arguments.get("more_to_do"):
            self._end = ("replied", result.reply)
            self.ended_by = "direct_report"
            sent = f"The {skill.name} worker's report went to the person as the reply:\n{result.reply}"
            return self._outcome(call, "ok", sent)
        return self._outcome(call, "ok", f"Report from the {skill.name} worker (use it in your reply):\n{result.reply}")

    # After the turn.
    def record(self, result: LoopResult) -> dict[str, Any] | None:
        """The ``skills`` part of the turn record; None when the turn listed no skills."""
        if not self.view.skills and not self.view.problems:
            return None
        flags: list[dict[str, Any]] = []
        if result.answered and self.ended_by != "ask_user":
            for activation in self.activations:
                if not activation.skill.header.required:
                    continue
                if activation.kind == "worker":
                    if not activation.finished:
                        continue
                    calls: Sequence[CallOutcome] = activation.worker_calls
                else:
                    calls = result.calls[activation.calls_from :]
                for flag in required_step_flags(activation.skill, calls, self.registry, self.catalog.toolsets):
                    log.warning("skill skipped a required step: skill=%s step=%s", flag["skill"], flag["step"])
                    flags.append(flag)
        return {
            "listed": list(self.view.skills),
            "problems": [p.as_record() for p in self.view.problems] + self._refusals,
            "activations": [
                {"skill": a.skill.name, "origin": a.skill.origin, "kind": a.kind, "call_id": a.call_id, **a.record}
                for a in self.activations
            ],
            "workers": self.workers,
            "ended_by": self.ended_by,
            "flags": flags,
        }
