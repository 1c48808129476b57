"""The calendar's tools: list, free/busy, create, move and cancel, across every calendar.

Rules in code for scheduled runs (no person present):

* ``create_event`` may add events but sends no invitations (the gate forces
  ``send_invitations=false``; the handler enforces it again) and stores no other attendees: the
  addresses may come from what the run read, and a later change would notify them. Attendees are
  added only in a live turn;
* ``move_event`` and ``cancel_event`` refuse an event with other attendees.

In any session, invitations go only to addresses Pepper can verify (the person's own handles or
a contact's addresses).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import httpx

from core.errors import InvalidInput, PepperError
from core.store.queries import Queries
from core.tools.areas.calendar import ical
from core.tools.areas.calendar.model import Attendee, describe, parse_when, zone
from core.tools.areas.calendar.recurrence import normalize_rrule
from core.tools.areas.calendar.service import (
    caldav_cancel_occurrence,
    caldav_shift,
    cancel_own,
    find_event,
    free_busy,
    list_events,
    shift_own,
)
from core.tools.areas.calendar.sources import caldav_client, find_calendar, google_path, new_uid
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event
from core.tools.connectors import Connectors
from core.tools.google_api import GoogleClient
from core.tools.mail import MailError, build_message, clean_addresses, owner_emails, send_smtp, unverifiable
from core.tools.registry import Narrowing, Tool, ToolContext, ToolOutcome

log = logging.getLogger(__name__)

AREA = "calendar"
MAX_DAYS = 62


def _tz(ctx: ToolContext, args: dict[str, Any]) -> ZoneInfo:
    return zone(args.get("timezone") or ctx.session.timezone)


def _fmt(value: datetime, tz: ZoneInfo) -> str:
    return f"{value.astimezone(tz):%a %d %b %Y %H:%M}"


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def mine(db: Queries, account_id: UUID) -> set[str]:
        own = set(await owner_emails(db, account_id))
        if connectors.smtp_from:
            own.add(connectors.smtp_from.lower())
        return own

    # --- reads ---------------------------------------------------------------------------------

    async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            tz = _tz(ctx, args)
            start = parse_when(args["start"], tz) if args.get("start") else ctx.now.astimezone(tz)
            end = parse_when(args["end"], tz) if args.get("end") else start + timedelta(days=args.get("days", 7))
            if end - start > timedelta(days=MAX_DAYS):
                return ToolOutcome.failed(f"ask for at most {MAX_DAYS} days at a time")
            listing = await list_events(ctx.db, connectors, ctx.session.account_id, start, end, tz)
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message)
        missing = ""
        if listing.unavailable:
            missing = f"Could not read {', '.join(listing.unavailable)}: those events are unknown, not absent."
        if not listing.events:
            if listing.unavailable:
                return ToolOutcome.failed(missing)
            return ToolOutcome.empty(f"no events between {_fmt(start, tz)} and {_fmt(end, tz)} ({tz.key})")
        lines = [describe(ev, tz) for ev in listing.events]
        head = f"Events {_fmt(start, tz)} to {_fmt(end, tz)} ({tz.key}):"
        return ToolOutcome.ok("\n".join([head, *lines, *([missing] if missing else [])]))

    async def _free_busy(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            tz = _tz(ctx, args)
            start, end = parse_when(args["start"], tz), parse_when(args["end"], tz)
            if end - start > timedelta(days=MAX_DAYS):
                return ToolOutcome.failed(f"ask for at most {MAX_DAYS} days at a time")
            busy = await free_busy(ctx.db, ctx.session.account_id, start, end, connectors=connectors)
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        if not busy:
            return ToolOutcome.ok(f"Free the whole time from {_fmt(start, tz)} to {_fmt(end, tz)} ({tz.key}).")
        lines = [f"- busy {_fmt(b.start, tz)} to {_fmt(b.end, tz)}" for b in busy]
        return ToolOutcome.ok("\n".join([f"Busy times ({tz.key}); everything else is free:", *lines]))

    # --- create --------------------------------------------------------------------------------

    async def _plan_create(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        account_id = ctx.session.account_id
        try:
            tz = _tz(ctx, args)
            cal = await find_calendar(ctx.db, account_id, args.get("calendar"))
            if cal.read_only:
                return ToolOutcome.failed(f"{cal.name} is read-only; use another calendar")
            start = parse_when(args["start"], tz)
            if args.get("end"):
                end = parse_when(args["end"], tz)
            else:
                end = start + timedelta(minutes=args.get("duration_minutes", 60))
            if end <= start:
                return ToolOutcome.failed("the end must come after the start")
            rrule = normalize_rrule(args["recurrence"]) if args.get("recurrence") else None
            attendees = clean_addresses(args.get("attendees", ()))
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message)
        own = await mine(ctx.db, account_id)
        attendees = [a for a in attendees if a not in own]
        left_off: list[str] = []
        if ctx.session.kind == "scheduled":
            # No person is present: the addresses may come from what the run read (an emailed
            # invitation). Stored on the event, a later live change of a Google event would notify
            # them, so a scheduled run stores none; a live turn adds them.
            left_off, attendees = attendees, []
        invite = bool(attendees) and args.get("send_invitations", True)
        if ctx.session.kind == "scheduled":
            invite = False  # the gate already forced this; a tool that trusts only the gate is one bug away
        if invite:
            bad = await unverifiable(ctx.db, account_id, attendees, ctx.session.turn_id)
            if bad:
                return ToolOutcome.failed(
                    f"cannot invite {', '.join(bad)}: not an address Pepper can verify (not a contact or the "
                    "person's own). Add them as a contact first, or create the event without invitations"
                )
            if cal.kind in ("pepper", "caldav") and not connectors.smtp_configured:
                return ToolOutcome.failed(
                    "invitations from this calendar go by Pepper's mail, which is not set up; create the event "
                    "without invitations"
                )
        organizer = next(iter(await owner_emails(ctx.db, account_id)), None)
        payload = {
            "calendar_id": str(cal.id),
            "kind": cal.kind,
            "title": args["title"].strip(),
            "start": start.isoformat(),
            "end": end.isoformat(),
            "tzid": tz.key,
            "rrule": rrule,
            "location": args.get("location"),
            "description": args.get("description"),
            "attendees": attendees,
            "invite": invite,
            "organizer": organizer,
            "outbox": uuid4().hex,
        }
        when = f"{_fmt(start, tz)}-{end.astimezone(tz):%H:%M} ({tz.key})"
        summary = f"event {payload['title']!r} created in {cal.name}, {when}" + (", repeating" if rrule else "")
        if attendees:
            summary += (
                f"; invitations sent to {', '.join(attendees)}"
                if invite
                else f"; {', '.join(attendees)} listed as attendees but NO invitations were sent"
            )
        if left_off:
            summary += (
                f"; {', '.join(left_off)} NOT added as attendees and NO invitations were sent: a scheduled run "
                "creates events without other attendees (add them in a conversation with the person)"
            )
        return ToolOutcome.planned(payload, summary)

    # --- outside effects: an outbox row committed with the change, the effect after the commit ---

    async def _queue(conn: Queries, account_id: UUID, tool: str, effect: str, p: dict[str, Any], **extra: Any) -> None:
        await conn.execute(
            "INSERT INTO calendar_outbox (account_id, effect_key, tool, effect, payload)"
            " VALUES ($1, $2, $3, $4, $5::jsonb)",
            account_id, p["outbox"], tool, effect, json.dumps({"plan": p, **extra}),
        )  # fmt: skip

    async def _after(db: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        """After the commit: claim the call's outbox row, do what it says, record how it went. A
        failure that surely did not leave is ``unsent``, one that may have left stays ``failed``;
        either way the call fails with what happened."""
        row = await db.fetchrow(
            "UPDATE calendar_outbox SET status = 'sending' WHERE account_id = $1 AND effect_key = $2"
            " AND status = 'queued' RETURNING *",
            account_id, p.get("outbox"),
        )  # fmt: skip
        if row is None:
            return  # nothing to do outside (or another call took it)
        payload = json.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
        try:
            if row["effect"] == "mail":
                await _send(db, row["id"], payload["mail"])
            elif row["effect"] == "caldav":
                await _caldav(db, account_id, row, payload)
            else:
                await _google(db, account_id, row["tool"], payload["plan"])
        except Exception as exc:
            left = _may_have_left(exc)
            changed = await db.fetchval(
                "UPDATE calendar_outbox SET status = $2, error = $3, done_at = now() WHERE id = $1 RETURNING"
                " changed_at IS NOT NULL",
                row["id"], "failed" if left else "unsent", getattr(exc, "code", type(exc).__name__),
            )  # fmt: skip
            log.warning("calendar outside effect failed: effect=%s may_have_left=%s", row["effect"], left)
            raise PepperError(_failure(row["effect"], payload, exc, left=left, changed=bool(changed))) from exc
        await db.execute("UPDATE calendar_outbox SET status = 'sent', done_at = now() WHERE id = $1", row["id"])

    async def _mail_spec(
        db: Queries, account_id: UUID, method: str, vevent: Any, to: list[str], subject: str
    ) -> dict[str, Any]:
        """The iMIP mail (an invitation, update or cancellation) as the outbox records it."""
        cc = (await owner_emails(db, account_id))[:1]
        return {"method": method, "ical": ical.wrap(vevent, method=method).decode(), "to": to, "cc": cc,
                "subject": subject}  # fmt: skip

    async def _send(db: Queries, row_id: int, mail: dict[str, Any]) -> None:
        cc = mail["cc"]
        message = build_message(
            from_address=connectors.smtp_from or "", from_name="Pepper", to=mail["to"], cc=cc,
            subject=mail["subject"], body=f"{mail['subject']}\n\nSent by Pepper on behalf of "
            f"{cc[0] if cc else 'its owner'}.", calendar=mail["ical"].encode(), calendar_method=mail["method"],
        )  # fmt: skip
        await db.execute("UPDATE calendar_outbox SET message_id = $2 WHERE id = $1", row_id, message["Message-ID"])
        await send_smtp(connectors, message)

    async def _tell(
        db: Queries, account_id: UUID, method: str, p: dict[str, Any], start: datetime, end: datetime,
        original: datetime | None,
    ) -> dict[str, Any] | None:  # fmt: skip
        """The update or cancellation mail (iMIP) for Pepper's own and CalDAV calendars, if anyone is told."""
        if not p["notify"]:
            return None
        uid = p.get("uid") or f"{p['key']}@pepper"
        vevent = ical.build_vevent(
            uid=uid, title=p["title"], start=start, end=end, tzid="UTC", attendees=[Attendee(a) for a in p["notify"]],
            organizer=p.get("organizer"), sequence=p.get("sequence", 0) + 1, recurrence_id=original,
            status="CANCELLED" if method == "CANCEL" else None,
        )  # fmt: skip
        word = "Cancelled" if method == "CANCEL" else "Updated"
        return await _mail_spec(db, account_id, method, vevent, p["notify"], f"{word}: {p['title']}")

    # --- applying (in the runner's transaction) -----------------------------------------------

    async def _apply_create(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        start, end = datetime.fromisoformat(p["start"]), datetime.fromisoformat(p["end"])
        people = [Attendee(a) for a in p["attendees"]]
        uid = new_uid()
        vevent = ical.build_vevent(
            uid=uid, title=p["title"], start=start, end=end, tzid=p["tzid"], rrule=p["rrule"],
            location=p["location"], description=p["description"], attendees=people, organizer=p["organizer"],
        )  # fmt: skip
        mail = None
        if p["invite"] and p["kind"] in ("pepper", "caldav"):
            mail = await _mail_spec(conn, account_id, "REQUEST", vevent, p["attendees"], f"Invitation: {p['title']}")
        if p["kind"] == "pepper":
            cal_id = await ensure_pepper_calendar(conn, account_id)
            await insert_event(
                conn, account_id, cal_id, title=p["title"], start=start, end=end, tzid=p["tzid"], rrule=p["rrule"],
                location=p["location"], description=p["description"], uid=uid,
                attendees=[a.as_json() for a in people],
            )  # fmt: skip
            if mail is not None:
                await _queue(conn, account_id, "create_event", "mail", p, mail=mail)
        elif p["kind"] == "caldav":
            await _queue(conn, account_id, "create_event", "caldav", p, uid=uid, ical=ical.wrap(vevent).decode(),
                         mail=mail)  # fmt: skip
        elif p["kind"] == "google":
            await _queue(conn, account_id, "create_event", "google", p)

    async def _apply_move(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        if p["kind"] != "pepper":
            await _queue(conn, account_id, "move_event", p["kind"], p)
            return
        original = datetime.fromisoformat(p["original"]) if p["original"] else None
        new_start, new_end = datetime.fromisoformat(p["new_start"]), datetime.fromisoformat(p["new_end"])
        delta = timedelta(seconds=p["delta"])
        row = await conn.fetchrow("SELECT starts_at, ends_at FROM calendar_events WHERE id = $1", UUID(hex=p["key"]))
        if original is None and row is not None:  # whole series or single event: shift by the same amount
            new_start, new_end = row["starts_at"] + delta, row["starts_at"] + delta + (new_end - new_start)
        await shift_own(conn, account_id, UUID(hex=p["key"]), new_start, new_end, original)
        mail = await _tell(conn, account_id, "REQUEST", p, new_start, new_end, original)
        if mail is not None:
            await _queue(conn, account_id, "move_event", "mail", p, mail=mail)

    async def _apply_cancel(conn: Queries, account_id: UUID, p: dict[str, Any]) -> None:
        if p["kind"] != "pepper":
            await _queue(conn, account_id, "cancel_event", p["kind"], p)
            return
        original = datetime.fromisoformat(p["original"]) if p["original"] else None
        row = await conn.fetchrow("SELECT starts_at, ends_at FROM calendar_events WHERE id = $1", UUID(hex=p["key"]))
        await cancel_own(conn, account_id, UUID(hex=p["key"]), original)
        if row is not None:
            start = original or row["starts_at"]
            mail = await _tell(conn, account_id, "CANCEL", p, start, start + (row["ends_at"] - row["starts_at"]),
                               original)  # fmt: skip
            if mail is not None:
                await _queue(conn, account_id, "cancel_event", "mail", p, mail=mail)

    # --- the outside effects (after the commit) -------------------------------------------------

    async def _caldav(db: Queries, account_id: UUID, row: Any, payload: dict[str, Any]) -> None:
        """The change on the CalDAV server, then (its time known) the mail that tells attendees."""
        p, tool = payload["plan"], row["tool"]
        original = datetime.fromisoformat(p["original"]) if p.get("original") else None
        mail = payload.get("mail")
        try:  # finding the event and working out the change: nothing is asked of the server yet
            if tool == "create_event":
                cal = await find_calendar(db, account_id, UUID(p["calendar_id"]).hex[:8])
                client = await caldav_client(db, connectors, cal)
                url, etag, new = client.resource_url(payload["uid"], new=True), None, True
                data: bytes | None = payload["ical"].encode()
            else:
                target = await find_event(db, connectors, account_id, f"{p['calendar']}:{p['key']}")
                d = target.detail
                client, url, etag, new = d["client"], d["client"].resource_url(d["res"].href), d["res"].etag, False
                start, end = target.start, target.end
                if tool == "move_event":
                    start, end = datetime.fromisoformat(p["new_start"]), datetime.fromisoformat(p["new_end"])
                    if original is None:
                        first = ical._instant(d["master"].decoded("DTSTART"), ZoneInfo("UTC"))[0]
                        delta = timedelta(seconds=p["delta"])
                        start, end = first + delta, first + delta + (end - start)
                    data = caldav_shift(d["doc"], original, start, end)
                else:
                    data = caldav_cancel_occurrence(d["doc"], original) if original is not None else None
        except Exception as exc:
            raise _Unchanged(exc) from exc
        if data is None:
            await client.delete(url, etag=etag)
        elif new:
            await client.put(url, data, new=True)
        else:
            await client.put(url, data, etag=etag)
        await db.execute("UPDATE calendar_outbox SET changed_at = now() WHERE id = $1", row["id"])
        if tool != "create_event":
            mail = await _tell(db, account_id, "REQUEST" if tool == "move_event" else "CANCEL", p, start, end, original)
        if mail is not None:
            await _send(db, row["id"], mail)

    async def _google(db: Queries, account_id: UUID, tool: str, p: dict[str, Any]) -> None:
        """The change on Google Calendar, which tells attendees itself (``sendUpdates``)."""
        if tool == "create_event":
            start, end = datetime.fromisoformat(p["start"]), datetime.fromisoformat(p["end"])
            try:
                cal = await find_calendar(db, account_id, UUID(p["calendar_id"]).hex[:8])
            except Exception as exc:
                raise _Unchanged(exc) from exc
            body: dict[str, Any] = {
                "summary": p["title"],
                "start": {"dateTime": start.isoformat(), "timeZone": p["tzid"]},
                "end": {"dateTime": end.isoformat(), "timeZone": p["tzid"]},
                "attendees": [{"email": a} for a in p["attendees"]],
            }
            if p["rrule"]:
                body["recurrence"] = [f"RRULE:{p['rrule']}"]
            for key in ("location", "description"):
                if p[key]:
                    body[key] = p[key]
            client = GoogleClient(db, connectors, cal.connection_id)  # type: ignore[arg-type]
            await client.call(
                "POST", google_path(cal), params={"sendUpdates": "all" if p["invite"] else "none"}, body=body
            )
            return
        updates = {"sendUpdates": "all" if p["notify"] else "none"}
        try:  # finding the event (and its series): nothing is asked of Google to change yet
            target = await find_event(db, connectors, account_id, f"{p['calendar']}:{p['key']}")
            client = target.detail["client"]
            event_id = p["key"]
            if tool == "move_event":
                new_start, new_end = datetime.fromisoformat(p["new_start"]), datetime.fromisoformat(p["new_end"])
                delta = timedelta(seconds=p["delta"])
                if p["whole"] and target.detail["item"].get("recurringEventId"):
                    event_id = target.detail["item"]["recurringEventId"]
                    master = await client.call("GET", google_path(target.cal, event_id))
                    first = datetime.fromisoformat(master["start"]["dateTime"].replace("Z", "+00:00"))
                    new_start, new_end = first + delta, first + delta + (new_end - new_start)
        except Exception as exc:
            raise _Unchanged(exc) from exc
        if tool == "cancel_event":
            await client.call("DELETE", google_path(target.cal, p["key"]), params=updates)
            return
        await client.call(
            "PATCH",
            google_path(target.cal, event_id),
            params=updates,
            body={"start": {"dateTime": new_start.isoformat()}, "end": {"dateTime": new_end.isoformat()}},
        )

    # --- planning move and cancel --------------------------------------------------------------

    async def _notifiable(ctx: ToolContext, target: Any, others: list[str]) -> tuple[list[str], list[str]]:
        """(who will be told of a change, who will not). Google tells attendees itself; Pepper's own
        and CalDAV calendars tell them by Pepper's mail, only at addresses it can verify."""
        if not others:
            return [], []
        if target.cal.kind == "google":
            return others, []
        if not connectors.smtp_configured:
            return [], others
        bad = await unverifiable(ctx.db, ctx.session.account_id, others, ctx.session.turn_id)
        return [a for a in others if a not in bad], bad

    # --- move and cancel -----------------------------------------------------------------------

    async def _target(ctx: ToolContext, ref: str) -> Any:
        target = await find_event(ctx.db, connectors, ctx.session.account_id, ref)
        others = target.others(await mine(ctx.db, ctx.session.account_id))
        if others and ctx.session.kind == "scheduled":
            raise _Refused(
                f"refused by Pepper's rules: {target.title!r} has other attendees ({', '.join(others)}), and a "
                "scheduled run may not change or cancel such an event. Nothing changed; tell the person instead"
            )
        return target, others

    async def _about(ctx: ToolContext, target: Any, others: list[str]) -> dict[str, Any]:
        told, untold = await _notifiable(ctx, target, others)
        row = target.detail.get("row")
        return {
            "notify": told,
            "untold": untold,
            "title": target.title,
            "organizer": next(iter(await owner_emails(ctx.db, ctx.session.account_id)), None),
            "uid": row["uid"] if row is not None else target.key,
            "sequence": row["sequence"] if row is not None else 0,
        }

    async def _plan_move(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            tz = _tz(ctx, args)
            target, others = await _target(ctx, args["event"])
            new_start = parse_when(args["new_start"], tz)
            duration = target.end - target.start
            new_end = parse_when(args["new_end"], tz) if args.get("new_end") else new_start + duration
            if new_end <= new_start:
                return ToolOutcome.failed("the end must come after the start")
        except (InvalidInput, _Refused) as exc:
            return ToolOutcome.failed(str(exc))
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        whole = bool(args.get("whole_series")) or target.original is None
        payload = {
            "ref": args["event"],
            "kind": target.cal.kind,
            "calendar": target.cal.ref,
            "key": target.key,
            "original": target.original.isoformat() if target.original and not whole else None,
            "delta": (new_start - target.start).total_seconds(),
            "whole": whole,
            "new_start": new_start.isoformat(),
            "new_end": new_end.isoformat(),
            "outbox": uuid4().hex,
            **(await _about(ctx, target, others)),
        }
        what = "the whole series" if whole and target.recurring else "it"
        summary = f"{target.title!r} moved ({what}) to {_fmt(new_start, tz)}-{new_end.astimezone(tz):%H:%M} ({tz.key})"
        return ToolOutcome.planned(payload, summary + _told(payload))

    async def _plan_cancel(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            target, others = await _target(ctx, args["event"])
        except (InvalidInput, _Refused) as exc:
            return ToolOutcome.failed(str(exc))
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        whole = bool(args.get("whole_series")) or target.original is None
        payload = {
            "kind": target.cal.kind,
            "calendar": target.cal.ref,
            "key": target.key,
            "original": target.original.isoformat() if target.original and not whole else None,
            "outbox": uuid4().hex,
            **(await _about(ctx, target, others)),
        }
        what = "the whole series of " if whole and target.recurring else ""
        tz = _tz(ctx, args)
        summary = f"cancelled {what}{target.title!r} ({_fmt(target.start, tz)})"
        return ToolOutcome.planned(payload, summary + _told(payload))

    when = {
        "type": "string",
        "description": "ISO date-time, e.g. 2025-06-02T09:00 (the person's zone unless an offset is given)",
    }
    tz_arg = {"type": "string", "description": "IANA zone for times without an offset; default the person's"}
    ref = {"type": "string", "minLength": 3, "description": "the event's ref from list_events"}
    return (
        Tool(
            name="list_events",
            description="List events across all the person's calendars (default: the next 7 days). Each has a ref.",
            parameters={
                "type": "object",
                "properties": {
                    "start": when,
                    "end": when,
                    "days": {"type": "integer", "minimum": 1, "maximum": MAX_DAYS},
                    "timezone": tz_arg,
                },
                "additionalProperties": False,
            },
            handler=_list,
            area=AREA,
        ),
        Tool(
            name="calendar_free_busy",
            description="When the person is busy between two times, across calendars that count as busy.",
            parameters={
                "type": "object",
                "properties": {"start": when, "end": when, "timezone": tz_arg},
                "required": ["start", "end"],
                "additionalProperties": False,
            },
            handler=_free_busy,
            area=AREA,
        ),
        Tool(
            name="create_event",
            description=(
                "Add an event. Default calendar: Pepper's own. Attendees get invitations unless "
                "send_invitations is false; only contacts or the person's own addresses can be invited."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "title": {"type": "string", "minLength": 1, "maxLength": 300},
                    "start": when,
                    "end": when,
                    "duration_minutes": {"type": "integer", "minimum": 1, "maximum": 10080},
                    "timezone": tz_arg,
                    "calendar": {"type": "string", "description": "calendar name or ref; default Pepper's own"},
                    "location": {"type": "string", "maxLength": 500},
                    "description": {"type": "string", "maxLength": 4000},
                    "attendees": {"type": "array", "items": {"type": "string"}, "description": "email addresses"},
                    "recurrence": {"type": "string", "description": "RRULE, e.g. FREQ=WEEKLY;BYDAY=MO;COUNT=10"},
                    "send_invitations": {"type": "boolean"},
                },
                "required": ["title", "start"],
                "additionalProperties": False,
            },
            handler=_plan_create,
            apply=_apply_create,
            after_commit=_after,
            area=AREA,
            writes=True,
            scheduled=(("send_invitations", False),),
            narrowing=(("attendees", Narrowing.fewer()),),
        ),
        Tool(
            name="move_event",
            description=(
                "Move an event (keeps its length unless new_end is given). For a repeating event, only the "
                "listed occurrence moves unless whole_series is true."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "event": ref,
                    "new_start": when,
                    "new_end": when,
                    "whole_series": {"type": "boolean"},
                    "timezone": tz_arg,
                },
                "required": ["event", "new_start"],
                "additionalProperties": False,
            },
            handler=_plan_move,
            apply=_apply_move,
            after_commit=_after,
            area=AREA,
            writes=True,
        ),
        Tool(
            name="cancel_event",
            description="Cancel an event; for a repeating one only that occurrence unless whole_series is true.",
            parameters={
                "type": "object",
                "properties": {"event": ref, "whole_series": {"type": "boolean"}, "timezone": tz_arg},
                "required": ["event"],
                "additionalProperties": False,
            },
            handler=_plan_cancel,
            apply=_apply_cancel,
            after_commit=_after,
            area=AREA,
            writes=True,
        ),
    )


def _told(p: dict[str, Any]) -> str:
    out = ""
    if p["notify"]:
        out += f"; {', '.join(p['notify'])} were told"
    if p["untold"]:
        out += f"; {', '.join(p['untold'])} were NOT told (tell them yourself)"
    return out


def _may_have_left(exc: BaseException) -> bool:
    """Whether a failed outside effect may still have happened: a mail the server may have taken, a
    request cut off after it was sent. A refusal, or a connection that never opened, surely did not."""
    if isinstance(exc, _Unchanged):
        return False
    if isinstance(exc, MailError):
        return exc.maybe_sent
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPError):
        return not isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout))
    return not isinstance(exc, PepperError)


def _failure(effect: str, payload: dict[str, Any], exc: Exception, *, left: bool, changed: bool) -> str:
    """What the call says when its outside effect failed: what is saved, what surely did not
    happen, and what may have."""
    p = payload["plan"]
    if isinstance(exc, _Unchanged):
        exc = exc.cause
    reason = exc.message if isinstance(exc, PepperError) else f"an internal error ({type(exc).__name__})"
    mail = payload.get("mail") or {}
    to = ", ".join(mail.get("to") or p.get("notify") or p.get("attendees") or ())
    if effect == "mail" or changed:
        where = "in Pepper's calendar" if effect == "mail" else "on the CalDAV calendar"
        if left:
            return (
                f"the change is saved {where}, but it is not known whether the mail to {to} went out ({reason}): "
                "check with them before sending it again"
            )
        return f"the change is saved {where}, but the mail to {to} did NOT go out ({reason}): tell them yourself"
    calendar = "Google Calendar" if effect == "google" else "the CalDAV server"
    if left:
        return (
            f"{calendar} did not confirm the change ({reason}): it may or may not have been made, list the events "
            "to check before trying again"
        )
    return f"nothing changed: {calendar} did not take the change ({reason})"


class _Unchanged(Exception):
    """A failure before the change was asked of the remote calendar: surely nothing changed."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


class _Refused(Exception):
    pass
