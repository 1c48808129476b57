"""Skills and workers: written procedures the model loads on demand (see ``docs/skills.md``).

Shipped skill files live in the ``skills`` data package; the owner's own are in the store.
"""

from text_loop.skills.catalog import SkillCatalog, SkillLimits, SkillProblem, SkillView, limit_problem
from text_loop.skills.model import Skill, SkillError, SkillHeader, parse_skill
from text_loop.skills.toolsets import TOOLSETS, Toolset, tools_of

__all__ = [
    "TOOLSETS",
    "Skill",
    "SkillCatalog",
    "SkillError",
    "SkillHeader",
    "SkillLimits",
    "SkillProblem",
    "SkillView",
    "Toolset",
    "limit_problem",
    "parse_skill",
    "tools_of",
]
