"""What an owner's session knows before its first model call, built one way for every channel.

A text turn and a phone call whose caller proved who they are are the same person's sessions:
they get the same connections (which decide the connected tools: Pepper's mail, the person's
Gmail, their calendars), the same dossier, the same memory block (``core.memory.block``:
summaries, the messages no summary covers yet, all of today's) and the same tools for their
trust. This module builds that context; ``text_loop.turn`` and ``voice.owner_profile`` both use it.

A text turn folds the reads into the statement that opens it (``context_reads``, one round trip
saved on every turn); a call, which opens its turn when it starts and learns who the caller is
later, reads them in one statement of its own when the caller proves who they are
(``load_owner_context``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.memory import NO_MEMORY, MemoryConfig, build_memory_block
from core.memory.block import compact_memory, memory_view
from core.memory.dossier import MAX_NOTES_IN_PROMPT, dossier_halves, dossier_select, prompt_text
from core.store.queries import Queries
from core.tools.connectors import Connectors, connection_names, connections_select
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolRegistry
from core.web.permission import WEB, WebWindow


@dataclass(frozen=True)
class OwnerContext:
    connections: frozenset[str]
    dossier: str  # both halves as prompt text; empty when there is none or the session is not personal
    memory: str  # the memory block, or NO_MEMORY


def context_reads(connectors: Connectors | None, *, personal: bool, connections: bool = True) -> dict[str, str]:
    """The scalar SQL expressions over the account id ``$1`` the context needs, by name: the
    connections (unless the caller already knows them) and, for a personal session, the dossier."""
    reads: dict[str, str] = {}
    if connections:
        reads["connections"] = connections_select(connectors)
    if personal:
        reads["dossier"] = dossier_select(MAX_NOTES_IN_PROMPT)
    return reads


async def owner_context(
    db: Queries,
    account_id: UUID,
    conversation_id: UUID,
    timezone: str,
    now: datetime,
    got: dict[str, Any],
    *,
    personal: bool,
    memory: MemoryConfig,
    connections: frozenset[str] | None = None,
    exclude_message_ids: Sequence[int] = (),
    web: WebWindow | None = None,
    text: str = "",
) -> OwnerContext:
    """The context from the values of :func:`context_reads` (``got``), with the memory block read
    on ``db``. ``connections`` given: the caller already knows them.

    ``web``: web research is set up; when the person's message ``text`` and the conversation before
    it permit the web (``core.web.permission``), the session holds the ``web`` connection and the
    memory block shows only the person's own messages."""
    if connections is None:
        connections = connection_names(got["connections"])
    dossier = prompt_text(dossier_halves(got["dossier"])) if "dossier" in got else ""
    if personal and web is not None:
        view = await memory_view(
            db, account_id, conversation_id, timezone, now, config=memory, exclude_message_ids=exclude_message_ids
        )
        permitted = web.permits(text, view.messages, now)
        block = await compact_memory(db, account_id, view, timezone, memory, web=permitted)
    elif personal:
        permitted = False
        block = await build_memory_block(
            db, account_id, conversation_id, timezone, now, config=memory, exclude_message_ids=exclude_message_ids
        )
    else:
        permitted = web is not None and web.permits(text, (), now)
        block = NO_MEMORY
    return OwnerContext(connections | {WEB} if permitted else connections, dossier, block)


async def load_owner_context(
    db: Queries,
    account_id: UUID,
    conversation_id: UUID,
    timezone: str,
    now: datetime,
    *,
    connectors: Connectors | None,
    memory: MemoryConfig,
    personal: bool = True,
    exclude_message_ids: Sequence[int] = (),
    web: WebWindow | None = None,
    text: str = "",
) -> OwnerContext:
    """The context read in one statement of its own, then the memory block (without
    ``exclude_message_ids``: what the session already has in front of it). ``web`` and ``text``
    as for :func:`owner_context` (a call's ``text``: the caller's words that asked for the web)."""
    reads = context_reads(connectors, personal=personal)
    names = list(reads)
    row = await db.fetchrow("SELECT " + ", ".join(f"{reads[n]} AS {n}" for n in names), account_id)
    got = {n: row[n] for n in names}
    return await owner_context(
        db, account_id, conversation_id, timezone, now, got, personal=personal, memory=memory,
        exclude_message_ids=exclude_message_ids, web=web, text=text,
    )  # fmt: skip


def dossier_section(dossier: str) -> str:
    """The dossier as its section of an owner's instructions."""
    return "About the person (the dossier):\n" + dossier if dossier else "About the person: nothing noted yet."


def session_tools(registry: ToolRegistry, gate: Gate, session: SessionContext) -> list[Tool]:
    """The tools a session of this kind, trust and connections sees (the gate decides)."""
    return registry.visible(session, gate.hides)
