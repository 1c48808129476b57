"""The tool-call gate: every call from text or voice passes an ordered list of policy checks.

Each check allows, denies or changes the call. The gate fails closed:

* a check that raises counts as a deny, and the decision records which check and why;
* the first deny is final: later checks do not run and cannot allow the call again;
* a change may only narrow: it keeps the same tool, each changed argument must be one the tool
  declares a narrowing for (``Tool.narrowing`` and ``Tool.scheduled``) and change the way it
  allows (a send may become a draft, never the reverse; a recipient list may only lose
  addresses), the changed arguments must still fit the tool's schema, and no later check may
  change an argument that an earlier check set. A change that does not narrow is a deny.

Checks see the session (kind, trust, channel). The same checks also decide which tools a session
can see (``Policy.hides``): a tool the model cannot see is a stronger rule than an instruction.
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from core.tools.context import SessionContext
from core.tools.registry import MISSING as _MISSING
from core.tools.registry import Tool, check_arguments
from core.tracing import traced

log = logging.getLogger(__name__)

Action = Literal["allow", "deny", "modify"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""
    arguments: dict[str, Any] | None = None

    @classmethod
    def allow(cls) -> Verdict:
        return cls("allow")

    @classmethod
    def deny(cls, reason: str) -> Verdict:
        return cls("deny", reason)

    @classmethod
    def modify(cls, arguments: dict[str, Any], reason: str) -> Verdict:
        return cls("modify", reason, dict(arguments))


Check = Callable[[Tool, dict[str, Any], SessionContext], "Verdict | Awaitable[Verdict]"]


@dataclass(frozen=True)
class Policy:
    """One check. ``hides`` answers, without arguments, whether the check refuses the tool outright."""

    name: str
    check: Check
    hides: Callable[[Tool, SessionContext], bool] | None = None


@dataclass(frozen=True)
class GateStep:
    policy: str
    action: str
    reason: str = ""
    error: str | None = None

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "action": self.action}
        if self.reason:
            out["reason"] = self.reason
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class GateDecision:
    allowed: bool
    arguments: dict[str, Any]
    steps: tuple[GateStep, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return any(s.action == "modify" for s in self.steps)

    @property
    def reason(self) -> str:
        """Why the call was denied or changed, in words the model can read."""
        for step in self.steps:
            if step.action == "deny":
                return step.reason or "not allowed here"
        return "; ".join(s.reason for s in self.steps if s.action == "modify" and s.reason)

    def as_record(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "steps": [s.as_record() for s in self.steps]}


class Gate:
    def __init__(self, policies: Iterable[Policy] = ()):
        self.policies: tuple[Policy, ...] = tuple(policies)

    def with_policy(self, policy: Policy) -> Gate:
        """A new gate with one more check at the end (it can only narrow)."""
        return Gate((*self.policies, policy))

    def hides(self, tool: Tool, session: SessionContext) -> bool:
        for policy in self.policies:
            if policy.hides is None:
                continue
            try:
                if policy.hides(tool, session):
                    return True
            except Exception:
                log.exception("policy visibility check failed; hiding the tool: policy=%s", policy.name)
                return True
        return False

    @traced(
        "pepper.gate",
        lambda a: {"tool": a["tool"].name, "kind": a["session"].kind, "trust": a["session"].trust},
        lambda decision, _: {"gate.allowed": decision.allowed, "gate.policy": _deciding_policy(decision)},
    )
    async def decide(self, tool: Tool, arguments: dict[str, Any], session: SessionContext) -> GateDecision:
        current = dict(arguments)
        pinned: dict[str, tuple[str, Any]] = {}
        steps: list[GateStep] = []
        for policy in self.policies:
            try:
                verdict = policy.check(tool, dict(current), session)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
                if not isinstance(verdict, Verdict):
                    raise TypeError(f"policy returned {type(verdict).__name__}, not a Verdict")
            except Exception as exc:  # CancelledError is a BaseException and passes
                log.exception("policy check raised; denying the call: policy=%s tool=%s", policy.name, tool.name)
                steps.append(GateStep(policy.name, "deny", "a safety check failed", error=type(exc).__name__))
                return GateDecision(False, current, tuple(steps))
            if verdict.action == "deny":
                steps.append(GateStep(policy.name, "deny", verdict.reason))
                return GateDecision(False, current, tuple(steps))
            if verdict.action == "modify":
                proposed = verdict.arguments or {}
                widened = [key for key, (_, value) in pinned.items() if proposed.get(key, _MISSING) != value]
                if widened:
                    owner = pinned[widened[0]][0]
                    steps.append(
                        GateStep(policy.name, "deny", f"tried to undo a restriction set by {owner}", error="Widening")
                    )
                    return GateDecision(False, current, tuple(steps))
                problem = check_arguments(tool.parameters, proposed)
                if problem is not None:
                    steps.append(GateStep(policy.name, "deny", f"changed the call badly: {problem}", error="BadChange"))
                    return GateDecision(False, current, tuple(steps))
                widening = _widening(tool, current, proposed)
                if widening is not None:
                    steps.append(GateStep(policy.name, "deny", widening, error="Widening"))
                    return GateDecision(False, current, tuple(steps))
                for key in set(proposed) | set(current):
                    if proposed.get(key, _MISSING) != current.get(key, _MISSING):
                        pinned[key] = (policy.name, proposed.get(key, _MISSING))
                current = dict(proposed)
                steps.append(GateStep(policy.name, "modify", verdict.reason))
                continue
            steps.append(GateStep(policy.name, "allow"))
        return GateDecision(True, current, tuple(steps))


def _deciding_policy(decision: GateDecision) -> str | None:
    """The policy that denied or last changed the call (None: every policy allowed it)."""
    for step in reversed(decision.steps):
        if step.action != "allow":
            return step.policy
    return None


def _widening(tool: Tool, current: dict[str, Any], proposed: dict[str, Any]) -> str | None:
    """Why a proposed change does not narrow the call, or None when every change does."""
    for key in sorted(set(proposed) | set(current)):
        old, new = current.get(key, _MISSING), proposed.get(key, _MISSING)
        if old == new:
            continue
        rule = tool.narrowing_of(key)
        if rule is None:
            return f"tried to change {key!r}, which no policy may change for {tool.name}"
        if not rule.allows(old, new):
            return f"tried to widen {key!r} for {tool.name} ({key} {rule})"
    return None


# --- The built-in policies -------------------------------------------------------------------

# Feature areas that hold one person's private data; rooms see the room's data instead.
PERSONAL_AREAS: frozenset[str] = frozenset(
    {"notes", "todos", "dossier", "tasks", "reminders", "contacts", "calendar", "feeds", "memory", "answering_inbox"}
)
# All a room turn may use: the room's own data (its messages, shared notes and to-dos) and the clock.
ROOM_AREAS: frozenset[str] = frozenset({"room", "clock"})
# What a caller who is not the owner may use; the answering service narrows it to its own profile.
THIRD_PARTY_AREAS: frozenset[str] = frozenset({"clock", "answering"})


def _missing_connection(tool: Tool, session: SessionContext) -> bool:
    return tool.needs_connection is not None and tool.needs_connection not in session.connections


def _connection_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    if _missing_connection(tool, session):
        return Verdict.deny(f"the {tool.needs_connection} account is not connected")
    return Verdict.allow()


def _trust_hides(tool: Tool, session: SessionContext) -> bool:
    if session.trust == "owner_verified":
        return False
    if session.trust == "owner_unverified":
        return tool.writes or tool.needs_connection is not None or tool.area in PERSONAL_AREAS
    return tool.area not in THIRD_PARTY_AREAS


def _trust_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    if _trust_hides(tool, session):
        if session.trust == "owner_unverified":
            return Verdict.deny("the caller has not proved who they are yet")
        return Verdict.deny("not available to this caller")
    return Verdict.allow()


def _room_hides(tool: Tool, session: SessionContext) -> bool:
    # A room is a list of what it may use, not of what it may not: a tool added later (a new send,
    # a new account) stays out of rooms until it is put here.
    if session.kind == "room":
        return (
            tool.area not in ROOM_AREAS
            or tool.needs_connection is not None
            or (tool.area == "room" and session.room_id is None)
        )
    return tool.area == "room"


def _room_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    if _room_hides(tool, session):
        if session.kind != "room":
            return Verdict.deny("room tools work only in a room")
        return Verdict.deny(
            "a room turn uses the room's data only: no member's private data, no sends outside the room"
        )
    return Verdict.allow()


def _scheduled_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    """No person is present to confirm: sends become drafts, invitations stay unsent (each tool
    declares which arguments a scheduled run forces)."""
    if session.kind != "scheduled" or not tool.scheduled:
        return Verdict.allow()
    forced = dict(tool.scheduled)
    if all(args.get(key, _MISSING) == value for key, value in forced.items()):
        return Verdict.allow()
    return Verdict.modify({**args, **forced}, "no one is present in a scheduled run, so " + _describe(forced))


def _describe(forced: dict[str, Any]) -> str:
    parts = []
    for key, value in forced.items():
        if key == "mode" and value == "draft":
            parts.append("the mail was saved as a draft and NOT sent")
        elif key == "send_invitations" and value is False:
            parts.append("no invitations were sent")
        else:
            parts.append(f"{key} was set to {value!r}")
    return " and ".join(parts)


# (turn, tool) pairs of tools marked ``once_per_turn`` that already ran; the oldest forgotten first.
_RAN_ONCE: OrderedDict[tuple[Any, str], None] = OrderedDict()
# Turns in which such a tool, or one that reads outside text (``Tool.outside_text``: mail), ran:
# text from outside is in their model's context (``AFTER_WEB_POLICY``); what it was.
_WEB_TURNS: OrderedDict[Any, str] = OrderedDict()
_RAN_ONCE_KEPT = 10_000


def _once_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    """A tool marked ``once_per_turn`` (the web research hand-off) runs at most once in a turn:
    a second call could carry what this turn's first result put in the model's context."""
    if not tool.once_per_turn:
        return Verdict.allow()
    if session.turn_id is None:
        return Verdict.deny(f"{tool.name} runs only inside a turn")
    key = (session.turn_id, tool.name)
    if key in _RAN_ONCE:
        return Verdict.deny(f"{tool.name} already ran once in this turn, and one is the limit; answer from its result")
    _RAN_ONCE[key] = None
    _WEB_TURNS[session.turn_id] = "the web"
    for kept in (_RAN_ONCE, _WEB_TURNS):
        while len(kept) > _RAN_ONCE_KEPT:
            kept.popitem(last=False)
    return Verdict.allow()


def _unattended_hides(tool: Tool, session: SessionContext) -> bool:
    return tool.acts and session.kind == "scheduled"


def _unattended_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    """A tool that acts outside Pepper with nothing to stage (an MCP write) needs a person: in a
    scheduled run it is refused, unless the person marked it safe (then it does not act)."""
    if _unattended_hides(tool, session):
        return Verdict.deny(f"{tool.name} changes things outside Pepper and no one is present to confirm it")
    return Verdict.allow()


CONNECTION_POLICY = Policy("connection", _connection_check, _missing_connection)
TRUST_POLICY = Policy("trust", _trust_check, _trust_hides)
ROOM_POLICY = Policy("room-scope", _room_check, _room_hides)
SCHEDULED_POLICY = Policy("scheduled-run", _scheduled_check)
ONCE_PER_TURN_POLICY = Policy("once-per-turn", _once_check)
UNATTENDED_ACTS_POLICY = Policy("unattended-acts", _unattended_check, _unattended_hides)


def _after_web_check(tool: Tool, args: dict[str, Any], session: SessionContext) -> Verdict:
    """Once a tool marked ``once_per_turn`` (web research) or one that reads outside text (mail)
    ran in a turn, that text is in its model's context and may steer it: for the rest of the turn,
    what would reach people outside is held back as in a scheduled run (a send becomes a draft, no
    invitations go out), and other changes with outside effects wait for the person's next message."""
    if session.turn_id is not None and tool.outside_text:
        _WEB_TURNS.setdefault(session.turn_id, tool.outside_text)
        while len(_WEB_TURNS) > _RAN_ONCE_KEPT:
            _WEB_TURNS.popitem(last=False)
    if tool.once_per_turn or session.turn_id is None or session.turn_id not in _WEB_TURNS:
        return Verdict.allow()
    source = _WEB_TURNS[session.turn_id]
    if tool.scheduled:
        forced = dict(tool.scheduled)
        if all(args.get(key, _MISSING) == value for key, value in forced.items()):
            return Verdict.allow()
        return Verdict.modify({**args, **forced}, f"this turn brought in text from {source}, so " + _describe(forced))
    if tool.after_commit is not None:
        return Verdict.deny(
            f"this turn brought in text from {source}, so changes that reach outside Pepper wait for the person's"
            " next message; say what you would do and ask"
        )
    return Verdict.allow()


AFTER_WEB_POLICY = Policy("after-web", _after_web_check)


def default_gate() -> Gate:
    """The checks every session passes, in order."""
    return Gate(
        (
            CONNECTION_POLICY,
            TRUST_POLICY,
            ROOM_POLICY,
            SCHEDULED_POLICY,
            UNATTENDED_ACTS_POLICY,
            AFTER_WEB_POLICY,
            ONCE_PER_TURN_POLICY,
        )
    )
