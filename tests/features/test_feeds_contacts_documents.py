"""Feeds (staged mark-read), contacts, documents, and the scheduled-run gate policy itself."""

from __future__ import annotations

import re

import pytest
from aiohttp import web

from core.tools import SessionContext, Tool, ToolOutcome, commit_turn_writes, drop_turn_writes
from core.tools.gate import default_gate
from core.tools.starter import starter_registry

RSS = """<?xml version="1.0"?><rss version="2.0"><channel><title>Town news</title>
<item><guid>a</guid><title>Bridge reopens</title><link>http://n.test/a</link>
<pubDate>Tue, 25 Mar 2025 08:00:00 GMT</pubDate></item>
<item><guid>b</guid><title>Market moves</title><link>http://n.test/b</link>
<pubDate>Wed, 26 Mar 2025 08:00:00 GMT</pubDate></item>
</channel></rss>"""
ATOM_EXTRA = """<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom"><title>Blog</title>
<id>urn:blog</id><updated>2025-03-26T10:00:00Z</updated>
<entry><id>urn:post1</id><title>Hello</title><updated>2025-03-26T10:00:00Z</updated><link href="http://b.test/1"/></entry>
</feed>"""


@pytest.fixture
async def feed_server():
    state = {"hits": 0, "status": 200}

    async def rss(request: web.Request) -> web.Response:
        state["hits"] += 1
        if state["status"] != 200:
            return web.Response(status=state["status"])
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304)
        return web.Response(text=RSS, content_type="application/rss+xml", headers={"ETag": '"v1"'})

    async def atom(request: web.Request) -> web.Response:
        return web.Response(text=ATOM_EXTRA, content_type="application/atom+xml")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>hello</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/rss", rss)
    app.router.add_get("/atom", atom)
    app.router.add_get("/page", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["base"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    yield state
    await runner.cleanup()


def item_ids(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^- \[(\d+)\]", text, re.M)]


async def test_marking_items_read_waits_for_delivery(call, feed_server):
    base = feed_server["base"]
    assert (await call("follow_feed", {"url": f"{base}/page"})).status == "failed"
    assert (await call("follow_feed", {"url": f"{base}/rss"})).status == "ok"
    assert (await call("follow_feed", {"url": f"{base}/atom"})).status == "ok"
    briefing = await call.session("scheduled")
    listed = await call("read_feeds", {}, session=briefing)
    assert listed.status == "ok" and "Town news: Market moves" in listed.content and "Blog: Hello" in listed.content
    ids = item_ids(listed.content)
    assert len(ids) == 3
    marked = await call("mark_feed_items_read", {"items": ids}, session=briefing)
    assert marked.status == "ok" and marked.write["staged"]
    registry = starter_registry(call.connectors)
    # The briefing was never delivered: the items stay unread.
    dropped = await drop_turn_writes(call.db, registry, briefing.turn_id)
    assert [w.status for w in dropped] == ["dropped"]
    again = await call("read_feeds", {})
    assert sorted(item_ids(again.content)) == sorted(ids)
    assert feed_server["hits"] == 3  # follow, then two reads; the second answered 304 Not Modified
    # Delivered this time: committed.
    live = await call.session()
    await call("mark_feed_items_read", {"items": ids[:2]}, session=live)
    assert [w.status for w in await commit_turn_writes(call.db, registry, live.turn_id)] == ["committed"]
    left = await call("read_feeds", {})
    assert item_ids(left.content) == [ids[2]]


async def test_a_failing_feed_is_reported_not_empty(call, feed_server):
    await call("follow_feed", {"url": f"{feed_server['base']}/rss"})
    feed_server["status"] = 500
    out = await call("read_feeds", {})
    assert out.status == "failed" and "unknown, not absent" in out.content
    assert (await call("list_feeds", {})).content.count("Town news") == 1


async def test_contacts_add_find_update_remove(call):
    assert (
        await call(
            "add_contact", {"name": "Bob Stone", "emails": ["bob@x.org"], "phones": ["+1 415 555 0100"]}, delivered=True
        )
    ).status == "ok"
    dup = await call("add_contact", {"name": "Robert", "emails": ["BOB@x.org"]})
    assert dup.status == "failed" and "Bob Stone" in dup.content
    found = await call("find_contacts", {"query": "stone"})
    assert "bob@x.org" in found.content and "+14155550100" in found.content
    cid = int(re.search(r"#(\d+)", found.content).group(1))
    await call("update_contact", {"id": cid, "emails": ["bob@work.org"]}, delivered=True)
    assert "bob@work.org" in (await call("find_contacts", {"query": "work.org"})).content
    assert (await call("add_contact", {"name": "X", "emails": ["nope"]})).status == "failed"
    await call("remove_contact", {"id": cid}, delivered=True)
    assert (await call("find_contacts", {})).status == "empty"


async def test_documents_are_titled_notes_replaced_by_title(call):
    assert "saved" in (await call("write_document", {"title": "Trip plan", "text": "Day 1: Lyon"})).content
    assert "replaced" in (await call("write_document", {"title": "trip PLAN", "text": "Day 1: Paris"})).content
    read = await call("read_document", {"title": "Trip Plan"})
    assert read.status == "ok" and "Day 1: Paris" in read.content and "Lyon" not in read.content
    assert "document 'trip PLAN'" in (await call("search_notes", {"query": "paris"})).content
    assert (await call("read_document", {"title": "Other"})).status == "empty"


async def _noop(ctx, args):
    return ToolOutcome.ok("ok")


async def _apply(conn, account_id, payload):
    return None


SENDER = Tool(
    "send_x", "d", {"type": "object", "properties": {"mode": {"type": "string", "enum": ["send", "draft"]}}},
    _noop, area="email", writes=True, apply=_apply, scheduled=(("mode", "draft"),),
)  # fmt: skip


@pytest.mark.parametrize("kind", ["live", "scheduled"])
async def test_the_scheduled_policy_only_narrows_scheduled_runs(owner, kind):
    session = SessionContext(kind, "owner_verified", "sms", owner.id)
    decision = await default_gate().decide(SENDER, {"mode": "send"}, session)
    assert decision.allowed
    assert decision.arguments["mode"] == ("draft" if kind == "scheduled" else "send")
    assert ("NOT sent" in decision.reason) == (kind == "scheduled")


def test_a_scheduled_override_must_name_a_real_argument():
    with pytest.raises(ValueError, match="unknown argument"):
        Tool("t", "d", {"type": "object", "properties": {}}, _noop, area="x", scheduled=(("mode", "draft"),))
