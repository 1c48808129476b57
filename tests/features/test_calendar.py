"""Pepper's own calendar: recurrence across DST, free/busy, booking, moves, cancels, invitations,
and the scheduled-run rules."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from core.testing.smtp_capture import MuteAfterData
from core.testing.smtp_peer import SmtpPeer
from core.tools.areas.calendar import Busy, SlotTaken, book, free_busy

from .support import OWNER_EMAIL


def refs(text: str) -> list[str]:
    return re.findall(r"\(ref ([^)]+)\)", text)


async def test_a_weekly_event_stays_at_nine_local_across_the_dst_change(call):
    made = await call(
        "create_event",
        {"title": "Standup", "start": "2025-03-24T09:00", "duration_minutes": 30, "recurrence": "FREQ=WEEKLY;COUNT=3"},
    )
    assert made.status == "ok", made.content
    listed = await call("list_events", {"start": "2025-03-20T00:00", "days": 30})
    assert listed.status == "ok"
    assert listed.content.count("Standup") == 3
    assert "Mon 24 Mar 2025 09:00-09:30 Standup" in listed.content
    assert "Mon 31 Mar 2025 09:00-09:30 Standup" in listed.content  # after the change: still 09:00 local
    busy = await free_busy(
        call.db, call.account.id, datetime(2025, 3, 20, tzinfo=UTC), datetime(2025, 4, 20, tzinfo=UTC)
    )
    assert busy == [
        Busy(datetime(2025, 3, 24, 8, 0, tzinfo=UTC), datetime(2025, 3, 24, 8, 30, tzinfo=UTC)),
        Busy(datetime(2025, 3, 31, 7, 0, tzinfo=UTC), datetime(2025, 3, 31, 7, 30, tzinfo=UTC)),
        Busy(datetime(2025, 4, 7, 7, 0, tzinfo=UTC), datetime(2025, 4, 7, 7, 30, tzinfo=UTC)),
    ]


async def test_free_busy_merges_overlaps_and_clips_to_the_window(call):
    await call("create_event", {"title": "A", "start": "2025-04-01T10:00", "end": "2025-04-01T11:00"})
    await call("create_event", {"title": "B", "start": "2025-04-01T10:30", "end": "2025-04-01T12:00"})
    await call("create_event", {"title": "C", "start": "2025-04-01T18:00", "end": "2025-04-01T19:00"})
    start = datetime(2025, 4, 1, 8, 45, tzinfo=UTC)
    busy = await free_busy(call.db, call.account.id, start, datetime(2025, 4, 1, 23, tzinfo=UTC))
    assert busy == [
        Busy(start, datetime(2025, 4, 1, 10, tzinfo=UTC)),
        Busy(datetime(2025, 4, 1, 16, tzinfo=UTC), datetime(2025, 4, 1, 17, tzinfo=UTC)),
    ]
    out = await call("calendar_free_busy", {"start": "2025-04-02T00:00", "end": "2025-04-03T00:00"})
    assert out.status == "ok" and "Free the whole time" in out.content


async def test_bad_times_and_rules_fail_plainly_and_save_nothing(call):
    for args in (
        {"title": "X", "start": "next tuesday"},
        {"title": "X", "start": "2025-04-01T10:00", "end": "2025-04-01T09:00"},
        {"title": "X", "start": "2025-04-01T10:00", "recurrence": "FREQ=SOMETIMES"},
        {"title": "X", "start": "2025-04-01T10:00", "timezone": "Mars/Olympus"},
    ):
        out = await call("create_event", args)
        assert out.status == "failed", args
    assert await call.db.fetchval("SELECT count(*) FROM calendar_events") == 0


async def test_booking_never_double_books_under_concurrency(call):
    start = datetime(2025, 4, 2, 9, tzinfo=UTC)
    slots = [(start + timedelta(minutes=15 * i), start + timedelta(minutes=15 * i + 60)) for i in range(4)]

    async def attempt(s, e):
        try:
            return await book(call.db, call.account.id, s, e, "Call back")
        except SlotTaken:
            return None

    results = await asyncio.gather(*(attempt(s, e) for s, e in slots * 2))
    assert sum(r is not None for r in results) == 1
    assert await call.db.fetchval("SELECT count(*) FROM calendar_events") == 1


async def test_booking_twice_with_one_key_books_once(call):
    s, e = datetime(2025, 4, 2, 9, tzinfo=UTC), datetime(2025, 4, 2, 10, tzinfo=UTC)
    first = await book(call.db, call.account.id, s, e, "Dentist", booking_key="call-1")
    again = await book(call.db, call.account.id, s, e, "Dentist", booking_key="call-1")
    assert first.created and not again.created and first.event_id == again.event_id
    with pytest.raises(SlotTaken):
        await book(call.db, call.account.id, s + timedelta(minutes=30), e + timedelta(minutes=30), "Other")


async def test_booking_respects_recurring_busy_time(call):
    await call("create_event", {"title": "Gym", "start": "2025-03-24T18:00", "recurrence": "FREQ=DAILY"})
    with pytest.raises(SlotTaken):  # 18:30 Paris on 2 April is 16:30 UTC (summer time)
        await book(
            call.db,
            call.account.id,
            datetime(2025, 4, 2, 16, 30, tzinfo=UTC),
            datetime(2025, 4, 2, 17, tzinfo=UTC),
            "X",
        )
    ok = await book(
        call.db, call.account.id, datetime(2025, 4, 2, 17, tzinfo=UTC), datetime(2025, 4, 2, 17, 30, tzinfo=UTC), "X"
    )
    assert ok.created


async def test_moving_and_cancelling_one_occurrence_leaves_the_series(call):
    await call("create_event", {"title": "Piano", "start": "2025-03-25T17:00", "recurrence": "FREQ=WEEKLY;COUNT=4"})
    listed = await call("list_events", {"start": "2025-03-24T00:00", "days": 30})
    first, second, third, _ = refs(listed.content)
    moved = await call("move_event", {"event": second, "new_start": "2025-04-02T08:00"})
    assert moved.status == "ok", moved.content
    cancelled = await call("cancel_event", {"event": third})
    assert cancelled.status == "ok", cancelled.content
    listed = (await call("list_events", {"start": "2025-03-24T00:00", "days": 30})).content
    assert "Tue 01 Apr 2025" not in listed and "Wed 02 Apr 2025 08:00-09:00 Piano" in listed
    assert "Tue 08 Apr 2025" not in listed and "Tue 15 Apr 2025 17:00-18:00 Piano" in listed
    assert listed.count("Piano") == 3
    gone = await call("cancel_event", {"event": first, "whole_series": True})
    assert gone.status == "ok" and "whole series" in gone.content
    after = await call("list_events", {"start": "2025-03-24T00:00", "days": 30})
    assert after.status == "empty"


async def test_moving_a_whole_series_keeps_local_time(call):
    await call("create_event", {"title": "Yoga", "start": "2025-03-26T07:00", "recurrence": "FREQ=WEEKLY;COUNT=3"})
    ref = refs((await call("list_events", {"start": "2025-03-24T00:00", "days": 30})).content)[1]
    out = await call("move_event", {"event": ref, "new_start": "2025-04-02T08:00", "whole_series": True})
    assert out.status == "ok", out.content
    listed = (await call("list_events", {"start": "2025-03-24T00:00", "days": 30})).content
    assert "Wed 26 Mar 2025 08:00-09:00 Yoga" in listed and "Wed 09 Apr 2025 08:00-09:00 Yoga" in listed


async def test_a_ref_that_names_nothing_is_a_clear_failure(call):
    out = await call("cancel_event", {"event": "deadbeef:0123"})
    assert out.status == "failed" and "list the events again" in out.content


async def test_invitations_go_only_to_verifiable_addresses_with_the_owner_copied(call):
    async with SmtpPeer() as smtp:
        caller = call.using(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", smtp_from="pepper@p.test")
        refused = await caller(
            "create_event", {"title": "Lunch", "start": "2025-04-03T12:00", "attendees": ["stranger@else.test"]}
        )
        assert refused.status == "failed" and "stranger@else.test" in refused.content
        assert await call.db.fetchval("SELECT count(*) FROM calendar_events") == 0
        assert (
            await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        ).status == "ok"
        made = await caller(
            "create_event", {"title": "Lunch", "start": "2025-04-03T12:00", "attendees": ["Bob@Example.org"]}
        )
        assert made.status == "ok" and "invitations sent to bob@example.org" in made.content
        assert len(smtp.received) == 1
        mail = smtp.received[0]
        assert set(mail.rcpt_to) == {"bob@example.org", OWNER_EMAIL}
        parts = [p for p in mail.message.walk() if p.get_content_type() == "text/calendar"]
        assert parts and "METHOD:REQUEST" in parts[0].get_content()


async def test_scheduled_run_adds_the_event_but_sends_no_invitations(call):
    async with SmtpPeer() as smtp:
        caller = call.using(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", smtp_from="pepper@p.test")
        await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        out = await caller(
            "create_event",
            {
                "title": "Review",
                "start": "2025-04-03T15:00",
                "attendees": ["bob@example.org"],
                "send_invitations": True,
            },
            kind="scheduled",
        )
        assert out.status == "ok", out.content
        assert "NO invitations were sent" in out.content and "no invitations were sent" in out.content
        assert out.arguments["send_invitations"] is False
        assert [s.policy for s in out.gate.steps if s.action == "modify"] == ["scheduled-run"]
        assert smtp.received == []
        assert await call.db.fetchval("SELECT count(*) FROM calendar_events") == 1


async def test_a_scheduled_run_stores_no_attendees_from_what_it_read(call):
    # A scheduled run read an emailed invitation and, fooled, copies its addresses onto the event.
    await call("add_contact", {"name": "Bob", "emails": ["bob@example.org"]})
    out = await call(
        "create_event",
        {"title": "Vendor sync", "start": "2025-04-03T15:00", "attendees": ["mallory@evil.example", "bob@example.org"]},
        kind="scheduled",
    )
    assert out.status == "ok", out.content
    assert "NOT added as attendees" in out.content and "mallory@evil.example" in out.content
    assert await call.db.fetchval("SELECT attendees FROM calendar_events WHERE title = 'Vendor sync'") == "[]"
    # So a later live change has nobody to tell.
    [ref] = refs((await call("list_events", {"start": "2025-04-03T00:00", "days": 1})).content)
    moved = await call("move_event", {"event": ref, "new_start": "2025-04-03T16:00"})
    assert moved.status == "ok" and "mallory" not in moved.content and "bob@" not in moved.content
    # A live turn still adds attendees.
    live = await call(
        "create_event",
        {"title": "1:1", "start": "2025-04-04T15:00", "attendees": ["bob@example.org"], "send_invitations": False},
    )
    assert live.status == "ok" and "bob@example.org listed as attendees" in live.content


async def test_scheduled_run_cannot_change_an_event_with_other_attendees(call):
    await call("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    await call(
        "create_event",
        {"title": "1:1", "start": "2025-04-03T15:00", "attendees": ["bob@example.org"], "send_invitations": False},
    )
    await call("create_event", {"title": "Focus", "start": "2025-04-03T09:00"})
    listed = (await call("list_events", {"start": "2025-04-03T00:00", "days": 1})).content
    focus, one_on_one = refs(listed)
    for name, args in (
        ("move_event", {"event": one_on_one, "new_start": "2025-04-04T15:00"}),
        ("cancel_event", {"event": one_on_one}),
    ):
        out = await call(name, args, kind="scheduled")
        assert out.status == "failed" and "other attendees" in out.content and "bob@example.org" in out.content
    assert (
        await call("move_event", {"event": focus, "new_start": "2025-04-03T10:00"}, kind="scheduled")
    ).status == "ok"
    after = (await call("list_events", {"start": "2025-04-03T00:00", "days": 2})).content
    assert "Thu 03 Apr 2025 15:00-16:00 1:1" in after and "Thu 03 Apr 2025 10:00-11:00 Focus" in after
    live = await call("cancel_event", {"event": one_on_one})
    assert live.status == "ok" and "NOT told" in live.content  # Pepper's mail is not set up here


def _mailing(call, port: int):
    return call.using(smtp_host="127.0.0.1", smtp_port=port, smtp_security="none", smtp_from="pepper@p.test")


async def _refuse_commits_on(db, table: str) -> None:
    """The store refuses the commit itself (a deferred check fails at COMMIT)."""
    await db.execute(
        f"""
        CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$;
        CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT OR UPDATE ON {table}
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit();
        """
    )


LUNCH = {"title": "Lunch", "start": "2025-04-03T12:00", "attendees": ["bob@example.org"]}


async def test_an_invitation_whose_event_cannot_commit_does_not_go_out(call):
    async with SmtpPeer() as smtp:
        caller = _mailing(call, smtp.port)
        await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        await _refuse_commits_on(call.db, "calendar_events")
        out = await caller("create_event", LUNCH)
        assert out.status == "failed"
        # Never an invitation to an event that is not there.
        assert smtp.received == [] and await call.db.fetchval("SELECT count(*) FROM calendar_events") == 0


async def test_a_cancellation_whose_change_cannot_commit_does_not_go_out(call):
    async with SmtpPeer() as smtp:
        caller = _mailing(call, smtp.port)
        await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        assert (await caller("create_event", LUNCH)).status == "ok"
        [ref] = refs((await caller("list_events", {"start": "2025-04-03T00:00", "days": 1})).content)
        await _refuse_commits_on(call.db, "calendar_events")
        out = await caller("cancel_event", {"event": ref})
        assert out.status == "failed"
        assert len(smtp.received) == 1  # the invitation only: no cancellation of an event that still stands
        assert await call.db.fetchval("SELECT status FROM calendar_events") == "confirmed"


async def test_an_invitation_cut_off_after_the_mail_was_handed_over_is_kept_as_failed(call):
    """A mail server that takes the whole invitation and drops the connection instead of answering:
    the event is saved, the mail may have gone, and its record says so with its Message-ID."""
    async with MuteAfterData() as server:
        caller = _mailing(call, server.port)
        await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        out = await caller("create_event", LUNCH)
    got = server.received
    assert out.status == "failed" and len(got) == 1
    assert "saved" in out.content and "not known whether the mail to bob@example.org went out" in out.content
    assert await call.db.fetchval("SELECT count(*) FROM calendar_events WHERE title = 'Lunch'") == 1
    row = await call.db.fetchrow("SELECT tool, effect, status, message_id, payload FROM calendar_outbox")
    assert (row["tool"], row["effect"], row["status"]) == ("create_event", "mail", "failed")
    assert row["message_id"] and row["message_id"].encode() in got[0]
    assert "METHOD:REQUEST" in json.loads(row["payload"])["mail"]["ical"]


async def test_an_invitation_the_mail_server_never_took_is_recorded_unsent_and_the_event_stands(call):
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now: the connection is refused
    caller = _mailing(call, port)
    await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
    out = await caller("create_event", LUNCH)
    assert out.status == "failed"
    assert "saved in Pepper's calendar" in out.content and "did NOT go out" in out.content
    assert await call.db.fetchval("SELECT count(*) FROM calendar_events WHERE title = 'Lunch'") == 1
    assert await call.db.fetchval("SELECT status FROM calendar_outbox") == "unsent"


async def test_a_sent_invitation_is_recorded_as_sent(call):
    async with SmtpPeer() as smtp:
        caller = _mailing(call, smtp.port)
        await caller("add_contact", {"name": "Bob", "emails": ["bob@example.org"]}, delivered=True)
        assert (await caller("create_event", LUNCH)).status == "ok"
        [ref] = refs((await caller("list_events", {"start": "2025-04-03T00:00", "days": 1})).content)
        assert (await caller("cancel_event", {"event": ref})).status == "ok"
        assert len(smtp.received) == 2
    rows = await call.db.fetch("SELECT tool, status, message_id, done_at FROM calendar_outbox ORDER BY id")
    assert [(r["tool"], r["status"]) for r in rows] == [("create_event", "sent"), ("cancel_event", "sent")]
    assert all(r["message_id"] and r["done_at"] for r in rows)
