"""The memory's knobs, with the defaults Pepper ships."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class MemoryConfig:
    """How the memory block, the summary and dossier jobs, and the search index behave.

    ``exchange_gap``: a pause longer than this between two messages starts a new exchange,
    whatever the channels.
    ``block_*``: what the memory block holds. Today's messages are always all there, whole;
    older messages no summary covers yet are limited in number and trimmed.
    ``nightly_hour``: local hour at which a person's nightly jobs become due; each person adds a
    stable offset within the hour (``core.memory.periods.person_offset``).
    ``job_*``: retries with a doubling delay, a lease so two processes never run the same job.
    ``dossier_*``: the rejection rules of a rewrite of the model's half.
    """

    exchange_gap: timedelta = timedelta(minutes=30)
    block_months: int = 6
    block_weeks: int = 8
    block_days: int = 31
    block_older_messages: int = 40
    block_older_message_chars: int = 600
    nightly_hour: int = 3
    lookback_days: int = 40
    summary_tier: str = "small"
    summary_input_chars: int = 240_000
    summary_message_chars: int = 4_000
    summary_max_tokens: int = 1_200
    job_retry_base: timedelta = timedelta(minutes=5)
    job_retry_max: timedelta = timedelta(hours=6)
    job_max_attempts: int = 6
    job_lease: timedelta = timedelta(minutes=15)
    job_concurrency: int = 4
    job_batch: int = 200
    dossier_tier: str = "small"
    dossier_max_chars: int = 4_000
    dossier_min_ratio: float = 0.5
    dossier_owner_max_chars: int = 8_000
    dossier_recent_weeks: int = 4
    index_batch: int = 64
    index_chunk_chars: int = 1_000
    index_chunk_overlap: int = 150
    search_limit: int = 8
    search_ef: int = 64
