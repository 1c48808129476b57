"""The folder ``pepper chat --folder PATH`` lends: read-only tools that run on the person's machine.

Three tools (list, read, search), declared to the server as read-only; every path is taken
relative to the folder and resolved (symlinks followed) before use, and one that lands outside
the folder (``..``, an absolute path, a symlink out) is refused here, on the client, before
anything is read. Walking the folder skips entries that resolve outside it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

MAX_READ = 20_000
MAX_ENTRIES = 200
MAX_HITS = 50
MAX_SEARCH_FILE = 1_000_000
_PATH = {"type": "string", "description": "a path inside the lent folder, relative to it ('.' is the folder)"}

DECLARED: list[dict[str, Any]] = [
    {
        "name": "list_files",
        "description": "List the files and folders in a folder of the lent folder.",
        "inputSchema": {"type": "object", "properties": {"path": _PATH}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "read_file",
        "description": f"Read a text file of the lent folder (the first {MAX_READ} characters).",
        "inputSchema": {
            "type": "object",
            "properties": {"path": _PATH},
            "required": ["path"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "search_files",
        "description": f"Find lines containing a text in the lent folder's files (at most {MAX_HITS} lines).",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}, "path": _PATH},
            "required": ["text"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True},
    },
]


class OutsideFolder(ValueError):
    """A path that resolves outside the lent folder."""


class LentFolder:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(str(root))

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` inside the folder; ``OutsideFolder`` when it is not inside."""
        if not isinstance(path, str) or "\0" in path:
            raise OutsideFolder("not a path")
        real = (self.root / path).resolve()
        if real != self.root and self.root not in real.parents:
            raise OutsideFolder(f"{path!r} is outside the lent folder")
        return real

    def _inside(self, path: Path) -> bool:
        real = path.resolve()
        return real == self.root or self.root in real.parents

    def list_files(self, path: str = ".") -> str:
        folder = self.resolve(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"{path!r} is not a folder")
        lines = []
        for entry in sorted(folder.iterdir())[:MAX_ENTRIES]:
            if not self._inside(entry):
                continue  # a symlink out of the folder
            kind = "folder" if entry.is_dir() else f"{entry.stat().st_size} bytes"
            lines.append(f"{entry.relative_to(folder)}{'/' if entry.is_dir() else ''}  {kind}")
        return "\n".join(lines) or "(empty folder)"

    def read_file(self, path: str) -> str:
        file = self.resolve(path)
        if not file.is_file():
            raise FileNotFoundError(f"{path!r} is not a file")
        with file.open("r", encoding="utf-8", errors="replace") as text:
            return text.read(MAX_READ)

    def _files(self, start: Path) -> Iterator[Path]:
        for folder, dirs, files in os.walk(start, followlinks=False):
            dirs[:] = sorted(d for d in dirs if self._inside(Path(folder) / d))
            for name in sorted(files):
                file = Path(folder) / name
                if self._inside(file) and file.is_file():
                    yield file

    def search_files(self, text: str, path: str = ".") -> str:
        start = self.resolve(path)
        hits: list[str] = []
        for file in self._files(start):
            if file.stat().st_size > MAX_SEARCH_FILE:
                continue
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(lines, 1):
                if text in line:
                    hits.append(f"{file.relative_to(self.root)}:{n}: {line.strip()[:200]}")
                    if len(hits) >= MAX_HITS:
                        return "\n".join(hits)
        return "\n".join(hits) or f"no line contains {text!r}"

    def run(self, name: str, arguments: Any) -> tuple[str, bool]:
        """One call from the server: (text, is_error). Only the declared tools exist."""
        tools: dict[str, Callable[..., str]] = {
            "list_files": self.list_files,
            "read_file": self.read_file,
            "search_files": self.search_files,
        }
        if name not in tools or not isinstance(arguments, dict):
            return f"no folder tool {name!r}", True
        try:
            return tools[name](**arguments), False
        except OutsideFolder as exc:
            return f"refused: {exc}", True
        except (OSError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}", True


class FolderLending:
    """Lends the folder for the chat: declares the tools, answers the server's calls from a
    thread of its own, and ends the lending when the chat ends."""

    def __init__(self, client: httpx.Client, folder: LentFolder, *, every: float = 0.5):
        self.client, self.folder, self.every = client, folder, every
        self.id: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FolderLending:
        response = self.client.post("/api/folder", json={"tools": DECLARED})
        if response.status_code != 201:
            raise RuntimeError(f"the server did not take the folder: {response.json().get('message', response.text)}")
        self.id = response.json()["id"]
        self._thread = threading.Thread(target=self._answer, name="pepper-folder", daemon=True)
        self._thread.start()
        return self

    def _answer(self) -> None:
        while not self._stop.wait(self.every):
            try:
                waiting = self.client.get(f"/api/folder/{self.id}/calls")
                if waiting.status_code != 200:
                    continue
                for call in waiting.json()["calls"]:
                    text, is_error = self.folder.run(call["name"], call["arguments"])
                    self.client.post(
                        f"/api/folder/{self.id}/calls/{call['id']}", json={"content": text, "is_error": is_error}
                    )
            except httpx.HTTPError:
                continue  # the server is restarting; the next round asks again

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.client.delete(f"/api/folder/{self.id}")
        except httpx.HTTPError:
            pass  # it lapses by itself once no one asks for its calls
