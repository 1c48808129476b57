"""Slots: extension points with exactly one occupant each, the built-in unless a plugin is named.

The seven slots are ``memory`` (search on request), ``web_search``, ``sandbox``, ``model_select``,
``heartbeat_interval``, ``compaction`` and ``harness``. Each has a typed interface (a Protocol
beside the code that uses it) and a built-in occupant that is ordinary code behind that
interface: the default when nothing is configured, not a special case.

**Which occupant answers** a call for an account: the account's own setting, else its household's,
else the installation's, else the built-in (``slot_settings``; ``pepper slot set``). Settings are
read at most every :data:`REFRESH_SECONDS` per process, so a change made by ``pepper slot set``
reaches a running server within that time. A named occupant that is not installed, or that does
not claim the slot (its ``slot`` attribute is not the slot's exact name, or a method is missing),
is *stale*: the built-in answers and ``pepper slot list`` and ``pepper doctor`` say so.

**Fallback per call**: an occupant that raises, exceeds the slot's time limit, or returns a value
that does not validate against the slot's result type is logged with the slot and occupant, the
fallback is counted (``slot_fallbacks``, shown by ``pepper slot list``) and the built-in answers
that one call. The ``harness`` slot is the exception (:meth:`SlotRegistry.call` with
``fallback=False``): its failure is raised as :class:`SlotFailed` and ends the turn.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from core.errors import PepperError
from core.metrics import metrics
from core.slots.plugins import Plugin, discover
from core.store.queries import Queries

log = logging.getLogger(__name__)

MEMORY, WEB_SEARCH, SANDBOX = "memory", "web_search", "sandbox"
MODEL_SELECT, HEARTBEAT, COMPACTION, HARNESS = "model_select", "heartbeat_interval", "compaction", "harness"
SLOT_NAMES = (MEMORY, WEB_SEARCH, SANDBOX, MODEL_SELECT, HEARTBEAT, COMPACTION, HARNESS)
BUILTIN = "builtin"
SCOPES = ("installation", "household", "account")
REFRESH_SECONDS = 5.0
FALLBACK_REASONS = frozenset({"timeout", "raised", "malformed"})  # what :meth:`SlotRegistry._try` says


class SlotFailed(PepperError):
    """An occupant of a slot without fallback (the harness) failed; ``reason`` says how."""

    code = "slot-failed"

    def __init__(self, message: str, *, slot: str, occupant: str, reason: str):
        super().__init__(message)
        self.slot, self.occupant, self.reason = slot, occupant, reason


@dataclass
class SlotSpec:
    """A slot: the methods an occupant exports, its built-in, its result check and time limit.

    ``valid(method, result)`` is True when ``result`` is of the slot's result type. ``timeout``
    (seconds) bounds one call of an occupant; None: no limit of the slot's own.
    """

    name: str
    methods: tuple[str, ...]
    builtin: Any
    valid: Callable[[str, Any], bool]
    timeout: float | None
    summary: str
    fallback: bool = True


@dataclass(frozen=True)
class Resolved:
    """Who answers: ``name`` configured (or BUILTIN), ``occupant`` the object (None: the built-in),
    ``scope`` where the setting came from, ``stale`` why a named occupant cannot answer."""

    name: str
    occupant: Any | None
    scope: str | None = None
    stale: str | None = None


@dataclass
class _Snapshot:
    settings: dict[tuple[str, UUID | None, str], str] = field(default_factory=dict)
    households: dict[UUID, UUID] = field(default_factory=dict)
    loaded_at: float = float("-inf")


def is_list_of(kind: type) -> Callable[[str, Any], bool]:
    """A result check: a list whose every item is a ``kind``."""

    def check(_method: str, result: Any) -> bool:
        return isinstance(result, list) and all(isinstance(item, kind) for item in result)

    return check


class SlotRegistry:
    """Every slot of this process, the plugins installed in it, and the settings that pin them."""

    def __init__(
        self, *, plugins: Callable[[], dict[str, Plugin]] = discover, clock: Callable[[], float] = time.monotonic
    ):
        self.specs: dict[str, SlotSpec] = {}
        self._discover = plugins
        self._plugins: dict[str, Plugin] | None = None
        self._snapshot = _Snapshot()
        self._clock = clock

    def register(self, spec: SlotSpec) -> SlotSpec:
        if spec.name not in SLOT_NAMES:
            raise ValueError(f"not a slot: {spec.name!r}")
        self.specs[spec.name] = spec
        return spec

    # Plugins and settings.
    def plugins(self) -> dict[str, Plugin]:
        if self._plugins is None:
            self._plugins = self._discover()
        return self._plugins

    def invalidate(self, *, plugins: bool = False) -> None:
        """Read the settings again on the next call (and the installed plugins, with ``plugins``)."""
        self._snapshot = _Snapshot()
        if plugins:
            self._plugins = None

    async def _settings(self, db: Queries) -> _Snapshot:
        snap = self._snapshot
        if self._clock() - snap.loaded_at < REFRESH_SECONDS:
            return snap
        rows = await db.fetch("SELECT scope, scope_id, slot, occupant FROM slot_settings")
        fresh = _Snapshot(loaded_at=self._clock())
        fresh.settings = {(r["scope"], r["scope_id"], r["slot"]): r["occupant"] for r in rows}
        if any(r["scope"] == "household" for r in rows):
            homes = await db.fetch("SELECT id, household_id FROM accounts WHERE household_id IS NOT NULL")
            fresh.households = {r["id"]: r["household_id"] for r in homes}
        self._snapshot = fresh
        return fresh

    def problem(self, slot: str, name: str) -> str | None:
        """Why ``name`` cannot occupy ``slot`` (None: it can)."""
        spec = self.specs[slot]
        plugin = self.plugins().get(name)
        if plugin is None:
            return "not installed"
        if plugin.error is not None:
            return f"does not load: {plugin.error}"
        if plugin.slot != slot:
            return f"does not claim the {slot} slot" + (f" (it claims {plugin.slot})" if plugin.slot else "")
        missing = [m for m in spec.methods if not callable(getattr(plugin.obj, m, None))]
        if missing:
            return f"lacks {', '.join(missing)}"
        return None

    def pick(self, snap: _Snapshot, slot: str, account_id: UUID | None) -> Resolved:
        settings = snap.settings
        if not settings:
            return Resolved(BUILTIN, None)
        keys: list[tuple[str, UUID | None, str]] = []
        if account_id is not None:
            keys.append(("account", account_id, slot))
            household = snap.households.get(account_id)
            if household is not None:
                keys.append(("household", household, slot))
        keys.append(("installation", None, slot))
        for key in keys:
            name = settings.get(key)
            if name is None:
                continue
            if name == BUILTIN:
                return Resolved(BUILTIN, None, key[0])
            stale = self.problem(slot, name)
            if stale is not None:
                return Resolved(name, None, key[0], stale)
            return Resolved(name, self.plugins()[name].obj, key[0])
        return Resolved(BUILTIN, None)

    def named(self, slot: str, name: str) -> Resolved:
        """``name`` as the occupant of ``slot`` (the built-in when it is BUILTIN or stale)."""
        if name == BUILTIN:
            return Resolved(BUILTIN, None)
        stale = self.problem(slot, name)
        return Resolved(name, None, stale=stale) if stale else Resolved(name, self.plugins()[name].obj)

    async def resolve(self, db: Queries, slot: str, account_id: UUID | None) -> Resolved:
        return self.pick(await self._settings(db), slot, account_id)

    # Calls.
    async def call(self, db: Queries, slot: str, account_id: UUID | None, method: str, *args: Any, **kw: Any) -> Any:
        """``method(*args, **kw)`` on the occupant of ``slot`` for ``account_id``.

        Falls back to the built-in for this call when the occupant raises, times out or returns
        a value the slot does not accept; for a slot without fallback raises :class:`SlotFailed`.
        """
        snap = self._snapshot
        if not snap.settings and self._clock() - snap.loaded_at < REFRESH_SECONDS:
            return await _invoke(self.specs[slot].builtin, method, args, kw)  # nothing is configured
        resolved = await self.resolve(db, slot, account_id)
        try:
            result, reason = await self.run(slot, resolved, method, *args, **kw)
        except SlotFailed as exc:
            await self.count(db, slot, exc.occupant, exc.reason)
            raise
        if reason is not None:
            await self.count(db, slot, resolved.name, reason)
        return result

    async def run(self, slot: str, resolved: Resolved, method: str, *args: Any, **kw: Any) -> tuple[Any, str | None]:
        """``(result, None)`` from ``resolved``'s occupant, or ``(the built-in's result, reason)``
        when it failed (the caller counts it; without a database, as the research helper is)."""
        spec = self.specs[slot]
        if resolved.occupant is None:
            return await _invoke(spec.builtin, method, args, kw), None
        reason, outcome = await self._try(spec, resolved, method, args, kw)
        if reason is None:
            return outcome, None
        log.warning(
            "slot occupant failed; %s: slot=%s occupant=%s reason=%s error=%s",
            "the built-in answers this call" if spec.fallback else "the turn ends",
            slot, resolved.name, reason, type(outcome).__name__ if isinstance(outcome, BaseException) else "-",
            exc_info=outcome if isinstance(outcome, Exception) and reason == "raised" else None,
        )  # fmt: skip
        if not spec.fallback:
            raise SlotFailed(f"the {slot} occupant {resolved.name} failed ({reason})", slot=slot,
                             occupant=resolved.name, reason=reason)  # fmt: skip
        return await _invoke(spec.builtin, method, args, kw), reason

    @staticmethod
    async def _try(
        spec: SlotSpec, resolved: Resolved, method: str, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> tuple[str | None, Any]:
        """``(None, result)`` or ``(reason, the exception or None)``."""
        try:
            if spec.timeout is None:
                result = await _invoke(resolved.occupant, method, args, kw)
            else:
                async with asyncio.timeout(spec.timeout):
                    result = await _invoke(resolved.occupant, method, args, kw)
        except TimeoutError as exc:
            return "timeout", exc
        except Exception as exc:
            return "raised", exc
        if not spec.valid(method, result):
            return "malformed", None
        return None, result

    async def count(self, db: Queries, slot: str, occupant: str, reason: str) -> None:
        # The occupant is named in the store only; a reason from elsewhere (the research helper's) is bounded.
        metrics().slot_fallbacks.labels(slot, reason if reason in FALLBACK_REASONS else "other").inc()
        try:
            await db.execute(
                """
                INSERT INTO slot_fallbacks (slot, occupant, reason, count) VALUES ($1, $2, $3, 1)
                ON CONFLICT (slot, occupant, reason) DO UPDATE SET count = slot_fallbacks.count + 1, last_at = now()
                """,
                slot,
                occupant,
                reason,
            )
        except Exception:
            log.exception("could not count a slot fallback: slot=%s occupant=%s", slot, occupant)


async def _invoke(target: Any, method: str, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    result = getattr(target, method)(*args, **kw)
    if inspect.isawaitable(result):
        result = await result
    return result


SLOTS = SlotRegistry()
"""The process's slots; each slot's module registers its spec on import (``core.slots.catalog`` imports them all)."""
