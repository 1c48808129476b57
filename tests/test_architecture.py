"""The architecture, checked mechanically on every run.

1. Layers import down only: core < voice, text_loop < answering_service < gateway; voice and
   text_loop never import each other.
2. Feature areas (packages under core/tools/areas/) never import each other.
3. Vendor SDKs are imported only inside their adapter modules; pipecat only inside voice/.
4. Call profiles (subclasses of ``voice.profile.CallProfile``) reach the call engine only through
   its public controls: nothing subclasses ``CallEngine``, and a profile reads no private
   (underscore) attribute of anything but itself.
5. The database belongs to core: asyncpg is imported, and SQL statements are written, only under
   core/ (the layers above call its records: core/records/, core/conversation.py, core/identity.py...).
6. Inside core, the store, the records and memory sit below the tools: they never import core.tools.
"""

from __future__ import annotations

import ast
import re
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
    "twilio": ("core/adapters/twilio/",),
    # The MCP client and the loopback servers tests and benchmarks run.
    "mcp": ("core/adapters/mcp/",),
    "mcp_types": ("core/adapters/mcp/",),
    # Rooms: Pepper's Matrix client, and the embedded homeserver's signing key.
    "nio": ("core/adapters/matrix/",),
    "signedjson": ("core/adapters/matrix/",),
    "pipecat": ("voice/",),
    # The cascade's local speech models.
    "faster_whisper": ("voice/adapters/",),
    "piper": ("voice/adapters/",),
    # Browser calls over WebRTC, and the loopback browser that tests them.
    "aiortc": ("voice/adapters/", "voice/testing/"),
    "av": ("voice/adapters/", "voice/testing/"),
    # Traces: the tracing module, and the loopback collector tests send them to.
    "opentelemetry": ("core/tracing.py", "core/testing/"),
    # The database driver: the store and its records.
    "asyncpg": ("core/",),
    # Reading a mailbox the person connected over IMAP.
    "imapclient": ("core/adapters/imap/",),
}

# A string that is an SQL statement (or a fragment that starts one): what a string constant, or the
# text an f-string starts with, may only be under core/.
SQL_STATEMENT = re.compile(
    r"^\s*\(?\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+(\s+\w+)?\s+SET\s|DELETE\s+FROM\s|WITH\s+(RECURSIVE\s+)?\w+\s+AS\s*\("
    r"|(CREATE|ALTER|DROP)\s+(TABLE|INDEX|EXTENSION|DATABASE|FUNCTION|TRIGGER)\s|TRUNCATE\s|LISTEN\s|NOTIFY\s)"
)
SQL_HOMES = ("core/",)
# Parts of core the tools are built on, which therefore never import them.
BELOW_TOOLS = ("core/store/", "core/records/", "core/memory/")


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


def sql_statements_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, first words)`` of each string constant (or f-string's leading text) that is SQL."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=path.relative_to(root).as_posix())
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = str(node.values[0].value)
        if text is not None and SQL_STATEMENT.match(text):
            found.append((node.lineno, " ".join(text.split()[:3])))
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
                if (imp.module == sdk or imp.module.startswith(sdk + ".")) and not imp.path.startswith(homes):
                    problems.append(f"{where}: {sdk} belongs only in {', '.join(homes)}")
            if imp.path.startswith(BELOW_TOOLS) and (
                imp.module == "core.tools" or imp.module.startswith("core.tools.")
            ):
                problems.append(f"{where}: {imp.path.split('/')[1]} is below the tools and may not import them")
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(SQL_HOMES):
            for line, words in sql_statements_of(path, root):
                problems.append(f"{rel}:{line} has SQL ({words}...): SQL belongs only in core/ (its records)")
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
        ("gateway/sms.py", "from twilio.rest import Client\n", "twilio belongs only in"),
        ("voice/routing.py", "from twilio.twiml.voice_response import VoiceResponse\n", "twilio belongs only in"),
        ("gateway/signatures.py", "from twilio.request_validator import RequestValidator\n",
         "twilio belongs only in"),
        ("core/testing/twilio_peer.py", "from twilio.request_validator import RequestValidator\n",
         "twilio belongs only in"),
        ("core/settings.py", "import twilio\n", "twilio belongs only in"),
        ("core/memory.py", "from google import genai\n", "google.genai belongs only in"),
        ("gateway/calls.py", "from pipecat.frames.frames import Frame\n", "pipecat belongs only in"),
        ("gateway/live.py", "import asyncpg\n", "asyncpg belongs only in core/"),
        ("voice/control.py", "from asyncpg import Connection\n", "asyncpg belongs only in core/"),
        ("gateway/cli_x.py", 'async def f(db):\n    return await db.fetch("SELECT id FROM calls")\n',
         "SQL belongs only in core/"),
        ("text_loop/x.py", 'Q = """\n    INSERT INTO task_runs (id) VALUES ($1)\n"""\n', "SQL belongs only in core/"),
        ("voice/x.py", 'Q = ("UPDATE calls SET held_by = $1"\n     " WHERE call_sid = $2")\n',
         "SQL belongs only in core/"),
        ("answering_service/x.py", 'Q = f"DELETE FROM {TABLE} WHERE id = $1"\n', "SQL belongs only in core/"),
        ("gateway/x.py", 'Q = """WITH picked AS (SELECT 1) SELECT * FROM picked"""\n', "SQL belongs only in core/"),
        ("text_loop/x.py", 'Q = "(SELECT count(*) FROM user_skills WHERE account_id = $1)"\n',
         "SQL belongs only in core/"),
        ("core/memory/index.py", "from core.tools.registry import transaction\n",
         "memory is below the tools and may not import them"),
        ("core/store/pool.py", "import core.tools\n", "store is below the tools and may not import them"),
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
    _write(tmp_path, "core/adapters/twilio/rest.py", "from twilio.rest import Client\n")
    _write(tmp_path, "core/adapters/twilio/twiml.py", "from twilio.twiml.voice_response import VoiceResponse\n")
    _write(tmp_path, "voice/call.py", "from core.adapters.twilio import media_streams\n")
    _write(tmp_path, "core/testing/twilio_peer.py", "from core.adapters.twilio.signatures import sign\n")
    _write(tmp_path, "core/records/calls.py", 'import asyncpg\nQ = "UPDATE calls SET held_by = $1"\n')
    _write(tmp_path, "core/memory/index.py", "from core.store.pool import transaction\nfrom core.models import types\n")
    _write(tmp_path, "core/tools/areas/memory/tools.py", "from core.memory import search\n")
    _write(tmp_path, "core/testing/postgres.py", 'import asyncpg\nQ = "SELECT 1"\n')
    # Words that only look like SQL: prose, an iCalendar line, a lowercase "select".
    _write(tmp_path, "gateway/cli_x.py", 'HELP = "Select a time; update the list."\nICS = "BEGIN:VCALENDAR"\n'
                                         'Q = "select the first"\nN = "SELECTED 3 items"\n')  # fmt: skip
    assert violations(tmp_path) == []


def _module_of(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def import_cycles(root: Path) -> list[list[str]]:
    """Import cycles between modules of the product packages, function-level imports included
    (an import inside a function only hides a cycle: the modules still cannot be understood,
    tested or loaded apart). A package importing its own submodules to re-export them is not a
    cycle of the design, so a cycle made only of one package and its submodules is left out."""
    modules = {_module_of(p.relative_to(root).as_posix()): p for p in source_files(root)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for imp in imports_of(path, root):
            parts = imp.module.split(".")
            for i in range(len(parts), 0, -1):  # the longest prefix that is one of our modules
                target = ".".join(parts[:i])
                if target in modules:
                    if target != module:
                        graph[module].add(target)
                    break
    # Tarjan's strongly connected components, iteratively (no recursion limit on deep chains).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                facade = any(all(m == top or m.startswith(top + ".") for m in component) for top in component)
                if len(component) > 1 and not facade:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_no_module_imports_itself_through_others():
    assert import_cycles(ROOT) == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    _write(tmp_path, "gateway/server.py", "from gateway.worker import Worker\n")
    _write(tmp_path, "gateway/worker.py", "def run():\n    from gateway.server import build\n")
    _write(tmp_path, "gateway/app.py", "from gateway.worker import Worker\n")
    assert import_cycles(tmp_path) == [["gateway.server", "gateway.worker"]]
    # A package re-exporting its own submodules is not a cycle.
    _write(tmp_path, "core/store/__init__.py", "from core.store.database import Database\n")
    _write(tmp_path, "core/store/database.py", "from core.store import errors\n")
    assert import_cycles(tmp_path) == [["gateway.server", "gateway.worker"]]


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, ast.Name | ast.Attribute)}


def engine_encapsulation(root: Path) -> list[str]:
    problems: list[str] = []
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = _base_names(node)
            if "CallEngine" in bases:
                problems.append(f"{rel}:{node.lineno} {node.name} subclasses the call engine")
            if "CallProfile" not in bases:
                continue
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Attribute)
                    and inner.attr.startswith("_")
                    and not inner.attr.startswith("__")
                    and not (isinstance(inner.value, ast.Name) and inner.value.id in ("self", "cls"))
                ):
                    problems.append(f"{rel}:{inner.lineno} the profile {node.name} reads private {inner.attr}")
    return problems


def test_profiles_use_the_call_engine_only_through_its_controls():
    assert engine_encapsulation(ROOT) == []


@pytest.mark.parametrize(
    "text",
    [
        "class Mine(CallEngine):\n    pass\n",
        "class Mine(CallProfile):\n    def on_listening(self):\n        self.controls._marks.clear()\n",
    ],
)
def test_the_encapsulation_check_catches_a_profile_reaching_into_the_engine(tmp_path, text):
    _write(tmp_path, "answering_service/profile.py", text)
    assert len(engine_encapsulation(tmp_path)) == 1


# The pool helpers take whatever holds a connection (a Database, a pool, a connection) on purpose.
UNTYPED_STORE_HANDLES = ("core/store/pool.py",)


def untyped_store_handles(root: Path) -> list[str]:
    """Parameters named ``db`` annotated ``Any``: the store handle is a ``Queries`` (or a
    ``Database`` where a transaction is taken), so what a function may do with it is checked."""
    found = []
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(UNTYPED_STORE_HANDLES):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    if arg.arg == "db" and arg.annotation is not None and ast.unparse(arg.annotation) == "Any":
                        found.append(f"{rel}:{arg.lineno} {node.name}(db: Any)")
    return found


def test_the_store_handle_is_typed():
    assert untyped_store_handles(ROOT) == []


def test_the_store_handle_check_catches_an_untyped_one(tmp_path):
    _write(tmp_path, "gateway/x.py", "from typing import Any\nasync def f(db: Any) -> None: ...\n")
    _write(tmp_path, "core/store/pool.py", "from typing import Any\nasync def connection(db: Any) -> None: ...\n")
    assert untyped_store_handles(tmp_path) == ["gateway/x.py:2 f(db: Any)"]
