"""Fixtures (``loopback``, ``plugin``) for tests of slots and plugins, imported by the test
modules that use them: the loopback plugin installed as a real distribution: its dist-info, with an entry_points.txt
made from its pyproject.toml, on sys.path, so ``importlib.metadata`` finds its entry points in
the ``pepper.plugins`` group exactly as it finds a pip-installed package's."""

from __future__ import annotations

import shutil
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import core.slots.catalog  # noqa: F401  (every core slot registered)
import text_loop.harness  # noqa: F401  (and the harness)
from core.slots import SLOTS

PLUGIN = Path(__file__).resolve().parent / "slots" / "loopback_plugin"


# Module scope: other test modules of the run never see the plugin (their apps mount no routes of it).
@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = tmp_path_factory.mktemp("site")
    shutil.copy(PLUGIN / "pepper_loopback_plugin.py", root)
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist = root / f"pepper_loopback_plugin-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["pepper.plugins"]
    (dist / "entry_points.txt").write_text(
        "[pepper.plugins]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
    )
    sys.path.insert(0, str(root))
    SLOTS.invalidate(plugins=True)
    import pepper_loopback_plugin

    yield pepper_loopback_plugin
    sys.path.remove(str(root))
    SLOTS.invalidate(plugins=True)


@pytest.fixture
def plugin(loopback: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The loopback plugin with every occupant answering, and fresh slot settings for the test."""
    loopback.MODES.clear()
    loopback.CALLS.clear()
    loopback.SEEN.clear()
    for spec in SLOTS.specs.values():
        monkeypatch.setattr(spec, "timeout", spec.timeout)  # a test may shorten one
    SLOTS.invalidate()
    yield loopback
    SLOTS.invalidate()
