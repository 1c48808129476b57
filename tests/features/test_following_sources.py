"""Following teams (TheSportsDB), shows (TVmaze) and calendar feeds, through the tools a live turn
uses and `pepper follow`; followed events in the agenda, not busy time and not in a calendar
unless the source opts in; checks leased and recorded, failures shown."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from core.following import store
from core.following.checks import Following
from core.identity import Account, create_account
from core.store import Database
from core.testing.follow_peers import (
    SportsDBPeer,
    TVmazePeer,
    sportsdb_event,
    sportsdb_team,
    tvmaze_episode,
    tvmaze_show,
)
from core.web.egress import EgressPolicy

from .support import NOW, Caller, cli, serving

FEED = b"""BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//Club//Fixtures//EN
X-WR-CALNAME:Rowing club
BEGIN:VEVENT
UID:regatta@club
DTSTART:20250329T090000Z
DTEND:20250329T120000Z
SUMMARY:Spring regatta
END:VEVENT
END:VCALENDAR
"""


RSS = b"""<?xml version="1.0"?><rss version="2.0"><channel><title>Ada Lovelace news</title>
<link>http://example.com/</link><description>x</description>
<item><title>Ada wins a prize</title><link>http://example.com/1</link><guid>n1</guid></item>
</channel></rss>"""


async def _rss(request: web.Request) -> web.Response:
    return web.Response(body=RSS, content_type="application/rss+xml")


@pytest.fixture
async def sources():
    sports, tv = SportsDBPeer(), TVmazePeer()
    sports.teams = [sportsdb_team("133604", "Arsenal"), sportsdb_team("133610", "Chelsea")]
    sports.events["133604"] = [
        sportsdb_event("2070001", "Arsenal", "Chelsea", "2025-03-29", "15:00:00"),
        sportsdb_event("2070002", "Fulham", "Arsenal", "2025-04-05", "17:30:00", strVenue="Craven Cottage"),
    ]
    tv.shows = [tvmaze_show(44778, "House of the Dragon")]
    tv.episodes[44778] = [
        tvmaze_episode(2373351, 2, 7, "The Red Sowing", "2024-07-29T01:00:00+00:00"),  # aired: not shown
        tvmaze_episode(2803001, 3, 1, "Premiere", "2025-03-30T01:00:00+00:00"),
        tvmaze_episode(2803002, 3, 2, "Second", "2025-04-06T01:00:00+00:00"),
    ]
    async with sports, tv, serving({"/fixtures.ics": _feed, "/broken": _broken, "/news.rss": _rss}) as site:
        yield sports, tv, site


async def _feed(request: web.Request) -> web.Response:
    return web.Response(body=FEED, content_type="text/calendar", headers={"ETag": '"f1"'})


async def _broken(request: web.Request) -> web.Response:
    return web.Response(status=500, text="oops")


def ports(sports: SportsDBPeer, tv: TVmazePeer, site: str) -> frozenset[int]:
    return frozenset({sports.port, tv.port, int(site.rsplit(":", 1)[1])})


@pytest.fixture
def following_caller(call: Caller, sources) -> Caller:
    sports, tv, site = sources
    return call.using(
        egress_policy=EgressPolicy(loopback_ports=ports(sports, tv, site)), sportsdb_url=sports.url,
        tvmaze_url=tv.url,
    )  # fmt: skip


async def check_all(db: Database, caller: Caller) -> int:
    """Run every follow's check now, on the tests' clock (the follows were added on the real one)."""
    await db.execute("UPDATE follows SET next_check_at = $1", NOW - timedelta(minutes=1))
    return await replace(Following.from_connectors(db, caller.connectors), clock=lambda: NOW).run_due()


async def test_a_team_and_a_show_show_in_the_agenda_not_in_busy_time(db: Database, following_caller: Caller, sources):
    sports, _, _ = sources
    call = following_caller
    added = await call("follow_add", {"source": "team:arsenal"})
    assert added.status == "ok" and "Arsenal (English Premier League)" in added.content
    assert (await call("follow_add", {"source": "show:house of the dragon"})).status == "ok"
    assert await check_all(db, call) == 2
    listed = (await call("list_events", {"start": "2025-03-27T00:00", "days": 14})).content
    assert "Arsenal vs Chelsea" in listed and "Fulham vs Arsenal at Craven Cottage" in listed
    assert "House of the Dragon S3E1 Premiere" in listed and "The Red Sowing" not in listed
    assert "Followed: Arsenal (English Premier League); read-only" in listed
    # Not busy time, not written to any calendar, no invitation.
    busy = await call("calendar_free_busy", {"start": "2025-03-29T00:00", "end": "2025-03-30T00:00"})
    assert "Free the whole time" in busy.content
    assert await db.fetchval("SELECT count(*) FROM calendar_events") == 0
    # A followed event cannot be moved like the person's own.
    ref = next(line.rsplit("(ref ", 1)[1].rstrip(")") for line in listed.splitlines() if "Arsenal vs Chelsea" in line)
    moved = await call("move_event", {"event": ref, "new_start": "2025-03-29T18:00"})
    assert moved.status == "failed" and "read-only" in moved.content

    # The fixture moves and the next is postponed: updated by the source's ids, not duplicated.
    sports.events["133604"][0]["strTimestamp"] = "2025-03-30T14:00:00"
    sports.events["133604"][1]["strPostponed"] = "yes"
    follows = await store.listing(db, call.account.id)
    assert await check_all(db, call) == 2
    rows = await db.fetch("SELECT title, starts_at, status FROM followed_events WHERE source_key LIKE 'sportsdb:%'"
                          " ORDER BY source_key")  # fmt: skip
    assert [(r["title"], r["starts_at"].day, r["status"]) for r in rows] == [
        ("Arsenal vs Chelsea", 30, "active"), ("Fulham vs Arsenal", 5, "cancelled"),
    ]  # fmt: skip
    text = (await call("follow_list", {})).content
    assert all(f"#{f['id']}" in text for f in follows) and "last check" in text


async def test_unknown_sources_refused_and_nothing_stored(db: Database, following_caller: Caller):
    call = following_caller
    for source, words in (("team:Nobody United", "no team called"), ("show:No Such Show", "no show called"),
                          ("team:", "say which team"), ("gopher://x", "web address")):  # fmt: skip
        outcome = await call("follow_add", {"source": source})
        assert outcome.status == "failed" and words in outcome.content, outcome.content
    assert (await call("follow_add", {"source": 42})).status == "failed"  # garbage arguments
    assert await db.fetchval("SELECT count(*) FROM follows") == 0


async def test_duplicates_forgeries_and_removal(db: Database, following_caller: Caller):
    call = following_caller
    await call("follow_add", {"source": "team:Arsenal"})
    again = await call("follow_add", {"source": "team:Arsenal"})
    assert again.status == "ok" and "already following" in again.content, again.content
    assert await db.fetchval("SELECT count(*) FROM follows") == 1
    # Another person's follow cannot be removed by number.
    mallory = await create_account(db, "Mallory", timezone="UTC")
    theirs, _ = await store.add(db, mallory.id, "team", "133610", "Chelsea")
    refused = await call("follow_remove", {"follow": theirs.id})
    assert refused.status == "failed" and await store.get(db, theirs.id) is not None
    [mine] = await store.listing(db, call.account.id)
    assert (await call("follow_remove", {"follow": mine["id"]})).status == "ok"
    assert await store.listing(db, call.account.id) == []


async def test_writing_to_the_calendar_is_opt_in_and_following_never_starts_in_a_scheduled_run(
    db: Database, following_caller: Caller
):
    call = following_caller
    scheduled = await call("follow_add", {"source": "team:Arsenal", "write_to_calendar": True}, kind="scheduled")
    assert scheduled.status == "failed" and "scheduled run cannot" in scheduled.content
    assert scheduled.arguments["write_to_calendar"] is False  # the gate narrowed it before the tool refused
    assert await store.listing(db, call.account.id) == []
    assert (await call("follow_add", {"source": "team:Arsenal"})).status == "ok"
    [row] = await store.listing(db, call.account.id)
    assert (await call("follow_remove", {"follow": row["id"]}, kind="scheduled")).status == "failed"
    assert (await call("follow_add", {"source": "show:House", "write_to_calendar": True})).status == "ok"
    await check_all(db, call)
    events = await db.fetch("SELECT title, attendees::text, busy FROM calendar_events ORDER BY starts_at")
    assert [e["title"] for e in events] == ["House of the Dragon S3E1 Premiere", "House of the Dragon S3E2 Second"]
    assert all(e["attendees"] == "[]" and e["busy"] is False for e in events)  # no one to invite
    listed = (await call("list_events", {"start": "2025-03-27T00:00", "days": 14})).content
    assert listed.count("S3E1 Premiere") == 1  # in Pepper's calendar, not twice
    assert listed.count("Arsenal vs Chelsea") == 1  # the other source: the agenda only
    show = next(r for r in await store.listing(db, call.account.id) if r["kind"] == "show")
    assert (await call("follow_remove", {"follow": show["id"]})).status == "ok"
    assert await db.fetchval("SELECT count(*) FROM calendar_events") == 0  # its copies go with it


async def test_a_calendar_feed_and_a_failing_page_in_the_same_surface(db: Database, following_caller: Caller, sources):
    _, _, site = sources
    call = following_caller
    added = await call("follow_add", {"source": f"{site}/fixtures.ics"})
    assert added.status == "ok" and "Rowing club" in added.content
    listed = (await call("list_events", {"start": "2025-03-27T00:00", "days": 7})).content
    assert "Spring regatta" in listed
    # A page that worked when added and fails later: the failure is in the list, not silent.
    follow, _ = await store.add(db, call.account.id, "page", f"{site}/broken", "Club news")
    await check_all(db, call)
    text = (await call("follow_list", {})).content
    assert "Club news [web page]" in text and "failed (the page answered 500)" in text and "FAILING: 1" in text
    assert "Rowing club [calendar feed]" in text and "changed (the feed has 1 events" in text
    again = await store.get(db, follow.id)
    assert again is not None and again.failures == 1
    assert (await call("follow_remove", {"follow": int(text.split("#")[1].split()[0])})).status == "ok"
    assert await db.fetchval("SELECT count(*) FROM calendars WHERE kind = 'ical'") == 0


async def test_a_person_or_topic_through_its_feed(db: Database, following_caller: Caller, sources):
    _, _, site = sources
    call = following_caller
    added = await call("follow_add", {"source": f"{site}/news.rss"})
    assert added.status == "ok" and "Ada Lovelace news" in added.content, added.content
    read = await call("read_feeds", {})
    assert read.status == "ok" and "Ada wins a prize" in read.content  # the feeds area reads its items
    await check_all(db, call)
    text = (await call("follow_list", {})).content
    assert "Ada Lovelace news [news feed]" in text and "the feed has 1 items" in text
    [row] = await store.listing(db, call.account.id)
    assert (await call("follow_remove", {"follow": row["id"]})).status == "ok"
    assert (await call("list_feeds", {})).status == "empty"


async def test_checks_are_leased(db: Database, owner: Account):
    follow, _ = await store.add(db, owner.id, "team", "133604", "Arsenal")
    now = datetime.now(UTC)  # added due now, on the database's clock
    first = await store.claim_due(db, "a", now, lease=timedelta(minutes=5), limit=5)
    assert [f.id for f in first] == [follow.id]
    assert await store.claim_due(db, "b", now + timedelta(minutes=1), lease=timedelta(minutes=5), limit=5) == []
    taken = await store.claim_due(db, "b", now + timedelta(minutes=6), lease=timedelta(minutes=5), limit=5)
    assert [f.id for f in taken] == [follow.id]  # the first owner died: its lease expired
    late = store.Outcome("changed", "late")
    assert not await store.finish(db, follow, "a", now, late, now + timedelta(hours=1))  # fenced off
    assert await store.finish(db, follow, "b", now, store.Outcome("unchanged"), now + timedelta(hours=1))
    assert [r["status"] for r in await store.recent_checks(db, follow.id)] == ["unchanged"]
    for n in range(store.KEEP_CHECKS + 5):  # the record keeps the last KEEP_CHECKS checks
        await store.claim_now(db, "c", now, owner.id, follow.id, lease=timedelta(minutes=1))
        assert await store.finish(db, follow, "c", now, store.Outcome("failed", f"try {n}"), now)
    kept = await db.fetch("SELECT detail FROM follow_checks WHERE follow_id = $1 ORDER BY id", follow.id)
    assert len(kept) == store.KEEP_CHECKS and kept[-1]["detail"] == f"try {store.KEEP_CHECKS + 4}"
    assert (await store.get(db, follow.id)).failures == store.KEEP_CHECKS + 5  # type: ignore[union-attr]


async def test_pepper_follow_add_list_remove(db: Database, db_url: str, owner: Account, sources, capsys: Any):
    sports, tv, site = sources
    env = {
        "DATABASE_URL": db_url, "PEPPER_WEB_TEST_LOOPBACK_PORTS": f"[{','.join(map(str, ports(sports, tv, site)))}]",
        "PEPPER_SPORTSDB_URL": sports.url, "PEPPER_TVMAZE_URL": tv.url,
    }  # fmt: skip
    code, out = await asyncio.to_thread(cli, env, "follow", "add", "Ada", "team:Arsenal", "--write-to-calendar")
    assert code == 0 and "now follows 'Arsenal (English Premier League)'" in out and "Pepper's calendar" in out
    code, out = await asyncio.to_thread(cli, env, "follow", "add", "Ada", "team:Arsenal")
    assert code == 0 and "already follows" in out
    code, _ = await asyncio.to_thread(cli, env, "follow", "add", "Ada", "show:Nothing Like It")
    assert code == 1 and "no show called" in capsys.readouterr().err
    code, _ = await asyncio.to_thread(cli, env, "follow", "add", "Ada", "http://10.0.0.1/page")
    assert code == 1 and "not on the public internet" in capsys.readouterr().err
    code, out = await asyncio.to_thread(cli, env, "follow", "list", "Ada")
    assert code == 0 and "Ada: 1 followed" in out and "not checked yet" in out
    code, out = await asyncio.to_thread(cli, env, "follow", "check", "Ada")
    assert code == 0 and "Arsenal (English Premier League): changed (2 upcoming; 2 new)" in out, out
    code, out = await asyncio.to_thread(cli, env, "follow", "list")
    assert code == 0 and "2 events shown" in out and "changed (2 upcoming; 2 new)" in out
    code, _ = await asyncio.to_thread(cli, env, "follow", "check", "Ada", "999999")
    assert code == 1 and "follows nothing numbered 999999" in capsys.readouterr().err
    [row] = await store.listing(db, owner.id)
    code, _ = await asyncio.to_thread(cli, env, "follow", "remove", "Ada", str(row["id"] + 99))
    assert code == 1 and "follows nothing numbered" in capsys.readouterr().err
    code, out = await asyncio.to_thread(cli, env, "follow", "remove", "Ada", str(row["id"]))
    assert code == 0 and "no longer follows" in out
    assert await db.fetchval("SELECT count(*) FROM follows") == 0
