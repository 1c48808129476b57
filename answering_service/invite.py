"""Calendar invitations to callers who booked, only when the owner turned ``send_invitations`` on.

A booking lands in Pepper's own calendar, so the invitation goes out the way that calendar sends
every invitation: an iCalendar ``REQUEST`` (iMIP, RFC 6047) by Pepper's SMTP account, with the
event's own UID so later updates match. It is sent once per booking, after the booking committed
(the caller heard it confirmed), to the one address the caller gave.

What the caller receives is fixed text about their own appointment: the type, the time and the
owner's name as the owner set it. The organizer is Pepper's mail address, never the owner's own
(a caller is not told the owner's address), and the owner is not copied (the booking is already
in their calendar and they are told about it on their notify channel).
"""

from __future__ import annotations

import logging
from typing import Any

from answering_service.rules import Rules, spoken
from core.records import answering_bookings as bookings
from core.store.queries import Queries
from core.tools.areas.calendar import Attendee, ical
from core.tools.connectors import Connectors
from core.tools.mail import MailError, build_message, send_smtp

log = logging.getLogger(__name__)


async def send_invitations(db: Queries, connectors: Connectors | None, call_sid: str, rules: Rules) -> int:
    """Invite every caller of this call's new bookings who gave an address; returns how many went."""
    if not rules.send_invitations:
        return 0
    rows = await bookings.claim_invitations(db, call_sid)
    sent = 0
    for row in rows:
        error = await _send_one(connectors, rules, row)
        if error is None:
            sent += 1
        else:
            await bookings.invitation_failed(db, row["id"], error)
    return sent


async def _send_one(connectors: Connectors | None, rules: Rules, row: Any) -> str | None:
    if connectors is None or not connectors.smtp_configured:
        log.warning("cannot send a caller's invitation: Pepper's mail is not set up")
        return "mail not set up"
    owner = rules.owner_name or "your appointment"
    title = f"{row['appointment_type'].capitalize()} with {owner}"
    when = spoken(row["starts_at"], rules.zone)
    vevent = ical.build_vevent(
        uid=row["uid"], title=title, start=row["starts_at"], end=row["ends_at"], tzid=rules.timezone,
        description="Booked by phone. To cancel or move it, reply to the confirmation text.",
        attendees=[Attendee(row["caller_email"])], organizer=connectors.smtp_from,
    )  # fmt: skip
    message = build_message(
        from_address=connectors.smtp_from or "", from_name="Pepper", to=[row["caller_email"]], cc=[],
        subject=f"Invitation: {title}, {when}", calendar=ical.wrap(vevent, method="REQUEST"),
        body=f"{title}, {when} ({rules.timezone}).\n\nBooked by phone. To cancel or move it, reply to the"
        " confirmation text.",
    )  # fmt: skip
    try:
        await send_smtp(connectors, message)
    except MailError as exc:
        log.warning("a caller's invitation was not sent: error=%s", exc.code)
        return exc.message
    return None
