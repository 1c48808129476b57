"""Percentiles as every benchmark prints them, so figures from different scripts mean the same.

Nearest rank: the p99 of n samples is the ceil(0.99 n)-th smallest (with fewer than 100 samples,
the largest), a sample that was actually measured, never an interpolation between two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float, *, low: bool = False) -> float:
    """The nearest-rank ``q`` percentile; ``low`` counts from the small end (the worst of a share
    where higher is better). NaN for no samples."""
    if not values:
        return math.nan
    ordered = sorted(values, reverse=low)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def p99(values: Sequence[float], *, low: bool = False) -> float:
    return percentile(values, 0.99, low=low)


def ms_figures(times: Sequence[float]) -> str:
    """``median … ms   p99 … ms``, as the benchmarks' tables print a timing."""
    import statistics

    return f"median {statistics.median(times):7.1f} ms   p99 {p99(times):7.1f} ms"
