"""The skills a turn can use: the shipped ones, the owner's own, and the limits on the latter.

Shipped skills are read once from the ``skills`` data package with ``importlib.resources``. A
user's skills are read from the store on each turn and parsed again each time, so a skill that
no longer parses, or no longer fits the limits, is reported the next time it would run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from core.tools.connectors import CONNECTION_NAMES
from core.tools.registry import ToolRegistry
from text_loop.skills.model import TIERS, Skill, SkillError, parse_skill
from text_loop.skills.toolsets import TOOLSETS, Toolset, installed, tools_of

log = logging.getLogger(__name__)

SKILLS_PACKAGE = "skills"


@dataclass(frozen=True)
class SkillLimits:
    """What skills may ask for. User-written skills get less than shipped ones.

    ``user_toolsets``: the tool sets a user skill may name (``None``: any); ``*_max_toolsets``: how
    many; ``user_max_rounds``: the highest round budget or cap a user skill may ask for;
    ``user_max_tier``: the largest model tier it may ask for. ``worker_rounds`` is a worker's
    budget when its skill names none.
    """

    builtin_max_toolsets: int = 6
    user_max_toolsets: int = 2
    user_max_rounds: int = 8
    user_max_tier: str = "medium"
    user_toolsets: frozenset[str] | None = frozenset(
        {"clock", "notes", "todos", "contacts", "reminders", "memory", "calendar", "feeds"}
    )
    worker_rounds: int = 6
    tier_order: tuple[str, ...] = TIERS


def limit_problem(skill: Skill, limits: SkillLimits, toolsets: Mapping[str, Toolset] = TOOLSETS) -> str | None:
    """Why ``skill`` may not run under ``limits`` (and the known tool sets), or None when it may."""
    header = skill.header
    unknown = [name for name in header.toolsets if name not in toolsets]
    if unknown:
        return f"names a tool set that does not exist: {unknown[0]!r} (known: {', '.join(sorted(toolsets))})"
    if skill.origin == "builtin":
        if len(header.toolsets) > limits.builtin_max_toolsets:
            return f"names {len(header.toolsets)} tool sets; at most {limits.builtin_max_toolsets}"
        return None
    if len(header.toolsets) > limits.user_max_toolsets:
        return f"names {len(header.toolsets)} tool sets; a skill you write may use at most {limits.user_max_toolsets}"
    if limits.user_toolsets is not None:
        barred = [n for n in header.toolsets if n not in limits.user_toolsets and not toolsets[n].own]
        if barred:
            return f"a skill you write may not use the {barred[0]} tool set"
    if header.rounds is not None and header.rounds > limits.user_max_rounds:
        return f"asks for {header.rounds} rounds; a skill you write may ask for at most {limits.user_max_rounds}"
    order = limits.tier_order
    if header.model is not None and limits.user_max_tier in order and header.model in order:
        if order.index(header.model) > order.index(limits.user_max_tier):
            return f"asks for the {header.model} tier; a skill you write may ask for up to {limits.user_max_tier}"
    return None


@dataclass(frozen=True)
class SkillProblem:
    skill: str
    origin: str
    problem: str

    def as_record(self) -> dict[str, str]:
        return {"skill": self.skill, "origin": self.origin, "problem": self.problem}


@dataclass
class SkillView:
    """The skills one turn lists (by name, sorted) and what could not be listed, with why."""

    skills: dict[str, Skill] = field(default_factory=dict)
    problems: list[SkillProblem] = field(default_factory=list)

    def listing(self) -> list[tuple[str, str]]:
        return [(s.name, s.description) for s in self.skills.values()]


class SkillCatalog:
    """Shipped skills plus the rules for the owner's own. Built once at start-up."""

    def __init__(
        self,
        builtins: Iterable[Skill] = (),
        *,
        limits: SkillLimits | None = None,
        toolsets: Mapping[str, Toolset] = TOOLSETS,
        problems: Iterable[SkillProblem] = (),
    ):
        self.limits = limits or SkillLimits()
        self.toolsets = toolsets
        self.builtins: dict[str, Skill] = {}
        self.problems: list[SkillProblem] = list(problems)
        for skill in sorted(builtins, key=lambda s: s.name):
            if skill.name in self.builtins:
                duplicate = f"a second skill has this name ({skill.source})"
                self.problems.append(SkillProblem(skill.name, "builtin", duplicate))
                continue
            self.builtins[skill.name] = skill

    @classmethod
    def load_builtin(cls, *, limits: SkillLimits | None = None, package: str = SKILLS_PACKAGE) -> SkillCatalog:
        """Every ``*.md`` of the shipped skills folder; a file that does not parse becomes a problem."""
        skills, problems = [], []
        for name, text in shipped_skill_files(package):
            try:
                skills.append(parse_skill(text, source=name, origin="builtin"))
            except SkillError as exc:
                problems.append(SkillProblem(name.removesuffix(".md"), "builtin", exc.message))
        return cls(skills, limits=limits, problems=problems)

    def get(self, name: str) -> Skill | None:
        return self.builtins.get(name)

    def with_servers(self, servers: Iterable[tuple[str, str]]) -> SkillCatalog:
        """This catalog with one more tool set per MCP server a person connected (``(name, area)``),
        behind workers; a name that is already a tool set keeps its meaning."""
        extra = {
            name: Toolset(name, (area,), behind_worker=True, about=f"the {name} MCP server", mcp=True, own=True)
            for name, area in servers
            if name not in self.toolsets
        }
        if not extra:
            return self
        copy = SkillCatalog(limits=self.limits, toolsets=MappingProxyType({**self.toolsets, **extra}))
        copy.builtins, copy.problems = self.builtins, self.problems
        return copy

    def unavailable(self, skill: Skill, registry: ToolRegistry) -> str | None:
        """Why the skill cannot be listed with this registry: a tool set unknown or not installed, or a
        required step that no tool here can take."""
        for name in skill.header.toolsets:
            if name not in self.toolsets:
                return f"names a tool set that does not exist: {name!r}"
            if not installed(name, registry, self.toolsets):
                if self.toolsets[name].mcp:
                    return f"the {name} tool set needs its MCP server connected and tools approved (pepper mcp)"
                return f"the {name} tool set is not installed (no tools of area {', '.join(self.toolsets[name].areas)})"
        for step in skill.header.required:
            if step in self.toolsets:
                if not installed(step, registry, self.toolsets):
                    return f"its required step {step!r} needs the {step} tool set, which is not installed"
            elif step not in registry:
                return f"its required step {step!r} names no tool or tool set that exists"
        return None

    def needs(self, skill: Skill, registry: ToolRegistry, connections: frozenset[str]) -> str | None:
        """What the person must connect before the skill can run ("needs Gmail or IMAP"): a required
        step none of whose tools is usable with ``connections``; None when every step has one."""
        missing: list[str] = []
        for step in skill.header.required:
            if step in self.toolsets:
                tools = tools_of(step, registry, self.toolsets)
            else:
                tool = registry.get(step)
                tools = [tool] if tool is not None else []
            if not tools or any(t.needs_connection is None or t.needs_connection in connections for t in tools):
                continue  # a step with no tool here is ``unavailable``'s to report
            wanted = sorted({CONNECTION_NAMES.get(t.needs_connection or "", t.needs_connection or "") for t in tools})
            missing.append(" or ".join(wanted))
        return "needs " + " and ".join(dict.fromkeys(missing)) if missing else None

    def report(self, registry: ToolRegistry) -> list[SkillProblem]:
        """Every shipped skill that cannot be used with ``registry``, and why (for start-up and the CLI)."""
        found = list(self.problems)
        for skill in self.builtins.values():
            if any(self.toolsets[n].mcp for n in skill.header.toolsets if n in self.toolsets):
                continue  # its tools exist only for people who connected the server (pepper mcp)
            reason = self.unavailable(skill, registry) or limit_problem(skill, self.limits, self.toolsets)
            if reason:
                found.append(SkillProblem(skill.name, "builtin", reason))
        return found

    def view(self, registry: ToolRegistry, user_sources: Sequence[tuple[str, str]] = ()) -> SkillView:
        """The skills a turn lists: shipped and user skills that parse and whose tool sets are installed.

        ``user_sources`` are ``(name, text)`` rows of the owner's skills. Limits are not checked
        here but when a skill is activated, every time.
        """
        view = SkillView()
        candidates: list[Skill] = []
        for skill in self.builtins.values():
            candidates.append(skill)
        for stored_name, text in user_sources:
            try:
                skill = parse_skill(text, source=repr(stored_name), origin="user")
            except SkillError as exc:
                view.problems.append(SkillProblem(stored_name, "user", exc.message))
                continue
            if skill.name in self.builtins:
                view.problems.append(SkillProblem(stored_name, "user", "has the name of a shipped skill"))
                continue
            candidates.append(skill)
        for skill in sorted(candidates, key=lambda s: s.name):
            reason = self.unavailable(skill, registry)
            if reason:
                view.problems.append(SkillProblem(skill.name, skill.origin, reason))
                continue
            view.skills[skill.name] = skill
        return view


def shipped_skill_files(package: str = SKILLS_PACKAGE) -> list[tuple[str, str]]:
    """``(file name, text)`` of each shipped skill, sorted by file name."""
    try:
        roots: list[Any] = [resources.files(package)]
    except NotADirectoryError:
        # An editable install puts a path-hook marker (not a folder) on the namespace package's
        # path, which importlib.resources rejects before Python 3.12; read the real folders.
        import importlib

        roots = [Path(p) for p in importlib.import_module(package).__path__ if Path(p).is_dir()]
    found: dict[str, Any] = {}
    for root in roots:
        for entry in root.iterdir():
            if entry.name.endswith(".md"):
                found.setdefault(entry.name, entry)
    return [(name, found[name].read_text(encoding="utf-8")) for name in sorted(found)]


def log_problems(problems: Sequence[SkillProblem]) -> None:
    for problem in problems:
        log.warning("skill unavailable: skill=%s origin=%s problem=%s", problem.skill, problem.origin, problem.problem)
