"""The silence rule: a scheduled run may stay silent only when the evidence says so.

Evidence comes from the turn record (``turns.tool_calls``, each with its runner status), never
from the model's word alone. A run stays silent only when all of these hold:

* the model asked for silence (its reply is exactly :data:`SILENT_MARK`);
* the turn ended normally (``replied``: not capped, recovered, empty or a model error);
* it made at least one lookup (a call to a tool that does not write);
* every lookup succeeded and found nothing (``empty``; a repeat counts as the call it repeats);
* no call of any kind failed, was refused or named an unknown tool;
* no write waits on a delivered reply (a staged write needs the person to see the reply).

Completed actions (writes that ran) do not stop silence. Every other case reports: an unwanted
message is visible, a swallowed one is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SILENT_MARK = "NOTHING_TO_REPORT"
ERROR_STATUSES = frozenset({"failed", "denied", "unknown"})


@dataclass(frozen=True)
class Evidence:
    silent: bool
    asked_silence: bool
    turn_status: str
    lookups: list[dict[str, str]] = field(default_factory=list)
    actions: list[dict[str, str]] = field(default_factory=list)
    why: list[str] = field(default_factory=list)  # why the run reports (empty when silent)

    def as_record(self) -> dict[str, Any]:
        return {
            "decision": "silent" if self.silent else "report",
            "asked_silence": self.asked_silence,
            "turn_status": self.turn_status,
            "lookups": self.lookups,
            "actions": self.actions,
            "why": self.why,
        }


def asks_silence(reply: str) -> bool:
    return reply.strip().strip(".").strip().upper() == SILENT_MARK


def strip_mark(reply: str) -> str:
    return reply.replace(SILENT_MARK, "").strip()


def judge(reply: str, turn_status: str, calls: list[dict[str, Any]], *, staged_writes: int = 0) -> Evidence:
    """Decide from a turn's recorded calls whether its run may stay silent."""
    by_id = {c.get("id"): c for c in calls}
    lookups: list[dict[str, str]] = []
    actions: list[dict[str, str]] = []
    why: list[str] = []
    for call in calls:
        status = call.get("status", "failed")
        if status == "repeat":
            status = by_id.get(call.get("repeat_of"), {}).get("status", "failed")
        entry = {"tool": str(call.get("name")), "status": status}
        (actions if call.get("writes") else lookups).append(entry)
        if status in ERROR_STATUSES:
            why.append(f"{entry['tool']} {'was refused' if status == 'denied' else 'failed'}")
        elif not call.get("writes") and status != "empty":
            why.append(f"{entry['tool']} found something")
    asked = asks_silence(reply)
    if turn_status != "replied":
        why.insert(0, f"the run ended {turn_status}")
    if not lookups:
        why.append("it looked at nothing")
    if staged_writes:
        why.append("it made changes that wait on a delivered reply")
    if not asked:
        why.insert(0, "it wrote a report")
    return Evidence(not why, asked, turn_status, lookups, actions, list(dict.fromkeys(why)))
