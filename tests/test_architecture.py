"""The architecture, checked mechanically on every run.

1. Layers import down only: core < voice, text_loop < answering_service < gateway; voice and
   text_loop never import each other.
2. Feature areas (packages under core/tools/areas/) never import each other.
3. Vendor SDKs are imported only inside their adapter modules; pipecat only inside voice/.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"core": 0, "voice": 1, "text_loop": 1, "answering_service": 2, "gateway": 3}
AREAS_DIR = ("core", "tools", "areas")

# SDK -> where it may be imported (path prefixes, relative to the repository root).
SDK_HOMES: dict[str, tuple[str, ...]] = {
    "openai": ("core/models/adapters/", "voice/adapters/"),
    "anthropic": ("core/models/adapters/",),
    "google.genai": ("core/models/adapters/", "voice/adapters/"),
    "deepgram": ("voice/adapters/",),
    "twilio.rest": ("gateway/twilio_client.py", "gateway/adapters/"),
    "pipecat": ("voice/",),
    # The cascade's local speech models.
    "faster_whisper": ("voice/adapters/",),
    "piper": ("voice/adapters/",),
}
# Test kits may drive the real SDKs against the loopback peers they ship.
SDK_EXEMPT = ("core/testing/",)


@dataclass(frozen=True)
class Import:
    path: str  # relative to the root, forward slashes
    line: int
    module: str


def imports_of(path: Path, root: Path) -> list[Import]:
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    package = rel.rsplit("/", 1)[0].replace("/", ".")
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # resolve relative imports against this file's package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append(Import(rel, node.lineno, module))
            found += [Import(rel, node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def source_files(root: Path) -> list[Path]:
    return sorted(p for top in LAYERS if (root / top).is_dir() for p in (root / top).rglob("*.py"))


def _area_of(rel_or_module: str) -> str | None:
    parts = rel_or_module.replace("/", ".").split(".")
    if tuple(parts[:3]) == AREAS_DIR and len(parts) > 3:
        return parts[3]
    return None


def violations(root: Path) -> list[str]:
    problems: list[str] = []
    for path in source_files(root):
        for imp in imports_of(path, root):
            top = imp.path.split("/", 1)[0]
            other = imp.module.split(".", 1)[0]
            where = f"{imp.path}:{imp.line} imports {imp.module}"
            if other in LAYERS and other != top and LAYERS[other] >= LAYERS[top]:
                problems.append(f"{where}: {top} may only import layers below it")
            mine, theirs = _area_of(imp.path), _area_of(imp.module)
            if mine and theirs and mine != theirs:
                problems.append(f"{where}: feature area {mine} may not import feature area {theirs}")
            for sdk, homes in SDK_HOMES.items():
                if (imp.module == sdk or imp.module.startswith(sdk + ".")) and not imp.path.startswith(
                    homes + SDK_EXEMPT
                ):
                    problems.append(f"{where}: {sdk} belongs only in {', '.join(homes)}")
    return sorted(set(problems))


def test_the_codebase_keeps_its_architecture():
    assert violations(ROOT) == []


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        ("core/store.py", "from gateway.app import create_app\n", "core may only import layers below it"),
        ("text_loop/loop.py", "import voice.session\n", "text_loop may only import layers below it"),
        ("voice/call.py", "from text_loop import turn\n", "voice may only import layers below it"),
        ("answering_service/x.py", "from gateway import cli\n", "answering_service may only import"),
        ("core/tools/areas/calendar/tools.py", "from core.tools.areas.email import send\n",
         "feature area calendar may not import feature area email"),
        ("core/tools/areas/todos/tools.py", "from ..notes import store\n",
         "feature area todos may not import feature area notes"),
        ("text_loop/loop.py", "import openai\n", "openai belongs only in"),
        ("gateway/sms.py", "from twilio.rest import Client\n", "twilio.rest belongs only in"),
        ("core/memory.py", "from google import genai\n", "google.genai belongs only in"),
        ("gateway/calls.py", "from pipecat.frames.frames import Frame\n", "pipecat belongs only in"),
    ],
)  # fmt: skip
def test_the_checker_catches_each_kind_of_violation(tmp_path, rel, text, expected):
    _write(tmp_path, rel, text)
    found = violations(tmp_path)
    assert any(expected in v for v in found), found


def test_the_checker_allows_what_the_design_allows(tmp_path):
    _write(tmp_path, "gateway/app.py", "from core.store import Database\nfrom text_loop import x\nimport voice\n")
    _write(tmp_path, "voice/realtime.py", "import pipecat\nfrom core.models import types\n")
    _write(tmp_path, "core/models/adapters/openai_responses.py", "import openai\n")
    _write(tmp_path, "core/tools/areas/todos/tools.py", "from core.tools.registry import Tool\nfrom . import store\n")
    _write(tmp_path, "gateway/twilio_client.py", "from twilio.rest import Client\n")
    assert violations(tmp_path) == []
