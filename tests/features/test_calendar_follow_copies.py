"""A followed source that opted in has its events copied into the person's own calendar: Google
Calendar (the loopback peer, the real API's shapes) or CalDAV (a real Radicale). Copies carry no
attendees and send no invitations; a moved event updates its copy, a cancelled or hidden one
removes it, a re-run never duplicates, a failing calendar is shown in `follow list` and retried."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import icalendar
import pytest

from core.errors import InvalidInput
from core.following import copies, store
from core.following.checks import Following
from core.following.model import SourceEvent
from core.identity import Account, create_account
from core.store import Database
from core.testing.follow_peers import SportsDBPeer, sportsdb_event, sportsdb_team
from core.testing.google_api_peer import GoogleApiPeer
from core.testing.radicale_server import RadicaleServer
from core.tools.areas.calendar import connect_caldav
from core.tools.areas.calendar.caldav import CalDAVClient
from core.tools.connectors import CALENDAR_EVENTS
from core.tools.google_api import exchange_code
from core.web.egress import EgressPolicy

from .support import NOW, Caller, cli


@pytest.fixture
async def sports():
    peer = SportsDBPeer()
    peer.teams = [sportsdb_team("133604", "Arsenal")]
    peer.events["133604"] = [
        sportsdb_event("2070001", "Arsenal", "Chelsea", "2025-03-29", "15:00:00"),
        sportsdb_event("2070002", "Fulham", "Arsenal", "2025-04-05", "17:30:00", strVenue="Craven Cottage"),
    ]
    async with peer:
        yield peer


@pytest.fixture
async def google():
    async with GoogleApiPeer() as peer:
        peer.granted_scopes = CALENDAR_EVENTS
        yield peer


@pytest.fixture
async def gcal(call: Caller, google: GoogleApiPeer, sports: SportsDBPeer) -> Caller:
    caller = call.using(
        google_api_url=google.url, google_token_url=google.token_url, google_client_id="client-id",
        google_client_secret="client-secret", sportsdb_url=sports.url,
        egress_policy=EgressPolicy(loopback_ports=frozenset({sports.port})),
    )  # fmt: skip
    code = google.issue_code("https://pepper.test/cb")
    await exchange_code(call.db, caller.connectors, call.account.id, code, "https://pepper.test/cb")
    return caller


def following(caller: Caller) -> Following:
    return replace(Following.from_connectors(caller.db, caller.connectors), clock=lambda: NOW)


async def check(db: Database, caller: Caller) -> int:
    await db.execute("UPDATE follows SET next_check_at = $1", NOW - timedelta(minutes=1))
    return await following(caller).run_due()


def calendar_writes(google: GoogleApiPeer) -> list[tuple[str, str]]:
    return [(m, q.get("sendUpdates", "")) for m, p, q, _ in google.requests if "/events" in p and m != "GET"]


async def test_google_copies_follow_the_source_without_invitations_or_duplicates(
    db: Database, gcal: Caller, google: GoogleApiPeer, sports: SportsDBPeer
):
    follow, created = await following(gcal).add(gcal.account.id, "team:Arsenal", write_to_calendar=True)
    assert created and follow.write_to_calendar
    assert await check(db, gcal) == 1
    live = {i: e for i, e in google.events.items() if e["status"] == "confirmed"}
    assert sorted(e["summary"] for e in live.values()) == ["Arsenal vs Chelsea", "Fulham vs Arsenal"]
    assert all("attendees" not in e and e["transparency"] == "transparent" for e in live.values())
    assert calendar_writes(google) and all(send == "none" for _, send in calendar_writes(google))
    listed = (await gcal("list_events", {"start": "2025-03-27T00:00", "days": 14})).content
    assert listed.count("Arsenal vs Chelsea") == 1 and "[Google" in listed  # shown once, from Google

    before = len(google.requests)
    await check(db, gcal)  # nothing changed: nothing asked of Google
    assert [r for r in google.requests[before:] if "/events" in r[1]] == []
    await db.execute("DELETE FROM follow_copies")  # as if every answer (and the mapping) had been lost
    await check(db, gcal)
    assert len(google.events) == 2  # the same ids: rewritten, not duplicated

    sports.events["133604"][0]["dateEvent"] = "2025-03-30"  # moved a day
    sports.events["133604"][0]["strTimestamp"] = "2025-03-30T15:00:00"
    sports.events["133604"][1]["strStatus"] = "Postponed"
    await check(db, gcal)
    chelsea = next(e for e in google.events.values() if e["summary"] == "Arsenal vs Chelsea")
    fulham = next(e for e in google.events.values() if e["summary"] == "Fulham vs Arsenal")
    assert chelsea["start"]["dateTime"].startswith("2025-03-30") and chelsea["status"] == "confirmed"
    assert fulham["status"] == "cancelled" and len(google.events) == 2
    assert all(send == "none" for _, send in calendar_writes(google))
    [row] = await store.listing(db, gcal.account.id)
    assert "calendar copies: 1 updated, 1 removed" in row["last_detail"] and row["copied"] == 1

    # A failing calendar: the source's check still counts, the failure is said and retried.
    google.failing = 503
    sports.events["133604"][0]["strTimestamp"] = "2025-03-31T15:00:00"
    sports.events["133604"][0]["dateEvent"] = "2025-03-31"
    await check(db, gcal)
    text = (await gcal("follow_list", {})).content
    assert "CALENDAR WRITES FAILING: 1 check(s) in a row" in text and "503" in text, text
    [last] = await store.recent_checks(db, follow.id, limit=1)
    assert last["status"] == "changed" and "503" in last["calendar_error"]
    again = await store.get(db, follow.id)
    assert again is not None and again.copy_failures == 1
    due = await db.fetchval("SELECT next_check_at FROM follows WHERE id = $1", follow.id)
    assert due <= NOW + timedelta(minutes=15)  # retried sooner than the usual 12 hours
    google.failing = None
    await check(db, gcal)
    assert chelsea["start"]["dateTime"].startswith("2025-03-31")
    assert "FAILING" not in (await gcal("follow_list", {})).content

    # Opting out deletes the copies; removing a follow deletes its copies at the next pass.
    await store.set_writing(db, gcal.account.id, follow.id, False)
    await check(db, gcal)
    assert all(e["status"] == "cancelled" for e in google.events.values())
    listed = (await gcal("list_events", {"start": "2025-03-27T00:00", "days": 14})).content
    assert listed.count("Arsenal vs Chelsea") == 1 and "[Followed: Arsenal" in listed  # the agenda still has it
    await store.set_writing(db, gcal.account.id, follow.id, True)
    await check(db, gcal)
    assert chelsea["status"] == "confirmed" and len(google.events) == 2  # the same event back, not a new one
    assert (await gcal("follow_remove", {"follow": follow.id})).status == "ok"
    assert await copies.orphans(db, gcal.account.id) == 1
    await following(gcal).tick()
    assert chelsea["status"] == "cancelled" and await copies.orphans(db, gcal.account.id) == 0


@pytest.fixture(scope="session")
def radicale(tmp_path_factory):
    with RadicaleServer(tmp_path_factory.mktemp("radicale-copies")) as server:
        yield server


async def test_caldav_copies_moved_hidden_failing_and_named(db: Database, call: Caller, radicale, sports):
    caller = call.using(sportsdb_url=sports.url, egress_policy=EgressPolicy(loopback_ports=frozenset({sports.port})))
    url = radicale.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    dav = CalDAVClient(caller.connectors, url, "ada", "secret")

    async def on_server() -> dict[str, Any]:
        found = await dav.query(datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
        events = [c for r in found for c in icalendar.Calendar.from_ical(r.data).walk("VEVENT")]
        return {str(e["SUMMARY"]): e for e in events}

    with pytest.raises(InvalidInput, match="no calendar"):  # refused before anything is stored
        await following(caller).add(caller.account.id, "team:Arsenal", calendar="Nowhere")
    assert await store.listing(db, caller.account.id) == []
    page, _ = await store.add(db, caller.account.id, "page", "https://school.test/", "School", write_to_calendar=True)
    swim = datetime(2025, 4, 8, 14, tzinfo=UTC)
    sports_day = datetime(2025, 4, 11, 7, tzinfo=UTC)

    def version(*events: tuple[str, datetime]) -> list[SourceEvent]:
        return [SourceEvent(t, s, s + timedelta(hours=1), quote=t) for t, s in events]

    async def apply(events: list[SourceEvent]) -> copies.Synced:
        async with db.transaction() as conn:
            await store.apply_events(conn, page, events)
        return await copies.sync(db, caller.connectors, page)

    pepper = "SELECT count(*) FROM calendar_events WHERE status = 'confirmed' AND booking_key LIKE 'follow:%'"
    done = await apply(version(("Swim practice", swim), ("Sports day", sports_day)))
    assert done.written == 0 and await db.fetchval(pepper) == 2  # nothing connected: Pepper's calendar
    cal_id = await connect_caldav(db, caller.connectors, caller.account.id, url, "ada", "secret")
    name = await db.fetchval("SELECT name FROM calendars WHERE id = $1", cal_id)
    done = await apply(version(("Swim practice", swim), ("Sports day", sports_day)))
    assert (done.calendar, done.written, done.error) == (name, 2, None)  # moved to the connected calendar
    assert await db.fetchval(pepper) == 0
    listed = (await caller("list_events", {"start": "2025-04-07T00:00", "days": 7})).content
    assert listed.count("Swim practice") == 1 and f"[{name}" in listed  # once, from the CalDAV calendar
    held = await on_server()
    assert sorted(held) == ["Sports day", "Swim practice"]
    assert all(e.get("ATTENDEE") is None and e.get("ORGANIZER") is None for e in held.values())
    assert (await apply(version(("Swim practice", swim), ("Sports day", sports_day)))).written == 0  # no duplicate
    assert len(await on_server()) == 2

    moved = sports_day + timedelta(days=7)
    done = await apply(version(("Swim practice", swim), ("Sports day", moved)))
    assert done.updated == 1 and (await on_server())["Sports day"].decoded("DTSTART") == moved
    await apply(version(("Sports day", moved)))  # left out once: still shown, still copied
    assert "Swim practice" in await on_server()
    done = await apply(version(("Sports day", moved)))  # twice: hidden, so its copy goes
    assert done.removed == 1 and sorted(await on_server()) == ["Sports day"]

    # A failing server: said, and retried by the next sync.
    await db.execute("UPDATE calendars SET remote = 'http://127.0.0.1:9/nothing/' WHERE id = $1", cal_id)
    done = await apply(version(("Sports day", moved), ("Concert", swim + timedelta(days=15))))
    assert done.error is not None and name in done.error and "did not answer" in done.error
    await db.execute("UPDATE calendars SET remote = $2 WHERE id = $1", cal_id, url)
    done = await copies.sync(db, caller.connectors, page)
    assert done.written == 1 and sorted(await on_server()) == ["Concert", "Sports day"]

    # A team through the scheduler's check, into the calendar named on add.
    team, _ = await following(caller).add(caller.account.id, "team:Arsenal", calendar=name)
    await check(db, caller)
    held = await on_server()
    assert {"Arsenal vs Chelsea", "Fulham vs Arsenal"} <= set(held) and held["Fulham vs Arsenal"]["LOCATION"]
    assert str(held["Arsenal vs Chelsea"]["TRANSP"]) == "TRANSPARENT"
    await store.remove(db, caller.account.id, team.id)
    await copies.sweep(db, caller.connectors, caller.account.id)
    assert sorted(await on_server()) == ["Concert", "Sports day"]

    # Another calendar named for the page: its copies move there, none left behind.
    other_url = radicale.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    other_id = await connect_caldav(db, caller.connectors, caller.account.id, other_url, "ada", "secret")
    moved_to = await store.set_writing(db, caller.account.id, page.id, True, other_id)
    assert moved_to is not None
    done = await copies.sync(db, caller.connectors, moved_to)
    assert (done.removed, done.written) == (2, 2) and await on_server() == {}
    dav = CalDAVClient(caller.connectors, other_url, "ada", "secret")
    assert sorted(await on_server()) == ["Concert", "Sports day"]


async def test_pepper_follow_set_and_its_refusals(db: Database, db_url: str, owner: Account, sports, capsys: Any):
    env = {"DATABASE_URL": db_url, "PEPPER_WEB_TEST_LOOPBACK_PORTS": f"[{sports.port}]",
           "PEPPER_SPORTSDB_URL": sports.url}  # fmt: skip
    code, out = await asyncio.to_thread(cli, env, "follow", "add", "Ada", "team:Arsenal")
    assert code == 0 and "the agenda only" in out
    [row] = await store.listing(db, owner.id)
    feed = await store.add_calendar_feed(db, owner.id, "https://feeds.test/holidays.ics", "Holidays")
    assert feed
    code, _ = await asyncio.to_thread(cli, env, "follow", "set", "Ada", str(row["id"]), "--write-to-calendar",
                                      "Holidays")  # fmt: skip
    assert code == 1 and "read-only" in capsys.readouterr().err
    other = await create_account(db, "Bob")
    code, _ = await asyncio.to_thread(cli, env, "follow", "set", "Bob", str(row["id"]), "--no-write")
    assert code == 1 and "follows nothing numbered" in capsys.readouterr().err  # not Bob's to change
    assert other.id != owner.id and not (await store.get(db, row["id"])).write_to_calendar  # type: ignore[union-attr]
    code, out = await asyncio.to_thread(cli, env, "follow", "set", "Ada", str(row["id"]), "--write-to-calendar")
    assert code == 0 and "Pepper's calendar (no Google or CalDAV calendar is connected)" in out, out
    assert "2 upcoming" in out  # checked now
    assert await db.fetchval("SELECT count(*) FROM calendar_events WHERE status = 'confirmed'") == 2
    code, out = await asyncio.to_thread(cli, env, "follow", "list", "Ada")
    assert code == 0 and "copied to the primary connected calendar" in out
    code, out = await asyncio.to_thread(cli, env, "follow", "set", "Ada", str(row["id"]), "--no-write")
    assert code == 0 and "agenda only" in out
    assert await db.fetchval("SELECT count(*) FROM calendar_events WHERE status = 'confirmed'") == 0
    with pytest.raises(SystemExit):  # one of --write-to-calendar NAME or --no-write
        await asyncio.to_thread(cli, env, "follow", "set", "Ada", str(row["id"]))
    assert "one of the arguments --write-to-calendar --no-write is required" in capsys.readouterr().err


async def test_follow_add_in_a_conversation_names_the_calendar(db: Database, gcal: Caller, google: GoogleApiPeer):
    refused = await gcal("follow_add", {"source": "team:Arsenal", "write_to_calendar": True, "calendar": "Nowhere"})
    assert refused.status == "failed" and "no calendar 'Nowhere'" in refused.content
    assert await store.listing(db, gcal.account.id) == []
    scheduled = await gcal(
        "follow_add", {"source": "team:Arsenal", "write_to_calendar": True, "calendar": "google"}, kind="scheduled"
    )
    assert scheduled.status == "failed" and await store.listing(db, gcal.account.id) == []
    added = await gcal("follow_add", {"source": "team:Arsenal", "write_to_calendar": True, "calendar": "google"})
    assert added.status == "ok" and "copied to the person's calendar" in added.content, added.content
    [row] = await store.listing(db, gcal.account.id)
    assert row["write_to_calendar"] and row["write_calendar"] == "Google"
    await check(db, gcal)
    assert len(google.events) == 2 and all("attendees" not in e for e in google.events.values())
    text = (await gcal("follow_list", {})).content
    assert "copied to Google (2 in Google)" in text, text
    # The source now gives the fixture as a whole day: the copy's times change form, nothing left of the old.
    follow = await store.get(db, row["id"])
    assert follow is not None
    await db.execute(
        "UPDATE followed_events SET all_day = true, starts_at = '2025-03-28T23:00Z', ends_at = '2025-03-29T23:00Z'"
        " WHERE follow_id = $1 AND title = 'Arsenal vs Chelsea'",
        follow.id,
    )
    assert (await copies.sync(db, gcal.connectors, follow)).updated == 1
    chelsea = next(e for e in google.events.values() if e["summary"] == "Arsenal vs Chelsea")
    assert chelsea["start"] == {"date": "2025-03-29"} and chelsea["end"] == {"date": "2025-03-30"}
