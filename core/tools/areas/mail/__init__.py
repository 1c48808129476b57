"""Feature area: mail, reading the person's mail. ``mail_search``, ``mail_list_unread``,
``mail_read_thread`` and ``mail_summarise_thread`` read Gmail (the read-only scope), every IMAP
mailbox the person connected (``pepper connect imap``) and Pepper's own inbox, behind one
interface (``reading``). They only read: scheduled runs (the morning brief) may use them, and a
turn that used them holds its sends back (the gate's ``after-web`` policy). Writing mail is the
``email`` area's.
"""

from __future__ import annotations

from core.tools.connectors import Connectors
from core.tools.registry import Tool

from .reading import check_mailbox, connect_imap, make_read_tools

AREA = "mail"


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    return make_read_tools(connectors, AREA)


TOOLS = make_tools(Connectors())

__all__ = ["AREA", "TOOLS", "check_mailbox", "connect_imap", "make_tools"]
