"""How many Postgres connections ``pepper serve`` may hold at once (checked at start-up and by
``pepper doctor``)."""

from __future__ import annotations

from core.settings import Settings
from core.store import SERVING_POOL_SIZE
from gateway.media_procs import POOL_SIZE as MEDIA_POOL_SIZE
from gateway.rooms.process import POOL_SIZE as ROOMS_POOL_SIZE
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
    # The web server's call-control listener (its browser calls, and the phone calls with one media
    # process), each media process's pool and listener, and the rooms' sync process.
    media = 1 + (settings.media_processes * (MEDIA_POOL_SIZE + 1) if settings.media_processes > 1 else 0)
    rooms = ROOMS_POOL_SIZE if settings.rooms_enabled else 0
    return web + turns + media + rooms
