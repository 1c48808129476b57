"""The research helper as one more child of ``pepper serve`` (the process is ``core.web.helper``).

Started with ``python -m core.web.helper`` as a plain subprocess, not a ``multiprocessing`` child:
a spawned child gets the server's whole environment (``DATABASE_URL``, ``PEPPER_SECRET_KEY``) and
its settings object, and the helper must hold neither. Its environment is built from scratch
(``core.web.helper.helper_environment``), its settings come down its standard input (only the
model, search and relay ones), and it runs in a directory of its own, where no ``pepper.toml``
is. It listens on a unix socket in a private temporary directory (mode 0700); the turn workers
and media processes learn the path from ``PEPPER_WEB_RESEARCH_SOCKET`` in their settings. A helper that dies is
started again; the stop is SIGTERM, then a kill after the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import orjson

from core.settings import Settings
from core.web.helper import ResearchUnavailable, ask, helper_config, helper_environment
from core.web.search import search_choice
from gateway.children import cancelled

log = logging.getLogger(__name__)

RESTART_DELAY = 1.0


class ResearchHelper:
    label = "research helper"

    def __init__(self, settings: Settings) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="pepper-research-"))  # 0700, short enough for a socket path
        self.socket_path = self._dir / "research.sock"
        self._config = orjson.dumps(helper_config(settings))
        self._process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @classmethod
    def wanted(cls, settings: Settings) -> bool:
        """Whether a search service is set up (without one there is nothing for a helper to do)."""
        return settings.web_research_socket is None and search_choice(settings) is not None

    @property
    def pids(self) -> list[int]:
        process = self._process
        return [process.pid] if process is not None and process.returncode is None else []

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name="pepper-research-helper")

    async def _spawn(self) -> asyncio.subprocess.Process:
        self._process = process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "core.web.helper", str(self.socket_path), stdin=asyncio.subprocess.PIPE,
            env=helper_environment(os.environ), cwd=self._dir,
        )  # fmt: skip
        assert process.stdin is not None
        process.stdin.write(self._config)
        await process.stdin.drain()
        process.stdin.close()
        log.info("started the research helper: %s", process.pid)
        return process

    async def _supervise(self) -> None:
        while not self._stopping:
            process = await self._spawn()
            code = await process.wait()
            if self._stopping:
                return
            log.error("research helper %s exited with %s; starting another", process.pid, code)
            await asyncio.sleep(RESTART_DELAY)

    async def ready(self, within: float = 60.0) -> int:
        """Wait until the helper answers a ping; its pid."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            try:
                return int((await ask(self.socket_path, {"op": "ping"}, 2.0))["pid"])
            except ResearchUnavailable:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def stop(self, grace: float) -> None:
        self._stopping = True
        await cancelled(self._watch)
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), grace + 5)
            except TimeoutError:
                log.warning("research helper %s did not stop in time; killing it", process.pid)
                process.kill()
                await process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
        log.info("research helper stopped")
