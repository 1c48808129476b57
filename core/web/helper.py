"""The research helper process: the one place the web is read, and nothing private is held.

``pepper serve`` starts it (``gateway.research``) as ``python -m core.web.helper`` with an
environment built from scratch (:func:`helper_environment`: no ``DATABASE_URL``, no
``PEPPER_SECRET_KEY``, no other ``PEPPER_`` variable) and a working directory of its own, and
writes its settings to its standard input: only the model providers', the search service's and
the relay's (:data:`HELPER_SETTINGS`). It never opens the store, the vault or an account.

It answers on a unix socket, one JSON line each way: ``{"question": "..."}`` gets the
:class:`~core.web.research.ResearchReport` as JSON (or ``{"unavailable": reason}``);
``{"op": "ping"}`` gets ``{"ok": true, "pid": ...}``. :func:`ask` is the client side the orchestrator's tool uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, SecretStr

from core.errors import PepperError
from core.settings import Settings
from core.slots import BUILTIN
from core.web.egress import Egress, egress_policy
from core.web.research import MAX_QUESTION, Researcher, ResearchReport
from core.web.search import BUILTIN_WEB_SEARCH, SlottedSearch, search_provider

log = logging.getLogger(__name__)

# The settings the helper receives; everything else (the store, the secret key, Twilio, SMTP,
# Google's OAuth client) stays with the server.
HELPER_SETTINGS = (
    "openai_api_key", "openai_base_url", "anthropic_api_key", "anthropic_base_url", "gemini_api_key",
    "gemini_base_url", "models", "web_search_provider", "brave_api_key", "tavily_api_key", "searxng_url",
    "brave_search_url", "tavily_url", "web_research_tier", "web_research_seconds", "web_fetch_seconds",
    "web_fetch_max_bytes", "web_test_loopback_ports", "log_level",
)  # fmt: skip
# Environment variables the helper inherits: what a Python process needs to start and verify TLS.
HELPER_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR")
MAX_LINE = 64 * 1024


class ResearchUnavailable(PepperError):
    code = "research-unavailable"
    retryable = True


def _reveal(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return {k: _reveal(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reveal(v) for v in value]
    return value


def helper_config(settings: Settings) -> dict[str, Any]:
    """The helper's settings, secrets in the clear (they go down a pipe, never to disk or a log)."""
    return {name: _reveal(getattr(settings, name)) for name in HELPER_SETTINGS}


def helper_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in HELPER_ENVIRONMENT if name in environ}


async def _handle(researcher: Researcher | None, limit: float, reader: Any, writer: Any) -> None:
    try:
        line = await reader.readline()
        request = orjson.loads(line) if line.strip() else {}
        if request.get("op") == "ping":
            answer: dict[str, Any] = {"ok": True, "pid": os.getpid(), "search": researcher is not None}
        elif researcher is None:
            answer = {"unavailable": "no web search service is set up (docs/research.md)"}
        else:
            question = str(request.get("question", ""))[:MAX_QUESTION]
            try:
                async with asyncio.timeout(limit):
                    slotted = SlottedSearch(str(request.get("web_search") or BUILTIN), [])
                    report = await researcher.answer(question, search=slotted)
                    report.slot_fallbacks = slotted.fallbacks
                    answer = report.as_record()
            except TimeoutError:
                answer = {"unavailable": f"the research took longer than {limit:g} s and was stopped"}
        writer.write(orjson.dumps(answer) + b"\n")
        await writer.drain()
    except Exception:
        log.exception("research request failed")
    finally:
        writer.close()


async def serve_helper(settings: Settings, socket_path: Path, stop: asyncio.Event) -> None:
    """Answer research requests on ``socket_path`` until ``stop`` is set."""
    from core.models.router import ModelRouter

    router = ModelRouter.from_settings(settings)
    egress = Egress(egress_policy(settings))
    provider = search_provider(settings, egress, router)
    BUILTIN_WEB_SEARCH.provider = provider
    researcher = Researcher(router, provider, egress, tier=settings.web_research_tier) if provider else None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a socket left by a helper that was killed
    server = await asyncio.start_unix_server(
        lambda r, w: _handle(researcher, settings.web_research_seconds, r, w), path=str(socket_path), limit=MAX_LINE
    )
    os.chmod(socket_path, 0o600)
    log.info("research helper listening on %s (search: %s)", socket_path, provider.name if provider else "none")
    try:
        async with server:
            await stop.wait()
    finally:
        await router.aclose()


async def ask(socket_path: str | Path, request: dict[str, Any], timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    """One request to the helper; raises :class:`ResearchUnavailable` when it cannot answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=16 * MAX_LINE)
            try:
                writer.write(orjson.dumps(request) + b"\n")
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError:
        raise ResearchUnavailable(f"the research helper did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise ResearchUnavailable(
            f"the research helper is not running ({exc.strerror or type(exc).__name__})"
        ) from None
    if not line.strip():
        raise ResearchUnavailable("the research helper closed the connection without an answer")
    answer = orjson.loads(line)
    if not isinstance(answer, dict):
        raise ResearchUnavailable("the research helper answered something unreadable")
    return answer


async def research(
    socket_path: str | Path,
    question: str,
    timeout: float,  # noqa: ASYNC109
    *,
    web_search: str = BUILTIN,
) -> ResearchReport:
    """Hand ``question`` to the helper and return its report; ``web_search`` names the occupant of
    the slot that answers its searches (the caller resolved it for the person)."""
    answer = await ask(socket_path, {"question": question, "web_search": web_search}, timeout)
    if "unavailable" in answer:
        raise ResearchUnavailable(str(answer["unavailable"]))
    return ResearchReport.from_record(answer)


async def _main(config: dict[str, Any], socket_path: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent = os.getppid()

    async def orphaned() -> None:  # the helper never outlives the server that started it
        while os.getppid() == parent:  # noqa: ASYNC110 (a parent's exit sends no event)
            await asyncio.sleep(1.0)
        log.warning("pepper serve went away; the research helper stops")
        stop.set()

    watch = loop.create_task(orphaned())
    try:
        await serve_helper(Settings(**config), socket_path, stop)
    finally:
        watch.cancel()


def main() -> None:
    """``python -m core.web.helper SOCKET``, the settings as one JSON object on standard input."""
    config = orjson.loads(sys.stdin.buffer.read())
    level = str(config.get("log_level", "INFO"))
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s research %(message)s")
    for name in ("httpx", "httpx2"):  # a line per request is noise here
        logging.getLogger(name).setLevel(logging.WARNING)
    asyncio.run(_main(config, Path(sys.argv[1])))


if __name__ == "__main__":
    main()
