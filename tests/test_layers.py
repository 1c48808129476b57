"""Imports point down only, and feature areas never import each other (an ast walk, like hassfest)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "voice", "text_loop", "answering_service", "gateway")
# What each package may import from the project, besides itself.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "voice": {"core"},
    "text_loop": {"core"},
    "answering_service": {"core", "voice"},
    "gateway": {"core", "voice", "text_loop", "answering_service"},
}
AREAS = ROOT / "core" / "tools" / "areas"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_layers_below_them(package: str):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top in PACKAGES and top != package and top not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_feature_areas_never_import_each_other():
    areas = sorted(p.name for p in AREAS.iterdir() if (p / "__init__.py").exists())
    assert {"clock", "notes", "todos", "dossier"} <= set(areas)
    bad = []
    for area in areas:
        for path in sorted((AREAS / area).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[:3] == ["core", "tools", "areas"] and len(parts) > 3 and parts[3] != area:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_the_walk_would_catch_an_upward_import(tmp_path: Path):
    sample = tmp_path / "x.py"
    sample.write_text("from text_loop.turn import run_turn\nimport gateway.cli\n")
    assert [m for _, m in _imports(sample)] == ["text_loop.turn", "text_loop.turn.run_turn", "gateway.cli"]
