"""Tools: what each declares, what it returns, and the registry that shows the right ones.

A tool declares its name, JSON Schema, description, whether it writes, its feature area and the
connected account it needs. Reading tools do their work in ``handler``. Writing tools never change
data in ``handler``: it checks the request and returns a :class:`PlannedWrite`; the runner either
applies it at once (``apply``) or stages it until the reply is delivered (``staged=True``). That
split is what lets replay run a turn again without any write.

Results say plainly whether a lookup found nothing (``empty``) or failed (``failed``): a small
model that cannot tell the two apart tells the person "nothing new" when the lookup broke.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from jsonschema.validators import extend

from core.models.types import ToolSpec
from core.store.queries import Queries
from core.tools.context import SessionContext

OutcomeStatus = Literal["ok", "empty", "failed"]


@dataclass(frozen=True)
class PlannedWrite:
    """A change a writing tool wants; ``summary`` is short plain text the model may repeat."""

    payload: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class ToolOutcome:
    """What a handler returns. ``content`` is the short text the model reads."""

    status: OutcomeStatus
    content: str
    write: PlannedWrite | None = None

    @classmethod
    def ok(cls, content: str) -> ToolOutcome:
        return cls("ok", content)

    @classmethod
    def empty(cls, what: str) -> ToolOutcome:
        """The lookup worked and there is no data; ``what`` says what was looked for."""
        return cls("empty", what)

    @classmethod
    def failed(cls, reason: str) -> ToolOutcome:
        return cls("failed", reason)

    @classmethod
    def planned(cls, payload: dict[str, Any], summary: str) -> ToolOutcome:
        return cls("ok", summary, PlannedWrite(payload, summary))


@dataclass(frozen=True)
class ToolContext:
    """What a handler may use: the session, the store, and the turn's clock reading.

    ``flushed_later``: the caller commits durably after the call and before anyone hears of its
    result (a text turn's finished record, written before the reply goes out), so the call's own
    writes need not wait for the disk: that commit flushes them too, as the log is written in
    order, and a crash before it loses the turn, its reply and its writes together.

    A handler leaves no session state on ``db`` (no LISTEN, session-level SET or advisory lock):
    a text turn's connection goes back to the pool without a reset (``connection(stateless=True)``).
    """

    session: SessionContext
    db: Queries
    now: datetime
    flushed_later: bool = False


Handler = Callable[[ToolContext, dict[str, Any]], Awaitable[ToolOutcome]]
# Applies a planned write for an account inside the caller's transaction.
Applier = Callable[[Any, UUID, dict[str, Any]], Awaitable[None]]
# Does what a write promised outside the store (sends the mail) once its apply committed, on the
# database itself, never inside a transaction: it records its own result.
AfterCommit = Callable[[Any, UUID, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Narrowing:
    """How a gate policy may change one argument of a tool: only ever toward less.

    ``Narrowing.to(value)``: the argument may only be set to ``value`` (``mode`` to ``"draft"``,
    ``send_invitations`` to false); ``Narrowing.lower()``: a number may only go down (set where it
    was absent: the tool's default counts as its maximum); ``Narrowing.fewer()``: a list may only
    lose items; ``Narrowing.when(rule, what)``: the tool's own test ``rule(old, new)`` (``old`` is
    ``MISSING`` when the argument was absent). An argument a tool does not list may not be changed.
    """

    kind: Literal["to", "lower", "fewer", "rule"]
    value: Any = None
    rule: Callable[[Any, Any], bool] | None = None
    what: str = ""

    @classmethod
    def to(cls, value: Any) -> Narrowing:
        return cls("to", value)

    @classmethod
    def lower(cls) -> Narrowing:
        return cls("lower")

    @classmethod
    def fewer(cls) -> Narrowing:
        return cls("fewer")

    @classmethod
    def when(cls, rule: Callable[[Any, Any], bool], what: str) -> Narrowing:
        return cls("rule", rule=rule, what=what)

    def allows(self, old: Any, new: Any) -> bool:
        """Whether changing the argument from ``old`` to ``new`` narrows the call (``MISSING``: absent)."""
        if self.kind == "to":
            return new is not MISSING and new == self.value
        if self.kind == "lower":
            number = (int, float)
            if new is MISSING or not isinstance(new, number) or isinstance(new, bool):
                return False
            return old is MISSING or (isinstance(old, number) and not isinstance(old, bool) and new <= old)
        if self.kind == "fewer":
            if new is MISSING:
                return old is MISSING
            if not isinstance(new, list | tuple):
                return False
            had = list(old) if isinstance(old, list | tuple) else []
            for item in new:  # each kept item is one of the old ones, counted
                if item not in had:
                    return False
                had.remove(item)
            return True
        try:
            return self.rule is not None and self.rule(old, new) is True
        except Exception:  # a rule that cannot judge the change does not allow it
            return False

    def __str__(self) -> str:
        if self.kind == "to":
            return f"may only be set to {self.value!r}"
        if self.kind == "lower":
            return "may only go down"
        if self.kind == "fewer":
            return "may only lose items"
        return self.what


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()  # an argument that is absent from a call


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    area: str
    writes: bool = False
    needs_connection: str | None = None
    staged: bool = False
    apply: Applier | None = None
    # Outside effects of an immediate write (``AfterCommit``): ``apply`` commits a record of what
    # is about to happen (an outbox row), then this runs and records how it went; if it raises, the
    # call fails with the error.
    after_commit: AfterCommit | None = None
    # Arguments a scheduled run (no person present) forces, e.g. (("mode", "draft"),): the gate
    # rewrites the call and the result tells the model what changed.
    scheduled: tuple[tuple[str, Any], ...] = ()
    # How a gate policy may change each argument (``Narrowing``); the ``scheduled`` overrides are
    # added as ``Narrowing.to``. A policy that changes any other argument, or changes one the wrong
    # way, is a deny: policies can only narrow.
    narrowing: tuple[tuple[str, Narrowing], ...] = ()
    # At most one call per turn (the gate refuses a second): the web research hand-off.
    once_per_turn: bool = False
    # Changes something outside Pepper that no staged write can hold back (an MCP tool whose
    # annotations do not say read-only): refused in scheduled runs (the ``unattended-acts`` policy).
    acts: bool = False
    # Brings text from outside into the turn's context ("mail"): its result may hold instructions,
    # so for the rest of the turn sends are held back as after web research (the ``after-web`` policy).
    outside_text: str = ""

    def __post_init__(self) -> None:
        if self.writes and self.apply is None:
            raise ValueError(f"tool {self.name} writes but has no apply step")
        if self.staged and not self.writes:
            raise ValueError(f"tool {self.name} is staged but does not write")
        if self.after_commit is not None and (self.staged or not self.writes):
            raise ValueError(f"tool {self.name}: only an immediate write has an after-commit step")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name}: parameters must be a JSON Schema object")
        for key, _ in self.scheduled:
            if key not in self.parameters.get("properties", {}):
                raise ValueError(f"tool {self.name}: scheduled override of unknown argument {key!r}")
        for key, _ in self.narrowing:
            if key not in self.parameters.get("properties", {}):
                raise ValueError(f"tool {self.name}: narrowing of unknown argument {key!r}")

    def narrowing_of(self, key: str) -> Narrowing | None:
        """How a policy may change argument ``key``; None: it may not change it at all."""
        for name, rule in self.narrowing:
            if name == key:
                return rule
        for name, value in self.scheduled:
            if name == key:
                return Narrowing.to(value)
        return None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


# Arguments built in code (a policy's narrowed call) may hold tuples where JSON has arrays.
_ArgumentsValidator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("array", lambda _, value: isinstance(value, list | tuple)),
)
# Compiled validators, one per schema (a tool's parameters are built once and never change).
_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}
_MAX_REASON = 160


def _validator(schema: dict[str, Any]) -> Any:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, _ArgumentsValidator(schema))
        _VALIDATORS[id(schema)] = cached
    return cached[1]


def check_arguments(schema: dict[str, Any], args: Any) -> str | None:
    """A short reason the arguments do not fit the tool's schema (JSON Schema 2020-12), or None
    when they do. The reason is for the model: the argument named, the rule it broke."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    error = best_match(_validator(schema).iter_errors(args))
    if error is None:
        return None
    inside = "".join(f"{p}." for p in error.absolute_path)  # "when." for a key of the argument "when"
    if error.validator == "required":
        missing = next((k for k in error.validator_value if k not in error.instance), "?")
        return f"missing required argument {inside + missing!r}"
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return f"unknown argument {inside + (extra[0] if extra else '?')!r}"
    where = ".".join(str(p) for p in error.absolute_path) or "arguments"
    reason = f"argument {where!r}: {error.message}"
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


class ToolRegistry:
    """Every tool by name, in a stable order (the order is part of the cached prompt prefix)."""

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"two tools are named {tool.name}")
        self._tools[tool.name] = tool

    def with_tools(self, tools: Iterable[Tool]) -> ToolRegistry:
        """A new registry with these tools added (a person's MCP tools, for one turn)."""
        extended = ToolRegistry(self._tools.values())
        for tool in tools:
            extended.add(tool)
        return extended

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def all(self) -> list[Tool]:
        return [self._tools[name] for name in sorted(self._tools)]

    def visible(
        self, session: SessionContext, hidden: Callable[[Tool, SessionContext], bool] | None = None
    ) -> list[Tool]:
        """The tools this session's model may see, sorted by name.

        A tool that needs an account the person has not connected is never shown; ``hidden``
        (usually the gate's static view) removes tools a policy would refuse anyway.
        """
        shown = []
        for tool in self.all():
            if tool.needs_connection is not None and tool.needs_connection not in session.connections:
                continue
            if hidden is not None and hidden(tool, session):
                continue
            shown.append(tool)
        return shown
