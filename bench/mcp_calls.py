"""What Pepper's MCP client adds to a tool call, and what connecting GitHub does to the
orchestrator's prompt.

1. A loopback MCP server (built with the mcp SDK, streamable HTTP on 127.0.0.1) offers one tool.
   The same call is made N times with the SDK's own client on one session, and N times as a turn
   makes it through Pepper: the runner, the gate, the approval check against the turn's listing,
   the call on the reused session, the labelled result. Printed: median and p99 of each, and the
   difference (the time Pepper adds). The first call of a turn also reads the server's listing once
   (the held-definition check): printed separately.
2. The orchestrator's first prompt for one message, without GitHub and with GitHub's server
   connected (a loopback one offering a subset of its tools, all approved): tool-list bytes and
   whole-prompt bytes. The tools sit behind the GitHub workers, so the tool list must not grow;
   the skills list grows by the five GitHub skills' names and one-line descriptions.

    PYTHONPATH=. .venv/bin/python bench/mcp.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

from core.adapters.mcp.loopback import LoopbackMcp, LoopbackTool, direct_sdk_call_times, github_tools
from core.conversation import conversation_for, start_turn
from core.identity import create_account
from core.models.types import ToolCall
from core.records import mcp as records
from core.store import Database
from core.testing.figures import p99
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, reply
from core.tools.connectors import Connectors, account_connections
from core.tools.context import SessionContext
from core.tools.gate import default_gate
from core.tools.mcp import McpHub, account_tools, connect_server
from core.tools.registry import ToolContext, ToolRegistry
from core.tools.runner import run_call
from core.tools.starter import starter_registry
from core.vault import Vault, generate_key
from text_loop import HarnessConfig, HarnessDeps, run_turn
from text_loop.skills import SkillCatalog

ARGS = {"q": "open issues about retries"}


def line(label: str, times: list[float]) -> str:
    return f"{label}: median {statistics.median(times):.2f} ms, p99 {p99(times):.2f} ms ({len(times)} calls)"


async def call_times(db: Database, calls: int) -> None:
    connectors = Connectors(vault=Vault(generate_key()))
    hub = McpHub(connectors)
    account = await create_account(db, "Bench", timezone="UTC")
    try:
        async with LoopbackMcp([LoopbackTool("search")]) as server:
            direct = await direct_sdk_call_times(server.url, "search", ARGS, calls)
            connected, _ = await connect_server(db, hub, account.id, "tracker", server.url, None)
            await records.decide(db, connected.id, "search", approve=True)
            registry = ToolRegistry(await account_tools(db, hub, account.id))
            gate, names = default_gate(), await account_connections(db, account.id, connectors)
            conversation = await conversation_for(db, account.id)

            async def one(turn) -> float:  # type: ignore[no-untyped-def]
                session = SessionContext("live", "owner_verified", "web", account.id, conversation, turn, "UTC", names)
                ctx = ToolContext(session, db, datetime.now(UTC))
                started = time.perf_counter()
                outcome = await run_call(registry, gate, ctx, ToolCall("c", "tracker__search", ARGS))
                took = (time.perf_counter() - started) * 1000
                assert outcome.status == "ok", outcome.content
                return took

            turn = await start_turn(db, conversation, channel="web")
            await one(turn)  # the turn's listing is read here
            pepper = [await one(turn) for _ in range(calls)]
            firsts = [await one(await start_turn(db, conversation, channel="web")) for _ in range(min(calls, 50))]
    finally:
        await hub.close()
    print(line("SDK client, direct", direct))
    print(line("through Pepper (gate, approval check, labelled result)", pepper))
    added = [p - d for p, d in zip(sorted(pepper), sorted(direct), strict=False)]
    median_added = statistics.median(pepper) - statistics.median(direct)
    print(f"added by Pepper: median {median_added:+.2f} ms, p99 {p99(pepper) - p99(direct):+.2f} ms "
          f"(rank-matched median {statistics.median(added):+.2f} ms)")  # fmt: skip
    print(line("first call of a turn (reads the server's listing once)", firsts))


async def prompt_sizes(db: Database) -> None:
    connectors = Connectors(vault=Vault(generate_key()))
    hub = McpHub(connectors)
    models = ScriptedModels(default=reply("Done."))
    deps = HarnessDeps(
        db=db, models=models, registry=starter_registry(), config=HarnessConfig(),
        skills=SkillCatalog.load_builtin(), connectors=connectors, mcp=hub,
    )  # fmt: skip
    account = await create_account(db, "Ada", timezone="UTC")
    try:
        await run_turn(deps, account.id, "web", "what's waiting for me?")
        async with LoopbackMcp(github_tools(), token="ghp_bench") as github:
            connected, rows = await connect_server(db, hub, account.id, "github", github.url, "ghp_bench")
            for row in rows:
                await records.decide(db, connected.id, row.name, approve=True)
            await run_turn(deps, account.id, "web", "what's waiting for me?")
    finally:
        await hub.close()
    (before, after) = models.prompts

    def sizes(prompt) -> tuple[int, int]:  # type: ignore[no-untyped-def]
        tools = sum(len(f"{t.name}{t.description}{t.parameters}".encode()) for t in prompt.tools)
        return tools, tools + len((prompt.system_stable + prompt.system_dynamic).encode())

    (tools_before, all_before), (tools_after, all_after) = sizes(before), sizes(after)
    offered = [t.name for t in after.tools if t.name.startswith("github__")]
    print(f"orchestrator tools without GitHub: {len(before.tools)} tools, {tools_before} bytes")
    print(f"orchestrator tools with GitHub's {len(rows)} tools approved: {len(after.tools)} tools, {tools_after} bytes"
          f" ({len(offered)} GitHub tools on the orchestrator)")  # fmt: skip
    grown = all_after - all_before
    print(f"whole orchestrator prompt (tools and system): {all_before} -> {all_after} bytes ({grown:+d}:"
          " the five GitHub skills in the skills list and the use_skill enum)")  # fmt: skip


async def main(calls: int) -> None:
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        db = await Database.open(await factory.create(), max_size=4)
        try:
            await call_times(db, calls)
            await prompt_sizes(db)
        finally:
            await db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args().calls))
