"""Followed sources are checked on the scheduler, each claimed once under a lease, beside the runs."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from aiohttp import web

from core.following import pages, store
from core.following.checks import FollowConfig, Following
from core.identity import Account
from core.settings import Settings
from core.store import Database
from core.testing.loopback import serve_loopback
from core.testing.scripted import ScriptedModels, calls
from core.web.egress import Egress, EgressPolicy
from gateway.scheduled import GatewayDeliverer, build_scheduler
from text_loop import HarnessDeps
from text_loop.scheduler import Scheduler, SchedulerConfig

PAGE = (
    "<html><body><main><h1>Fixtures</h1><p>Saturday 7 June 2025, 10:00: Under-12s home match</p></main></body></html>"
)


async def test_two_schedulers_check_a_due_page_once(
    db: Database, account: Account, deps: HarnessDeps, config: SchedulerConfig, clock, models: ScriptedModels
):
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        await asyncio.sleep(0)  # let the other scheduler try to claim meanwhile
        return web.Response(text=PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/fixtures", handler)
    runner, port = await serve_loopback(app)
    try:
        egress = Egress(EgressPolicy(loopback_ports=frozenset({port})))
        follow, _ = await store.add(db, account.id, "page", f"http://127.0.0.1:{port}/fixtures", "Club fixtures")
        await db.execute("UPDATE follows SET next_check_at = $1", clock() - timedelta(minutes=1))
        line = "Saturday 7 June 2025, 10:00: Under-12s home match"
        models.script(calls((pages.EXTRACT_TOOL, {"events": [
            {"title": "Under-12s home match", "date": "2025-06-07", "date_text": "Saturday 7 June 2025",
             "start_time": "10:00", "quote": line, "cancelled": False},
        ]})))  # fmt: skip
        schedulers = [
            Scheduler(deps, GatewayDeliverer(Settings(), db), config, owner=f"test-{n}", clock=clock,
                      follows=Following(db, egress, models, config=FollowConfig(), clock=clock))
            for n in (1, 2)
        ]  # fmt: skip
        await asyncio.gather(*(s.tick() for s in schedulers))
        done = await asyncio.gather(*(s.follows_done() for s in schedulers))
        assert sorted(done) == [0, 1] and hits == ["/fixtures"] and len(models.received) == 1
        [check] = await store.recent_checks(db, follow.id)
        assert check["status"] == "changed" and check["events"] == 1 and check["model_calls"] == 1
        row = await db.fetchrow("SELECT lease_owner, next_check_at FROM follows WHERE id = $1", follow.id)
        assert row["lease_owner"] is None and row["next_check_at"] == clock() + FollowConfig().page_every
        # Nothing is due now: the next pass checks nothing.
        await schedulers[0].tick()
        assert await schedulers[0].follows_done() == 0
    finally:
        await runner.cleanup()


def test_the_server_scheduler_checks_follows_on_the_configured_tier(db: Database, models: ScriptedModels):
    settings = Settings(follow_tier="medium", follow_page_hours=2)
    scheduler = build_scheduler(settings, HarnessDeps(db=db, models=models))
    follows = scheduler.follows
    assert isinstance(follows, Following) and follows.models is models and follows.owner == scheduler.owner
    assert follows.config == FollowConfig(tier="medium", page_every=timedelta(hours=2))
    assert follows.egress.policy.loopback_ports == frozenset()  # the public internet only
