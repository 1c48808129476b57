"""Remote calendars: CalDAV against a real Radicale, Google Calendar against the loopback peer,
and read-only iCalendar feeds served over HTTP."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime

import pytest
from aiohttp import web

from core.testing.google_api_peer import GoogleApiPeer
from core.testing.radicale_server import RadicaleServer
from core.tools.areas.calendar import CalendarUnavailable, add_ical_feed, connect_caldav, free_busy
from core.tools.connectors import CALENDAR_EVENTS
from core.tools.google_api import exchange_code

from .support import OWNER_EMAIL, serving


def refs(text: str) -> list[str]:
    return re.findall(r"\(ref ([^)]+)\)", text)


@pytest.fixture(scope="session")
def radicale(tmp_path_factory):
    with RadicaleServer(tmp_path_factory.mktemp("radicale")) as server:
        yield server


@pytest.fixture
async def caldav(call, radicale):
    url = radicale.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    await connect_caldav(call.db, call.connectors, call.account.id, url, "ada", "secret")
    return url


async def test_caldav_create_list_move_and_cancel_across_dst(call, caldav):
    session = await call.session()
    assert "caldav" in session.connections
    made = await call(
        "create_event",
        {"title": "Swim", "start": "2025-03-28T07:30", "calendar": "caldav", "recurrence": "FREQ=DAILY;COUNT=4"},
    )
    assert made.status == "ok", made.content
    listed = await call("list_events", {"start": "2025-03-28T00:00", "days": 5})
    assert listed.content.count("Swim") == 4
    assert "Sun 30 Mar 2025 07:30-08:30 Swim" in listed.content and "Mon 31 Mar 2025 07:30-08:30 Swim" in listed.content
    busy = await free_busy(
        call.db, call.account.id, datetime(2025, 3, 29, tzinfo=UTC), datetime(2025, 3, 31, tzinfo=UTC),
        connectors=call.connectors,
    )  # fmt: skip
    assert [b.start.hour for b in busy] == [6, 5]  # 07:30 CET, then 07:30 CEST
    swim = [r for r in refs(listed.content)]
    moved = await call("move_event", {"event": swim[1], "new_start": "2025-03-29T18:00"})
    assert moved.status == "ok", moved.content
    cancelled = await call("cancel_event", {"event": swim[2]})
    assert cancelled.status == "ok", cancelled.content
    listed = (await call("list_events", {"start": "2025-03-28T00:00", "days": 5})).content
    assert "Sat 29 Mar 2025 18:00-19:00 Swim" in listed and "Sun 30 Mar" not in listed
    assert listed.count("Swim") == 3
    gone = await call("cancel_event", {"event": refs(listed)[0], "whole_series": True})
    assert gone.status == "ok"
    assert (await call("list_events", {"start": "2025-03-28T00:00", "days": 5})).status == "empty"


async def test_an_unreachable_caldav_server_is_unknown_never_free(call, radicale):
    url = radicale.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    await connect_caldav(call.db, call.connectors, call.account.id, url, "ada", "x")
    await call.db.execute("UPDATE calendars SET remote = 'http://127.0.0.1:9/nothing/' WHERE kind = 'caldav'")
    await call("create_event", {"title": "Mine", "start": "2025-04-01T10:00"})
    listed = await call("list_events", {"start": "2025-04-01T00:00", "days": 1})
    assert listed.status == "ok" and "Mine" in listed.content and "unknown, not absent" in listed.content
    with pytest.raises(CalendarUnavailable):
        await free_busy(
            call.db, call.account.id, datetime(2025, 4, 1, tzinfo=UTC), datetime(2025, 4, 2, tzinfo=UTC),
            connectors=call.connectors,
        )  # fmt: skip


@pytest.fixture
async def google(call):
    async with GoogleApiPeer() as peer:
        peer.granted_scopes = CALENDAR_EVENTS
        yield peer


@pytest.fixture
async def gcal(call, google):
    caller = call.using(
        google_api_url=google.url, google_token_url=google.token_url, google_client_id="client-id",
        google_client_secret="client-secret",
    )  # fmt: skip
    code = google.issue_code("https://pepper.test/cb")
    await exchange_code(call.db, caller.connectors, call.account.id, code, "https://pepper.test/cb")
    return caller


async def test_google_calendar_events_invitations_and_scheduled_rules(gcal, google):
    session = await gcal.session()
    assert "google_calendar" in session.connections and "gmail" not in session.connections
    await gcal("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    made = await gcal(
        "create_event",
        {"title": "Sync", "start": "2025-03-28T09:00", "calendar": "google", "attendees": ["bob@example.org"]},
    )
    assert made.status == "ok", made.content
    [event] = google.events.values()
    assert event["sendUpdates"] == "all" and event["attendees"] == [{"email": "bob@example.org"}]
    quiet = await gcal(
        "create_event",
        {"title": "Plan", "start": "2025-03-28T14:00", "calendar": "google", "attendees": ["bob@example.org"]},
        kind="scheduled",
    )
    assert quiet.status == "ok" and "NO invitations" in quiet.content
    assert [e["sendUpdates"] for e in google.events.values()] == ["all", "none"]
    # The scheduled run's event carries no attendees: a later live change would notify them.
    assert [e.get("attendees") for e in google.events.values()] == [[{"email": "bob@example.org"}], []]
    listed = await gcal("list_events", {"start": "2025-03-28T00:00", "days": 1})
    sync, _plan = refs(listed.content)
    refused = await gcal("move_event", {"event": sync, "new_start": "2025-03-28T11:00"}, kind="scheduled")
    assert refused.status == "failed" and "other attendees" in refused.content
    moved = await gcal("move_event", {"event": sync, "new_start": "2025-03-28T11:00"})
    assert moved.status == "ok"
    first = next(iter(google.events.values()))
    assert first["start"]["dateTime"].startswith("2025-03-28T11:00:00+01:00") and first["lastSendUpdates"] == "all"
    busy = await free_busy(
        gcal.db, gcal.account.id, datetime(2025, 3, 28, tzinfo=UTC), datetime(2025, 3, 29, tzinfo=UTC),
        connectors=gcal.connectors,
    )  # fmt: skip
    assert [(b.start.hour, b.end.hour) for b in busy] == [(10, 11), (13, 14)]
    google.fail_next = 503
    with pytest.raises(CalendarUnavailable):
        await free_busy(
            gcal.db, gcal.account.id, datetime(2025, 3, 28, tzinfo=UTC), datetime(2025, 3, 29, tzinfo=UTC),
            connectors=gcal.connectors,
        )  # fmt: skip
    assert OWNER_EMAIL not in str(event["attendees"])


FEED = b"""BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//School//Term//EN
BEGIN:VEVENT
UID:term@school
DTSTART;VALUE=DATE:20250331
DTEND;VALUE=DATE:20250401
SUMMARY:Term starts
END:VEVENT
BEGIN:VEVENT
UID:club@school
DTSTART;TZID=Europe/Paris:20250327T160000
DTEND;TZID=Europe/Paris:20250327T170000
RRULE:FREQ=WEEKLY;COUNT=2
EXDATE;TZID=Europe/Paris:20250403T160000
SUMMARY:Chess club
END:VEVENT
END:VCALENDAR
"""


async def test_ical_feeds_are_read_only_and_do_not_block_free_busy(call):
    async def school(request: web.Request) -> web.Response:
        return web.Response(body=FEED, content_type="text/calendar")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html>not a calendar</html>", content_type="text/html")

    async with serving({"/school.ics": school, "/page": page}) as base:
        with pytest.raises(CalendarUnavailable):
            await add_ical_feed(call.db, call.connectors, call.account.id, f"{base}/page", "Page")
        await add_ical_feed(call.db, call.connectors, call.account.id, f"{base}/school.ics", "School")
        listed = await call("list_events", {"start": "2025-03-27T00:00", "days": 14})
        assert "Thu 27 Mar 2025 16:00-17:00 Chess club [School; repeats; read-only]" in listed.content
        assert "Mon 31 Mar 2025 all day Term starts" in listed.content
        assert listed.content.count("Chess club") == 1  # the second occurrence is excluded
        club = refs(listed.content)[0]
        out = await call("cancel_event", {"event": club})
        assert out.status == "failed" and "read-only" in out.content
        busy = await free_busy(
            call.db, call.account.id, datetime(2025, 3, 27, tzinfo=UTC), datetime(2025, 4, 5, tzinfo=UTC),
            connectors=call.connectors,
        )  # fmt: skip
        assert busy == []


async def test_a_private_feed_address_is_refused_outside_tests(call):
    strict = call.connectors.__class__()
    with pytest.raises(Exception, match="private network"):
        await add_ical_feed(call.db, strict, call.account.id, "http://127.0.0.1:1/x.ics", "Local")


HOLIDAYS = b"""BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//Ada//Holidays//EN
BEGIN:VEVENT
UID:holiday@ada
DTSTART;VALUE=DATE:20250331
DTEND;VALUE=DATE:20250402
SUMMARY:Holiday
END:VEVENT
BEGIN:VEVENT
UID:reminder@ada
DTSTART;VALUE=DATE:20250403
DTEND;VALUE=DATE:20250404
TRANSP:TRANSPARENT
SUMMARY:Bins day
END:VEVENT
END:VCALENDAR
"""


async def test_opaque_all_day_events_are_busy_for_the_owners_local_days_and_transparent_ones_free(call):
    async def holidays(request: web.Request) -> web.Response:
        return web.Response(body=HOLIDAYS, content_type="text/calendar")

    async with serving({"/holidays.ics": holidays}) as base:
        await add_ical_feed(call.db, call.connectors, call.account.id, f"{base}/holidays.ics", "Holidays")
        await call.db.execute("UPDATE calendars SET counts_busy = true WHERE kind = 'ical'")  # the owner chose so
        busy = await free_busy(
            call.db, call.account.id, datetime(2025, 3, 28, tzinfo=UTC), datetime(2025, 4, 5, tzinfo=UTC),
            connectors=call.connectors,
        )  # fmt: skip
    # Two days off in Paris (CEST): from local midnight on the 31st to local midnight on the 2nd.
    assert [(b.start, b.end) for b in busy] == [
        (datetime(2025, 3, 30, 22, tzinfo=UTC), datetime(2025, 4, 1, 22, tzinfo=UTC))
    ]


async def test_a_caldav_change_the_server_never_got_is_recorded_unsent_and_reported(call, radicale):
    url = radicale.make_calendar("ada", f"cal-{uuid.uuid4().hex[:8]}")
    await connect_caldav(call.db, call.connectors, call.account.id, url, "ada", "x")
    await call.db.execute("UPDATE calendars SET remote = 'http://127.0.0.1:9/nothing/' WHERE kind = 'caldav'")
    out = await call("create_event", {"title": "Swim", "start": "2025-04-01T07:30", "calendar": "caldav"})
    assert out.status == "failed" and "nothing changed" in out.content
    row = await call.db.fetchrow("SELECT effect, status, changed_at FROM calendar_outbox")
    assert (row["effect"], row["status"], row["changed_at"]) == ("caldav", "unsent", None)


async def test_a_caldav_invitation_whose_mail_fails_leaves_the_event_and_a_clear_record(call, caldav):
    """The event reached the CalDAV server, the invitation did not leave: the call says exactly that
    (not "nothing changed"), and the outbox row records both."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now: the connection is refused
    caller = call.using(smtp_host="127.0.0.1", smtp_port=port, smtp_security="none", smtp_from="pepper@p.test")
    await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    out = await caller(
        "create_event",
        {"title": "Swim", "start": "2025-04-01T07:30", "calendar": "caldav", "attendees": ["bob@example.org"]},
    )
    assert out.status == "failed"
    assert "saved on the CalDAV calendar" in out.content and "did NOT go out" in out.content
    listed = await caller("list_events", {"start": "2025-04-01T00:00", "days": 1})
    assert "Swim" in listed.content
    row = await call.db.fetchrow("SELECT effect, status, changed_at FROM calendar_outbox")
    assert row["effect"] == "caldav" and row["status"] == "unsent" and row["changed_at"] is not None


async def test_a_google_change_refused_after_the_commit_is_recorded_unsent_and_reported(gcal, google):
    """The change on Google goes out only after its record committed, and Google refusing it is
    said plainly: nothing changed, the row says unsent."""
    google.fail_next = 503
    out = await gcal("create_event", {"title": "Sync", "start": "2025-03-28T09:00", "calendar": "google"})
    assert out.status == "failed" and "nothing changed: Google Calendar did not take the change" in out.content
    assert google.events == {}
    row = await gcal.db.fetchrow("SELECT tool, effect, status, error FROM calendar_outbox")
    assert (row["tool"], row["effect"], row["status"]) == ("create_event", "google", "unsent") and row["error"]


async def test_a_google_change_whose_record_cannot_commit_is_never_asked_of_google(gcal, google):
    await gcal.db.execute(
        """
        CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$;
        CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON calendar_outbox
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit();
        """
    )
    out = await gcal("create_event", {"title": "Sync", "start": "2025-03-28T09:00", "calendar": "google"})
    assert out.status == "failed" and google.events == {}
    assert await gcal.db.fetchval("SELECT count(*) FROM calendar_outbox") == 0
