"""What the feature-area tests share: the clock, the owner's address, a turn-like caller of
one tool, and a loopback HTTP server for remote APIs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from core.conversation import start_turn
from core.identity import Account
from core.models.types import ToolCall
from core.store import Database
from core.tools import SessionContext, ToolContext, commit_turn_writes, default_gate, run_call
from core.tools.connectors import Connectors, account_connections
from core.tools.runner import CallOutcome
from core.tools.starter import starter_registry

NOW = datetime(2025, 3, 27, 10, 0, tzinfo=UTC)  # a Thursday, three days before Paris moves to summer time
OWNER_EMAIL = "ada@example.com"


@dataclass
class Caller:
    """Runs one tool call the way a turn does: registry, default gate, runner."""

    db: Database
    account: Account
    connectors: Connectors
    kind: str = "live"
    now: datetime = NOW
    calls: int = 0

    async def session(self, kind: str | None = None) -> SessionContext:
        conversation = await self.db.fetchval("SELECT id FROM conversations WHERE account_id = $1", self.account.id)
        turn = await start_turn(self.db, conversation, channel="sms", kind=kind or self.kind)
        names = await account_connections(self.db, self.account.id, self.connectors)
        return SessionContext(
            kind or self.kind, "owner_verified", "sms", self.account.id, conversation, turn, "Europe/Paris", names
        )  # type: ignore[arg-type]

    async def __call__(
        self, name: str, args: dict[str, Any], *, kind: str | None = None, session: Any = None,
        delivered: bool = False,
    ) -> CallOutcome:  # fmt: skip
        """One call; ``delivered``: then the turn's reply reached the person, so its staged writes commit."""
        self.calls += 1
        session = session or await self.session(kind)
        registry = starter_registry(self.connectors)
        ctx = ToolContext(session, self.db, self.now)
        outcome = await run_call(registry, default_gate(), ctx, ToolCall(f"c{self.calls}", name, args))
        if delivered:
            await commit_turn_writes(self.db, registry, session.turn_id)
        return outcome

    def using(self, **changes: Any) -> Caller:
        return replace(self, connectors=replace(self.connectors, **changes))


@asynccontextmanager
async def serving(routes: dict[str, Callable[[web.Request], Awaitable[web.Response]]]) -> AsyncIterator[str]:
    """Serve these GET routes on 127.0.0.1 (feeds, pages); yields the base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def cli(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """`pepper ...` in-process with this environment (run it in a thread from async tests)."""
    from gateway.cli import main

    lines: list[str] = []
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code = main(list(argv), out=lines.append)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, "\n".join(lines)
