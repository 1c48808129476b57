"""Every slot of core, registered: importing this module imports each slot's own module."""

from __future__ import annotations

import core.memory.block
import core.memory.search
import core.models.select
import core.scheduling.heartbeat
import core.slots.sandbox
import core.web.search  # noqa: F401  (web_search)
from core.slots import SLOTS, SlotRegistry


def registry() -> SlotRegistry:
    """:data:`core.slots.SLOTS` with every core slot registered (``harness`` is registered by
    ``text_loop.harness``, above core)."""
    return SLOTS
