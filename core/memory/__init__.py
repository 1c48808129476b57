"""Memory: one conversation across channels, rolling summaries, the dossier and search on request.

* :mod:`core.memory.block`: the memory block in every owner prompt.
* :mod:`core.memory.exchanges`: exchanges split by pauses in time, not by channel.
* :mod:`core.memory.summaries` and :mod:`core.memory.records`: summaries built from records.
* :mod:`core.memory.dossier`: the two halves, notes, the weekly rewrite and its revisions.
* :mod:`core.memory.index` and :mod:`core.memory.search`: the search index and search on request.
* :mod:`core.memory.jobs`: the jobs a scheduler calls (``memory_jobs_tick``).
"""

from core.memory.block import NO_MEMORY, build_memory_block
from core.memory.config import MemoryConfig
from core.memory.jobs import memory_jobs_tick, run_nightly_summaries

__all__ = ["NO_MEMORY", "MemoryConfig", "build_memory_block", "memory_jobs_tick", "run_nightly_summaries"]
