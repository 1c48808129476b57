"""The record of refused requests: what happened and where, never the content."""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


async def record_security_event(db: Any, kind: str, **detail: str | None) -> None:
    """Record a refusal (a forged signature, a reused token, a failed PIN).

    Never raises: the refusal itself must not fail because its record did.
    """
    try:
        await db.execute("INSERT INTO security_events (kind, detail) VALUES ($1, $2::jsonb)", kind, json.dumps(detail))
    except Exception:
        log.exception("could not record a security event")
