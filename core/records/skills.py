"""The owner's own skills as stored (``user_skills``): the text they wrote, under its name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from core.errors import InvalidInput, NotFound
from core.store.pool import transaction
from core.store.queries import Queries


@dataclass(frozen=True)
class StoredSkill:
    name: str
    source: str
    created_at: datetime
    updated_at: datetime


async def store_skill(
    db: Queries, account_id: UUID, name: str, text: str, *, replace: bool
) -> Literal["added", "replaced", "unchanged"]:
    """Store ``text`` as the account's skill ``name``. The same text twice is ``unchanged``; another
    text under an existing name needs ``replace=True`` (else InvalidInput, and nothing changes)."""
    async with transaction(db) as conn:
        existing = await conn.fetchrow(
            "SELECT source FROM user_skills WHERE account_id = $1 AND name = $2 FOR UPDATE", account_id, name
        )
        if existing is not None:
            if existing["source"] == text:
                return "unchanged"
            if not replace:
                raise InvalidInput(f"you already have a skill named {name!r}; use --replace to change it")
            await conn.execute(
                "UPDATE user_skills SET source = $3, updated_at = now() WHERE account_id = $1 AND name = $2",
                account_id,
                name,
                text,
            )
            return "replaced"
        await conn.execute(
            "INSERT INTO user_skills (account_id, name, source) VALUES ($1, $2, $3)", account_id, name, text
        )
    return "added"


async def list_skills(db: Queries, account_id: UUID) -> list[StoredSkill]:
    rows = await db.fetch(
        "SELECT name, source, created_at, updated_at FROM user_skills WHERE account_id = $1 ORDER BY name", account_id
    )
    return [StoredSkill(r["name"], r["source"], r["created_at"], r["updated_at"]) for r in rows]


# A scalar SQL expression over the account id ``$1``: the account's skills as JSON, for
# ``skill_sources``; a text turn folds it into its first statement (``core.conversation.open_turn``).
USER_SKILLS_SELECT = (
    "(SELECT coalesce(json_agg(json_build_array(name, source) ORDER BY name), '[]')"
    " FROM user_skills WHERE account_id = $1)"
)


def skill_sources(selected: str) -> list[tuple[str, str]]:
    """``(name, text)`` of the account's skills from the JSON ``USER_SKILLS_SELECT`` gives."""
    return [(str(name), str(source)) for name, source in json.loads(selected)]


async def get_skill(db: Queries, account_id: UUID, name: str) -> StoredSkill:
    row = await db.fetchrow(
        "SELECT name, source, created_at, updated_at FROM user_skills WHERE account_id = $1 AND name = $2",
        account_id,
        name,
    )
    if row is None:
        raise NotFound(f"no skill named {name!r} for this account")
    return StoredSkill(row["name"], row["source"], row["created_at"], row["updated_at"])


async def remove_skill(db: Queries, account_id: UUID, name: str) -> None:
    status = await db.execute("DELETE FROM user_skills WHERE account_id = $1 AND name = $2", account_id, name)
    if status.endswith(" 0"):
        raise NotFound(f"no skill named {name!r} for this account")
