"""The required-step detector: did a skill's run take every step its header says it must?

A required step is a tool name or a tool set name (any tool of the set counts). After the turn,
the calls the skill's run made are compared with that list; a step with no call is flagged
``skipped-required-step``, one whose every call failed or was refused ``required-step-failed``.
The flags go into the turn record (``skills.flags``); they do not change the reply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.tools.registry import ToolRegistry
from core.tools.runner import CallOutcome
from text_loop.skills.model import Skill
from text_loop.skills.toolsets import TOOLSETS, Toolset, tools_of


def step_tools(step: str, registry: ToolRegistry, toolsets: Mapping[str, Toolset] = TOOLSETS) -> set[str]:
    """The tool names that satisfy ``step``."""
    if step in toolsets:
        return {t.name for t in tools_of(step, registry, toolsets)}
    return {step}


def required_step_flags(
    skill: Skill,
    calls: Sequence[CallOutcome],
    registry: ToolRegistry,
    toolsets: Mapping[str, Toolset] = TOOLSETS,
) -> list[dict[str, Any]]:
    flags: list[dict[str, Any]] = []
    for step in skill.header.required:
        names = step_tools(step, registry, toolsets)
        made = [c for c in calls if c.call.name in names]
        if not made:
            flags.append(
                {
                    "flag": "skipped-required-step",
                    "skill": skill.name,
                    "step": step,
                    "installed": any(n in registry for n in names),
                }
            )
        elif not any(c.succeeded for c in made):
            flags.append(
                {
                    "flag": "required-step-failed",
                    "skill": skill.name,
                    "step": step,
                    "statuses": [c.status for c in made],
                }
            )
    return flags
