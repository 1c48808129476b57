"""Which occupant each slot has, per scope (installation, household, account), and households.

A household is a group of accounts that share one configuration: a slot set for the household
applies to each of its accounts that has no setting of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from core.errors import InvalidInput, NotFound
from core.slots import BUILTIN, SCOPES, SLOT_NAMES, SLOTS, SlotRegistry
from core.store.queries import Queries


@dataclass(frozen=True)
class Household:
    id: UUID
    name: str
    members: tuple[str, ...]  # account names


@dataclass(frozen=True)
class SlotSetting:
    scope: str
    scope_id: UUID | None
    scope_name: str | None  # the household's or account's name
    slot: str
    occupant: str


def _check_scope(scope: str, scope_id: UUID | None) -> None:
    if scope not in SCOPES:
        raise InvalidInput(f"not a scope: {scope!r} (choose from {', '.join(SCOPES)})")
    if (scope == "installation") != (scope_id is None):
        raise InvalidInput("the installation scope has no id; a household or account scope needs one")


async def set_slot(
    db: Queries, slot: str, occupant: str, *, scope: str = "installation", scope_id: UUID | None = None,
    registry: SlotRegistry = SLOTS,
) -> None:  # fmt: skip
    """Pin ``slot`` to ``occupant`` (a plugin's own name, or ``builtin``) for the scope."""
    if slot not in SLOT_NAMES:
        raise InvalidInput(f"not a slot: {slot!r} (choose from {', '.join(SLOT_NAMES)})")
    _check_scope(scope, scope_id)
    await db.execute(
        """
        INSERT INTO slot_settings (scope, scope_id, slot, occupant) VALUES ($1, $2, $3, $4)
        ON CONFLICT (scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'), slot)
        DO UPDATE SET occupant = EXCLUDED.occupant, updated_at = now()
        """,
        scope,
        scope_id,
        slot,
        occupant,
    )
    registry.invalidate()


async def clear_slot(
    db: Queries, slot: str, *, scope: str = "installation", scope_id: UUID | None = None,
    registry: SlotRegistry = SLOTS,
) -> bool:  # fmt: skip
    """Remove the scope's setting for ``slot``; True when there was one."""
    _check_scope(scope, scope_id)
    status = await db.execute(
        "DELETE FROM slot_settings WHERE scope = $1 AND scope_id IS NOT DISTINCT FROM $2 AND slot = $3",
        scope,
        scope_id,
        slot,
    )
    registry.invalidate()
    return status != "DELETE 0"


async def slot_settings(db: Queries) -> list[SlotSetting]:
    rows = await db.fetch(
        """
        SELECT s.scope, s.scope_id, s.slot, s.occupant, coalesce(h.name, a.name) AS scope_name
        FROM slot_settings s
        LEFT JOIN households h ON s.scope = 'household' AND h.id = s.scope_id
        LEFT JOIN accounts a ON s.scope = 'account' AND a.id = s.scope_id
        ORDER BY array_position(ARRAY['installation', 'household', 'account'], s.scope), scope_name, s.slot
        """
    )
    return [SlotSetting(r["scope"], r["scope_id"], r["scope_name"], r["slot"], r["occupant"]) for r in rows]


async def fallback_counts(db: Queries) -> dict[tuple[str, str], dict[str, int]]:
    """``{(slot, occupant): {reason: count}}`` over the installation's life."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for r in await db.fetch("SELECT slot, occupant, reason, count FROM slot_fallbacks"):
        out.setdefault((r["slot"], r["occupant"]), {})[r["reason"]] = r["count"]
    return out


def stale_settings(settings: list[SlotSetting], registry: SlotRegistry = SLOTS) -> list[tuple[SlotSetting, str]]:
    """The settings whose occupant cannot answer (missing, renamed, never claimed the slot), with why."""
    out = []
    for s in settings:
        if s.occupant == BUILTIN or s.slot not in registry.specs:
            continue
        problem = registry.problem(s.slot, s.occupant)
        if problem is not None:
            out.append((s, problem))
    return out


# Households.
async def create_household(db: Queries, name: str) -> Household:
    name = name.strip()
    if not name:
        raise InvalidInput("a household needs a name")
    row = await db.fetchrow(
        "INSERT INTO households (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id, name", name
    )
    if row is None:
        raise InvalidInput(f"a household is already named {name!r}")
    return Household(row["id"], row["name"], ())


async def get_household(db: Queries, name: str) -> Household:
    row = await db.fetchrow(
        """
        SELECT h.id, h.name,
               coalesce(array_agg(a.name ORDER BY a.name) FILTER (WHERE a.id IS NOT NULL), '{}') AS members
        FROM households h LEFT JOIN accounts a ON a.household_id = h.id
        WHERE h.name = $1 GROUP BY h.id
        """,
        name.strip(),
    )
    if row is None:
        raise NotFound(f"no household named {name.strip()!r}")
    return Household(row["id"], row["name"], tuple(row["members"]))


async def list_households(db: Queries) -> list[Household]:
    rows = await db.fetch("SELECT name FROM households ORDER BY name")
    return [await get_household(db, r["name"]) for r in rows]


async def join_household(
    db: Queries, account_id: UUID, household_id: UUID | None, registry: SlotRegistry = SLOTS
) -> None:
    """Put the account in the household (None: in none)."""
    await db.execute(
        "UPDATE accounts SET household_id = $2, updated_at = now() WHERE id = $1", account_id, household_id
    )
    registry.invalidate()


async def delete_household(db: Queries, household_id: UUID, registry: SlotRegistry = SLOTS) -> None:
    """Delete the household and (a trigger) its slot settings; its accounts stay, in no household."""
    await db.execute("DELETE FROM households WHERE id = $1", household_id)
    registry.invalidate()
