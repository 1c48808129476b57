"""The starter tool set: every built-in feature area's tools in one registry."""

from __future__ import annotations

from core.tools.areas import (
    answering_inbox,
    calendar,
    clock,
    contacts,
    dossier,
    email,
    feeds,
    mail,
    memory,
    notes,
    reminders,
    room,
    tasks,
    todos,
    web,
)
from core.tools.connectors import Connectors
from core.tools.registry import ToolRegistry


def starter_registry(connectors: Connectors | None = None) -> ToolRegistry:
    """All built-in tools; ``connectors`` (from the settings) lets calendar, email and feeds reach
    outside services. Without it they still load and say plainly what is not set up."""
    c = connectors or Connectors()
    areas = (
        *calendar.make_tools(c),
        *calendar.make_room_tools(c),
        *email.make_tools(c),
        *mail.make_tools(c),
        *feeds.make_tools(c),
        *contacts.TOOLS,
        *tasks.TOOLS,
        *reminders.TOOLS,
        *memory.TOOLS,
        *answering_inbox.TOOLS,
        *room.TOOLS,
        *web.make_tools(c),
    )
    return ToolRegistry((*clock.TOOLS, *notes.TOOLS, *todos.TOOLS, *dossier.TOOLS, *areas))
