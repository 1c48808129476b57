"""Named tool sets over the registry, resolved by each tool's feature area at run time.

Feature areas arrive independently (calendar, email, contacts...), so a tool set is a list of
area names, not of tools: whatever tools of those areas the registry holds when a skill runs are
the set. A set whose areas have no tools in the registry is *not installed*; a skill naming one is
reported (at start-up, by ``pepper skills check``, and to the model if it tries), never skipped
silently.

``behind_worker`` sets are hidden from the orchestrator when skills are on: their tools enter a
prompt only when a worker skill that names them runs. That is what keeps the orchestrator's
prompt short with every area connected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from core.tools.registry import Tool, ToolRegistry


@dataclass(frozen=True)
class Toolset:
    name: str
    areas: tuple[str, ...]
    behind_worker: bool = False
    about: str = ""
    # Filled for each person by an MCP server they connected (``core.tools.mcp``): not installed
    # in the shared registry, only in the turns of a person who connected and approved its tools.
    mcp: bool = False
    # An MCP server the person named themselves: their own skills may use it.
    own: bool = False


_SETS = (
    Toolset("clock", ("clock",), about="the time and date"),
    Toolset("notes", ("notes",), about="the person's notes"),
    Toolset("todos", ("todos",), about="the person's to-do list"),
    Toolset("dossier", ("dossier",), about="what Pepper knows about the person"),
    Toolset("contacts", ("contacts",), about="people the person knows"),
    Toolset("reminders", ("reminders",), about="reminders at a time"),
    Toolset("tasks", ("tasks", "scheduler"), about="scheduled runs and watches"),
    Toolset("memory", ("memory", "search"), about="search of past conversations"),
    Toolset("answering", ("answering_inbox",), about="messages and bookings from the answering service"),
    Toolset("calendar", ("calendar",), behind_worker=True, about="the person's calendars"),
    Toolset("email", ("email",), behind_worker=True, about="writing mail: drafts and sends"),
    Toolset("mail", ("mail",), behind_worker=True, about="reading the person's mail (Gmail, IMAP, Pepper's inbox)"),
    Toolset("feeds", ("feeds",), behind_worker=True, about="followed feeds and news"),
    Toolset("github", ("github",), behind_worker=True, about="GitHub through its MCP server", mcp=True),
)
TOOLSETS: Mapping[str, Toolset] = MappingProxyType({t.name: t for t in _SETS})


def toolset(name: str, toolsets: Mapping[str, Toolset] = TOOLSETS) -> Toolset | None:
    return toolsets.get(name)


def tools_of(name: str, registry: ToolRegistry, toolsets: Mapping[str, Toolset] = TOOLSETS) -> list[Tool]:
    """The registry's tools in the set (sorted by name); empty when unknown or not installed."""
    found = toolsets.get(name)
    if found is None:
        return []
    areas = set(found.areas)
    return [t for t in registry.all() if t.area in areas]


def worker_only_areas(toolsets: Mapping[str, Toolset] = TOOLSETS) -> frozenset[str]:
    return frozenset(area for t in toolsets.values() if t.behind_worker for area in t.areas)


def installed(name: str, registry: ToolRegistry, toolsets: Mapping[str, Toolset] = TOOLSETS) -> bool:
    return bool(tools_of(name, registry, toolsets))
