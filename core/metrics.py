"""Prometheus metrics, one set for every process of a server.

``pepper serve`` runs the web server, turn workers and media processes as separate processes, so
the metrics use prometheus_client's multiprocess mode: :func:`use_directory` (called by ``serve``
before any child starts; the children inherit the environment) names a directory where every
process writes its samples to memory-mapped files, and ``/metrics`` adds them up
(:func:`exposition`). Without it (the tests' in-process server, one-off CLI commands) the samples
live in this process only.

The metric objects are made on first use (:func:`metrics`), not at import: prometheus_client picks
its value store when it is first imported, and the directory is set later than that in ``serve``,
so it is picked again here before any metric exists.

Labels carry kinds and outcomes only, never an id, a number or any words of a person.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
# Seconds: a turn is a few model calls and tools; a call's clear is milliseconds (its own buckets).
TURN_BUCKETS = (0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
# A frame's pass through the call engine is a few microseconds (more when the event loop is busy);
# a GPT-Live delegation is a text turn.
FRAME_MS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 20)
DELEGATION_MS_BUCKETS = (100, 250, 500, 1000, 2000, 4000, 8000, 15000, 30000, 60000)


@dataclass(frozen=True)
class Metrics:
    turns: Any  # Counter: channel, kind, status
    turn_seconds: Any  # Histogram: channel
    turn_rounds: Any  # Histogram: channel
    model_calls: Any  # Counter: provider, outcome (ok, failed_over, error code)
    model_tokens: Any  # Counter: provider, direction (input, output, cached)
    webhooks: Any  # Counter: provider, outcome (accepted, duplicate, forged, malformed)
    calls_started: Any  # Counter: route
    calls_ended: Any  # Counter: reason
    calls_active: Any  # Gauge (summed over live processes)
    call_clear_ms: Any  # Histogram: caller speech start -> Twilio clear, per barge-in
    call_barge_ins: Any  # Counter
    call_model_ms: Any  # Histogram: the model's speech_stopped -> its first audio, per reply
    call_relay_ms: Any  # Histogram: Pepper's own relay of a reply's first audio
    call_tool_ms: Any  # Histogram: per tool call on a call
    call_endpointing_ms: Any  # Histogram: caller audio sent past the speech end when the model said it stopped
    scheduled_runs: Any  # Counter: outcome (ran, silent, failed, missed)
    # Added later; new fields go at the end.
    call_caller_to_model_ms: Any  # Histogram: sampled caller frames, Pepper's part on the way to the model
    call_model_to_caller_ms: Any  # Histogram: sampled model audio frames, Pepper's part on the way to the caller
    call_delegation_ms: Any  # Histogram: GPT-Live delegations, asked to result sent
    turn_model_rounds: Any  # Counter: channel, kind (counted rounds, summed)
    turn_tokens: Any  # Counter: channel, kind
    turn_cost: Any  # Counter: channel, kind (USD)
    turns_repaired: Any  # Counter: channel, kind
    scheduled_due: Any  # Counter: occurrences that became due
    scheduled_claimed: Any  # Counter: claims of due runs (a retry or an expired lease claims again)
    memory_jobs: Any  # Counter: kind, outcome
    memory_jobs_enqueued: Any  # Counter
    model_tier_calls: Any  # Counter: tier, provider, outcome
    slot_fallbacks: Any  # Counter: slot, reason
    call_model_reconnects: Any  # Counter: engine, outcome (reconnected, failed)


def use_directory(directory: Path) -> Path:
    """Make every process of this server (this one and the children it starts later) report into
    ``directory``, emptied first: samples of an earlier run would otherwise be added in."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    os.environ[ENV] = str(directory)
    return directory


def multiprocess() -> bool:
    return bool(os.environ.get(ENV))


@functools.cache
def metrics() -> Metrics:
    from prometheus_client import Counter, Gauge, Histogram, values

    if multiprocess() and values.ValueClass.__name__ != "MmapedValue":  # imported before serve set it
        values.ValueClass = values.get_value_class()
    return Metrics(
        turns=Counter("pepper_turns", "Turns finished", ["channel", "kind", "status"]),
        turn_seconds=Histogram("pepper_turn_seconds", "Time a turn took", ["channel"], buckets=TURN_BUCKETS),
        turn_rounds=Histogram("pepper_turn_rounds", "Model rounds per turn", ["channel"], buckets=(1, 2, 3, 4, 6, 8)),
        model_calls=Counter("pepper_model_calls", "Model calls by outcome", ["provider", "outcome"]),
        model_tokens=Counter("pepper_model_tokens", "Model tokens", ["provider", "direction"]),
        webhooks=Counter("pepper_webhooks", "Webhook requests by outcome", ["provider", "outcome"]),
        calls_started=Counter("pepper_calls_started", "Calls that reached a call engine", ["route"]),
        calls_ended=Counter("pepper_calls_ended", "Calls that ended, by reason", ["reason"]),
        calls_active=Gauge("pepper_calls_active", "Calls in progress", multiprocess_mode="livesum"),
        call_clear_ms=Histogram(
            "pepper_call_clear_ms", "Caller speech start to Twilio clear (barge-in)", buckets=MS_BUCKETS
        ),
        call_barge_ins=Counter("pepper_call_barge_ins", "Barge-ins"),
        call_model_ms=Histogram(
            "pepper_call_model_ms", "The model's speech_stopped to its first audio", buckets=MS_BUCKETS
        ),
        call_relay_ms=Histogram("pepper_call_relay_ms", "Pepper's relay of a reply's first audio", buckets=MS_BUCKETS),
        call_tool_ms=Histogram("pepper_call_tool_ms", "Tool calls on calls", buckets=MS_BUCKETS),
        call_endpointing_ms=Histogram(
            "pepper_call_endpointing_ms", "The model's end-of-speech detection, as it reports it", buckets=MS_BUCKETS
        ),
        scheduled_runs=Counter("pepper_scheduled_runs", "Scheduled runs by outcome", ["outcome"]),
        call_caller_to_model_ms=Histogram(
            "pepper_call_caller_to_model_ms",
            "Pepper's part of a caller frame's way to the model (sampled)",
            buckets=FRAME_MS_BUCKETS,
        ),
        call_model_to_caller_ms=Histogram(
            "pepper_call_model_to_caller_ms",
            "Pepper's part of a model audio frame's way to the caller (sampled)",
            buckets=FRAME_MS_BUCKETS,
        ),
        call_delegation_ms=Histogram(
            "pepper_call_delegation_ms", "GPT-Live delegations, asked to result sent", buckets=DELEGATION_MS_BUCKETS
        ),
        turn_model_rounds=Counter("pepper_turn_model_rounds", "Counted model rounds of turns", ["channel", "kind"]),
        turn_tokens=Counter("pepper_turn_tokens", "Model tokens of turns", ["channel", "kind"]),
        turn_cost=Counter("pepper_turn_cost_usd", "Model cost of turns, in USD", ["channel", "kind"]),
        turns_repaired=Counter(
            "pepper_turns_repaired", "Turns whose reply the repair pass changed", ["channel", "kind"]
        ),
        scheduled_due=Counter("pepper_scheduled_due", "Scheduled occurrences that became due"),
        scheduled_claimed=Counter("pepper_scheduled_claimed", "Claims of due scheduled runs"),
        memory_jobs=Counter("pepper_memory_jobs", "Memory jobs run, by outcome", ["kind", "outcome"]),
        memory_jobs_enqueued=Counter("pepper_memory_jobs_enqueued", "Memory jobs enqueued"),
        model_tier_calls=Counter(
            "pepper_model_tier_calls", "Model calls by tier, provider and outcome", ["tier", "provider", "outcome"]
        ),
        slot_fallbacks=Counter("pepper_slot_fallbacks", "Slot occupants that failed a call", ["slot", "reason"]),
        call_model_reconnects=Counter(
            "pepper_call_model_reconnects", "A call's voice model session replaced", ["engine", "outcome"]
        ),
    )


def process_gone(pid: int) -> None:
    """A child process died: its live gauges (calls in progress) stop counting."""
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(pid)


def exposition() -> tuple[bytes, str]:
    """The text format of every process's metrics (or this process's), and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    metrics()  # every metric is listed, at zero, before anything happened
    if multiprocess():
        from prometheus_client import multiprocess as mp

        registry = CollectorRegistry()
        mp.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
