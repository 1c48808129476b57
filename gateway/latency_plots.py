"""The dashboard's latency plots, drawn on the server as inline SVG (no script, nothing fetched):
a call's replies as stacked bars (``reply_bars``: endpointing, the model, tools, Pepper's relay)
and recent calls' median and p99 model and relay times (``recent_calls``). Each returns the
shapes' coordinates and values for the templates (``templates/latency.html``), or None when there
is nothing to draw."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

# The parts of one reply's latency, left to right, as the call engine records them per reply.
REPLY_PARTS: tuple[tuple[str, str, str], ...] = (
    ("endpointing_ms", "endpointing (the model's)", "#8e8e93"),
    ("model_ms", "model", "#0a84ff"),
    ("tool_ms", "tools", "#ff9f0a"),
    ("relay_ms", "Pepper's relay", "#30d158"),
)
WIDTH = 600
LABEL_W, TOTAL_W = 44, 86  # the reply's number on the left, its total on the right
BAR_H, BAR_GAP, LEGEND_H = 16, 6, 22
PANEL_H, PANEL_PAD = 70, 14
RECENT_CALLS = 30


def quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def numbers(value: Any) -> list[float]:
    """The numbers of a recorded list (anything else in it, or a record that is no list, skipped)."""
    if not isinstance(value, list):
        return []
    return [float(v) for v in value if isinstance(v, int | float) and not isinstance(v, bool)]


@dataclass(frozen=True)
class Segment:
    part: str
    label: str
    color: str
    ms: float
    x: float
    width: float


@dataclass(frozen=True)
class Bar:
    n: int  # the reply's number, from 1
    y: float
    total_ms: float
    segments: tuple[Segment, ...]


def reply_bars(stats: dict[str, Any]) -> dict[str, Any] | None:
    """One stacked bar per timed reply of a call's figures (``voice.engine.CallStats``). The
    model's part is its ``model_ms`` less the tools that ran inside it. A call recorded before the
    per-reply endpointing and tools were kept shows those as 0 (``partial``)."""
    model, relay = numbers(stats.get("model_ms")), numbers(stats.get("relay_ms"))
    count = min(len(model), len(relay))
    if not count:
        return None
    endpointing, tools = numbers(stats.get("reply_endpointing_ms")), numbers(stats.get("reply_tool_ms"))
    rows = []
    for i in range(count):
        tool = tools[i] if i < len(tools) else 0.0
        ep = endpointing[i] if i < len(endpointing) else 0.0
        rows.append({"endpointing_ms": ep, "model_ms": max(0.0, model[i] - tool), "tool_ms": tool,
                     "relay_ms": relay[i]})  # fmt: skip
    span = WIDTH - LABEL_W - TOTAL_W
    scale = span / (max(sum(r.values()) for r in rows) or 1.0)
    bars = []
    for i, row in enumerate(rows):
        x, segments = float(LABEL_W), []
        for part, label, color in REPLY_PARTS:
            ms = row[part]
            width = max(ms * scale, 1.0) if ms > 0 else 0.0  # a part of a fraction of a ms still shows
            segments.append(Segment(part, label, color, round(ms, 1), round(x, 1), round(width, 1)))
            x += width
        bars.append(Bar(i + 1, i * (BAR_H + BAR_GAP), round(sum(row.values()), 1), tuple(segments)))
    plot_h = count * (BAR_H + BAR_GAP)
    return {
        "bars": bars,
        "width": WIDTH,
        "height": plot_h + LEGEND_H,
        "bar_h": BAR_H,
        "total_x": WIDTH - TOTAL_W + 6,
        "legend_y": plot_h + 4,
        "legend": [(label, color, LABEL_W + n * 130) for n, (_, label, color) in enumerate(REPLY_PARTS)],
        "partial": count > min(len(endpointing), len(tools)),
    }


@dataclass(frozen=True)
class Point:
    call_sid: str
    x: float
    p50: float
    p99: float
    y50: float
    y99: float


def recent_calls(rows: list[Any]) -> dict[str, Any] | None:
    """Two small panels over recent calls, oldest on the left: per call the median and p99 of its
    replies' model time and of Pepper's relay time. ``rows``: ``call_sid``, ``model_ms``,
    ``relay_ms`` (lists), oldest first."""
    panels = []
    for key, label, color in (("model_ms", "model: speech stopped to first audio", "#0a84ff"),
                              ("relay_ms", "Pepper's relay of that audio", "#30d158")):  # fmt: skip
        calls = [(r["call_sid"], ms) for r in rows if (ms := numbers(r[key]))]
        if not calls:
            continue
        figures = [(sid, quantile(ms, 0.5), quantile(ms, 0.99)) for sid, ms in calls]
        top = max(p99 for _, _, p99 in figures) or 1.0
        step = (WIDTH - 2 * LABEL_W) / max(len(figures), 1)
        inner = PANEL_H - 2 * PANEL_PAD

        def y(ms: float, top: float = top, inner: float = inner) -> float:
            return round(PANEL_PAD + inner * (1 - ms / top), 1)

        points = [Point(sid, round(LABEL_W + step * (i + 0.5), 1), round(p50, 3), round(p99, 3), y(p50), y(p99))
                  for i, (sid, p50, p99) in enumerate(figures)]  # fmt: skip
        panels.append({
            "key": key, "label": label, "color": color, "top": round(top, 3), "points": points,
            "p50_line": " ".join(f"{p.x},{p.y50}" for p in points),
            "p99_line": " ".join(f"{p.x},{p.y99}" for p in points),
        })  # fmt: skip
    if not panels:
        return None
    return {"panels": panels, "width": WIDTH, "height": PANEL_H, "left": LABEL_W, "right": WIDTH - LABEL_W,
            "bottom": PANEL_H - PANEL_PAD, "top_y": PANEL_PAD}  # fmt: skip
