"""What following deals in: one event as a source gives it, before it is matched and stored."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from core.errors import PepperError


class FollowFailed(PepperError):
    """A check or an add that did not work; the message says why, in words a person can read."""

    code = "follow-failed"


@dataclass(frozen=True)
class SourceEvent:
    """``key``: the source's own id for it (a structured source), None for a page's event."""

    title: str
    start: datetime
    end: datetime
    all_day: bool = False
    location: str | None = None
    quote: str | None = None
    cancelled: bool = False
    key: str | None = None
