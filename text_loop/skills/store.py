"""Adding the owner's own skills: checked as they would run, then stored (``core.records.skills``).

Adding checks the file as it would run: it must parse, must not take a shipped skill's name, and
must fit the limits for user skills. The same checks run again every time the skill is activated,
so a skill stored under older limits is refused then, with the reason.
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from core.records.skills import store_skill
from core.store.queries import Queries
from text_loop.skills.catalog import SkillCatalog, limit_problem
from text_loop.skills.model import Skill, SkillError, parse_skill


def check_user_skill(text: str, catalog: SkillCatalog, *, source: str = "file") -> Skill:
    """Parse ``text`` as a user skill and check it against ``catalog``'s limits; raise SkillError."""
    skill = parse_skill(text, source=source, origin="user")
    if skill.name in catalog.builtins:
        raise SkillError(f"skill {source}: {skill.name!r} is the name of a shipped skill; choose another name")
    problem = limit_problem(skill, catalog.limits, catalog.toolsets)
    if problem is not None:
        raise SkillError(f"skill {source}: {problem}")
    return skill


async def add_user_skill(
    db: Queries, account_id: UUID, text: str, catalog: SkillCatalog, *, replace: bool = False, source: str = "file"
) -> tuple[Skill, Literal["added", "replaced", "unchanged"]]:
    """Store a skill for the account. The same text twice is ``unchanged``; another text under an
    existing name needs ``replace=True`` (else InvalidInput, and nothing changes)."""
    skill = check_user_skill(text, catalog, source=source)
    return skill, await store_skill(db, account_id, skill.name, text, replace=replace)
