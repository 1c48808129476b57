"""Feature area: calendars. Pepper's own calendar in Postgres, plus CalDAV, Google Calendar and
read-only iCalendar feeds.

For other packages (the answering service): :func:`free_busy`, :func:`book` and :func:`lock_bookings`.
"""

from __future__ import annotations

from core.tools.areas.calendar.model import Attendee, Busy, CalendarUnavailable, Event, SlotTaken
from core.tools.areas.calendar.room_times import make_room_tools
from core.tools.areas.calendar.service import Booking, book, free_busy, list_events, lock_bookings
from core.tools.areas.calendar.sources import add_ical_feed, calendars, connect_caldav
from core.tools.areas.calendar.tools import make_tools
from core.tools.connectors import Connectors

TOOLS = make_tools(Connectors())

__all__ = [
    "TOOLS",
    "Attendee",
    "Booking",
    "Busy",
    "CalendarUnavailable",
    "Event",
    "SlotTaken",
    "add_ical_feed",
    "book",
    "calendars",
    "connect_caldav",
    "free_busy",
    "list_events",
    "lock_bookings",
    "make_room_tools",
    "make_tools",
]
