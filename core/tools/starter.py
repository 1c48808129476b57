"""The starter tool set: every built-in feature area's tools in one registry."""

from __future__ import annotations

from core.tools.areas import clock, dossier, memory, notes, todos
from core.tools.registry import ToolRegistry


def starter_registry() -> ToolRegistry:
    return ToolRegistry((*clock.TOOLS, *notes.TOOLS, *todos.TOOLS, *dossier.TOOLS, *memory.TOOLS))
