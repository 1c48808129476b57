"""Who a session serves and how far it is trusted: what every policy check and tool sees.

Plain values at the bottom of the stack, shared by text turns and voice calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

SessionKind = Literal["live", "room", "scheduled", "call"]
Trust = Literal["owner_verified", "owner_unverified", "third_party"]

SESSION_KINDS: tuple[str, ...] = ("live", "room", "scheduled", "call")
TRUST_LEVELS: tuple[str, ...] = ("owner_verified", "owner_unverified", "third_party")


@dataclass(frozen=True)
class SessionContext:
    """One turn or call as the gate sees it.

    ``connections`` names the accounts the person has connected (``"google"``, ``"github"``...);
    a tool that needs one that is missing is neither shown nor allowed.
    """

    kind: SessionKind
    trust: Trust
    channel: str
    account_id: UUID
    conversation_id: UUID | None = None
    turn_id: UUID | None = None
    timezone: str = "UTC"
    connections: frozenset[str] = field(default_factory=frozenset)
    # The room a ``room`` session speaks in (``core.records.rooms``): the only data its tools reach.
    room_id: UUID | None = None

    def __post_init__(self) -> None:
        if self.kind not in SESSION_KINDS:
            raise ValueError(f"unknown session kind {self.kind!r}")
        if self.trust not in TRUST_LEVELS:
            raise ValueError(f"unknown trust level {self.trust!r}")

    @property
    def person_present(self) -> bool:
        """A person can confirm in conversation (live text, rooms, calls); not in scheduled runs."""
        return self.kind != "scheduled"

    def as_record(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "trust": self.trust,
            "channel": self.channel,
            "account_id": str(self.account_id),
            "conversation_id": str(self.conversation_id) if self.conversation_id else None,
            "turn_id": str(self.turn_id) if self.turn_id else None,
            "timezone": self.timezone,
            "connections": sorted(self.connections),
            **({"room_id": str(self.room_id)} if self.room_id else {}),
        }
