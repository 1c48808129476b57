"""docs/feature-areas.md lists every registered tool under its area, with whether it writes."""

from __future__ import annotations

import re
from pathlib import Path

from core.tools.connectors import Connectors
from core.tools.starter import starter_registry
from text_loop.skills.toolsets import TOOLSETS

DOC = Path(__file__).resolve().parents[2] / "docs" / "feature-areas.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (reads|writes)( \(staged\))? \| [^|]+ \|$")


def documented() -> dict[str, tuple[str, bool, bool]]:
    """tool -> (area heading, writes, staged)."""
    found: dict[str, tuple[str, bool, bool]] = {}
    area = ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            area = line[3:].split()[0]
        match = ROW.match(line)
        if match:
            assert match[1] not in found, f"{match[1]} is listed twice"
            found[match[1]] = (area, match[2] == "writes", bool(match[3]))
    return found


def test_every_registered_tool_is_documented_under_its_area_with_its_writes():
    registry = starter_registry(Connectors(research_socket="/run/pepper-research.sock"))
    doc = documented()
    for tool in registry.all():
        assert tool.name in doc, f"docs/feature-areas.md does not list {tool.name}"
        assert doc[tool.name] == (tool.area, tool.writes, tool.staged), tool.name
    assert set(doc) == {t.name for t in registry.all()}, "the doc lists tools that are not registered"


def test_every_area_and_tool_set_area_has_a_section():
    headings = {line[3:].split()[0] for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("## ")}
    areas = {t.area for t in starter_registry(Connectors(research_socket="/x")).all()}
    assert areas <= headings
    assert {a for s in TOOLSETS.values() for a in s.areas} - {"scheduler", "search"} <= headings
    assert len(headings) >= 22
