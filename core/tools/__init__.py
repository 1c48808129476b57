"""Tools for text and voice alike: the registry, the gate and its policies, staged writes.

Feature areas live in ``core.tools.areas``, one package each; they never import one another.
"""

from core.tools.context import SESSION_KINDS, TRUST_LEVELS, SessionContext, SessionKind, Trust
from core.tools.gate import Gate, GateDecision, GateStep, Policy, Verdict, default_gate
from core.tools.registry import Narrowing, PlannedWrite, Tool, ToolContext, ToolOutcome, ToolRegistry, check_arguments
from core.tools.runner import CallOutcome, run_call
from core.tools.staging import (
    ResolvedWrite,
    commit_turn_writes,
    drop_turn_writes,
    recover_unresolved,
    stage_write,
)

__all__ = [
    "SESSION_KINDS",
    "TRUST_LEVELS",
    "CallOutcome",
    "Gate",
    "GateDecision",
    "GateStep",
    "Narrowing",
    "PlannedWrite",
    "Policy",
    "ResolvedWrite",
    "SessionContext",
    "SessionKind",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolRegistry",
    "Trust",
    "Verdict",
    "check_arguments",
    "commit_turn_writes",
    "default_gate",
    "drop_turn_writes",
    "recover_unresolved",
    "run_call",
    "stage_write",
]
