"""How many Postgres connections ``pepper serve`` may hold at once (checked at start-up and by
``pepper doctor``)."""

from __future__ import annotations

from core.settings import Settings
from core.store import SERVING_POOL_SIZE
from gateway.media_procs import POOL_SIZE as MEDIA_POOL_SIZE
from gateway.services import ACK_POOL_SIZE
from gateway.worker import turn_pool_size

FEWER_CONNECTIONS = (
    "raise its max_connections or lower PEPPER_TURN_WORKERS, PEPPER_MAX_CONCURRENT_TURNS or PEPPER_MEDIA_PROCESSES"
)


def connections_needed(settings: Settings) -> int:
    """The most Postgres connections ``pepper serve`` holds at once with these settings: every
    pool at its maximum, and each connection of its own (LISTEN, announcements)."""
    # + the live feed's two listeners (messages, turn progress).
    web = SERVING_POOL_SIZE + ACK_POOL_SIZE + 2
    # Each turn worker's pool, its wake-up listener and its progress announcer; with none, one
    # worker in the web server (its listener and announcer).
    turns = settings.turn_workers * (turn_pool_size(settings) + 2) if settings.turn_workers else 2
    # Each media process's pool and its call-control listener; with one, the web server's listener.
    media = settings.media_processes * (MEDIA_POOL_SIZE + 1) if settings.media_processes > 1 else 1
    return web + turns + media
