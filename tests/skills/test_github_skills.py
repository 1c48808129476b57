"""The shipped GitHub skills in real turns: GitHub's MCP server (a loopback one offering a subset of
its tools, built with the mcp SDK) behind workers, through the real router and a loopback OpenAI."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from skill_support import NOW, outputs, tool_names, turn_record

from core.adapters.mcp.loopback import LoopbackMcp, github_tools
from core.records import mcp as records
from core.testing.peers import ScriptedCall, reply_text, reply_tools
from core.tools.connectors import Connectors
from core.tools.mcp import McpHub, connect_server
from core.tools.starter import starter_registry
from core.vault import Vault, generate_key
from text_loop import HarnessConfig, HarnessDeps, run_turn
from text_loop.skills import SkillCatalog

GITHUB_SKILLS = {"github-inbox", "github-status", "github-review-queue", "github-repo-summary", "github-comment"}


def use(name: str, **args) -> ScriptedCall:
    return ScriptedCall("use_skill", {"name": name, **args})


def skill_names(request) -> set[str]:
    (spec,) = [t for t in request.body["tools"] if t["name"] == "use_skill"]
    return set(spec["parameters"]["properties"]["name"]["enum"])


@pytest.fixture
async def github() -> AsyncIterator[LoopbackMcp]:
    async with LoopbackMcp(github_tools(), token="ghp_test") as server:
        yield server


@pytest.fixture
async def gh_deps(db, router) -> AsyncIterator[HarnessDeps]:
    connectors = Connectors(vault=Vault(generate_key()))
    hub = McpHub(connectors, timeout=3.0)
    yield HarnessDeps(
        db=db, models=router, registry=starter_registry(), config=HarnessConfig(), clock=lambda: NOW,
        skills=SkillCatalog.load_builtin(), connectors=connectors, mcp=hub,
    )  # fmt: skip
    await hub.close()


async def connect_github(db, deps, account, github) -> None:
    server, rows = await connect_server(db, deps.mcp, account.id, "github", github.url, "ghp_test")
    for row in rows:
        await records.decide(db, server.id, row.name, approve=True)


async def test_github_skills_are_listed_only_once_connected_and_its_tools_never_reach_the_orchestrator(
    db, gh_deps, peer, account, github
):
    peer.script(reply_text("Hello."), reply_text("Hello again."))
    await run_turn(gh_deps, account.id, "web", "hi")
    await connect_github(db, gh_deps, account, github)
    await run_turn(gh_deps, account.id, "web", "hi")
    before, after = peer.requests
    assert not GITHUB_SKILLS & skill_names(before)
    assert GITHUB_SKILLS <= skill_names(after)
    # The orchestrator's tools are the same with GitHub connected: its tools sit behind workers.
    assert tool_names(before) == tool_names(after)
    assert not [n for n in tool_names(after) if n.startswith("github__")]
    assert github.calls == []


async def test_the_inbox_runs_as_a_worker_on_githubs_tools_and_its_report_is_the_reply(
    db, gh_deps, peer, account, github
):
    await connect_github(db, gh_deps, account, github)
    peer.script(
        reply_tools(use("github-inbox", request="what's waiting for me on github")),
        reply_tools(
            ("github__list_notifications", {}),
            ("github__search_pull_requests", {"query": "is:open is:pr review-requested:@me"}),
        ),
        # The result told the worker to mail someone: it has no such tool, and the call is refused.
        reply_tools(("email_from_pepper", {"to": ["evil@example.com"], "subject": "x", "body": "y"})),
        reply_text("Review requested: acme/api#42 Add retries (bob). 1 notification: CI failing on main."),
    )
    outcome = await run_turn(gh_deps, account.id, "web", "what's waiting for me on github?")
    orchestrator, worker, *_ = peer.requests
    assert [n for n in tool_names(worker) if n.startswith("github__")] == sorted(
        f"github__{t.name}" for t in github_tools()
    )
    assert "github__list_notifications" not in tool_names(orchestrator)
    assert [name for name, _ in github.calls] == ["list_notifications", "search_pull_requests"]
    labelled = outputs(peer.requests[2])
    assert all(
        o.startswith("[result of ") and "from the github MCP server; not written by the user" in o for o in labelled
    )
    assert outputs(peer.requests[3])[-1].startswith("Unknown tool 'email_from_pepper'")
    assert outcome.reply.startswith("Review requested: acme/api#42")
    record = await turn_record(db, outcome.turn_id)
    assert record["skills"]["ended_by"] == "direct_report" and record["skills"]["flags"] == []


async def test_a_github_skill_that_skips_github_is_flagged(db, gh_deps, peer, account, github):
    await connect_github(db, gh_deps, account, github)
    peer.script(reply_tools(use("github-review-queue")), reply_text("Nothing waits for your review."))
    outcome = await run_turn(gh_deps, account.id, "web", "anything to review?")
    record = await turn_record(db, outcome.turn_id)
    assert [(f["flag"], f["step"]) for f in record["skills"]["flags"]] == [("skipped-required-step", "github")]


async def test_a_github_write_waits_for_the_persons_yes_live_and_is_not_offered_in_a_scheduled_run(
    db, gh_deps, peer, account, github
):
    await connect_github(db, gh_deps, account, github)
    comment = ("github__add_issue_comment", {"owner": "acme", "repo": "api", "issue_number": 7, "body": "On it."})
    peer.script(
        reply_tools(use("github-comment", request="comment 'On it.' on acme/api#7")),
        reply_tools(comment),
        reply_text("I will comment 'On it.' on acme/api#7. Shall I?"),
    )
    await run_turn(gh_deps, account.id, "web", "comment 'On it.' on acme/api#7")
    assert outputs(peer.requests[2])[-1].startswith("Not done yet") and github.calls == []
    peer.script(
        reply_tools(use("github-comment", request="comment 'On it.' on acme/api#7, the person said yes")),
        reply_tools(comment),
        reply_text("Commented on acme/api#7."),
    )
    await run_turn(gh_deps, account.id, "web", "yes")
    assert github.calls == [("add_issue_comment", comment[1])]

    peer.script(reply_tools(use("github-comment", request="comment")), reply_tools(comment), reply_text("Could not."))
    await run_turn(gh_deps, account.id, "scheduled", "daily github check", kind="scheduled")
    worker = peer.requests[-2]
    assert "github__add_issue_comment" not in tool_names(worker) and "github__merge_pull_request" not in tool_names(
        worker
    )
    assert outputs(peer.requests[-1])[-1].startswith("Unknown tool 'github__add_issue_comment'")
    assert len(github.calls) == 1
