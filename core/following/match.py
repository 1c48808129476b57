"""Pairing a source's new events with the stored ones: by title, then nearest date.

A moved event keeps its title and lands on the stored event nearest in date, so it is an update.
Within a series (a title that occurs more than once, old or new) an event is paired only with
one less than half the series' smallest gap away, so two weekly "Swim practice" events stay two
and a week that drops out is missed rather than "moved" onto its neighbour. Pairs are made
closest first, over all titles at once, so the result does not depend on the order of the page.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

# How far a one-off event may move and still be the same event.
MAX_MOVE = timedelta(days=120)


@dataclass(frozen=True)
class Stored:
    """A stored event as matching sees it."""

    id: int
    title: str
    start: datetime


@dataclass
class Pairing:
    pairs: list[tuple[int, Stored]]  # (index of the new event, the stored one it updates)
    new: list[int]  # indexes of new events with no stored match
    missing: list[Stored]  # stored events the new version left out


def title_key(title: str) -> str:
    return " ".join(re.findall(r"\w+", title.casefold()))


def _limit(starts: list[datetime]) -> timedelta:
    ordered = sorted(set(starts))
    if len(ordered) < 2:
        return MAX_MOVE
    gap = min(b - a for a, b in itertools.pairwise(ordered))
    return min(MAX_MOVE, gap / 2)


def pair(new: list[tuple[str, datetime]], old: list[Stored]) -> Pairing:
    """``new``: (title, start) of each new event, in any order."""
    by_title_new: dict[str, list[int]] = defaultdict(list)
    by_title_old: dict[str, list[Stored]] = defaultdict(list)
    for i, (title, _) in enumerate(new):
        by_title_new[title_key(title)].append(i)
    for row in old:
        by_title_old[title_key(row.title)].append(row)
    candidates: list[tuple[timedelta, int, int, Stored]] = []
    for key, news in by_title_new.items():
        olds = by_title_old.get(key, [])
        if not olds:
            continue
        news_starts = [new[i][1] for i in news]
        old_starts = [o.start for o in olds]
        series = len(news) > 1 or len(olds) > 1
        limit = min(_limit(news_starts), _limit(old_starts)) if series else MAX_MOVE
        for i in news:
            for o in olds:
                distance = abs(new[i][1] - o.start)
                if distance <= limit:
                    candidates.append((distance, i, o.id, o))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    taken_new: set[int] = set()
    taken_old: set[int] = set()
    pairs: list[tuple[int, Stored]] = []
    for _, i, oid, o in candidates:
        if i in taken_new or oid in taken_old:
            continue
        taken_new.add(i)
        taken_old.add(oid)
        pairs.append((i, o))
    pairs.sort(key=lambda p: p[0])
    return Pairing(
        pairs,
        [i for i in range(len(new)) if i not in taken_new],
        [o for o in old if o.id not in taken_old],
    )
