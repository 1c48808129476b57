"""Who a call is for, decided in code (the TwiML that answers it: ``core.adapters.twilio.twiml``).

* a call to a personal line from a number verified to that line's account, not blocked: the
  owner's session (restricted until the caller proves who they are);
* a forwarded call (``ForwardedFrom``) or a call to an answering line: the answering service;
* anyone else on a personal line: refused politely, or handed to the answering service
  (``unknown_caller``); never the owner's session;
* a caller who sent STOP (blocked for voice), or a stranger who texted STOP to this line: refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from core import identity
from core.errors import InvalidInput
from core.store.queries import Queries

Route = Literal["owner", "answering", "refused", "blocked"]
UnknownCaller = Literal["refuse", "answering"]

REFUSED_TEXT = "Sorry, this number only takes calls from the person it works for. Goodbye."
BLOCKED_TEXT = "Sorry, this number can't take your call. Goodbye."
# A call that reached Pepper over Twilio's voice webhook for a line set to SIP direct (voice.service).
WRONG_TRANSPORT_TEXT = (
    "Sorry, this number is answered over a direct SIP connection and can't take calls this way right now. Goodbye."
)
APOLOGY_TEXT = "Sorry, I lost the connection on my side and have to end the call. Please call again."


@dataclass(frozen=True)
class CallRoute:
    route: Route
    reason: str  # short, fixed words for logs and the call record
    account_id: UUID | None = None
    handle_id: UUID | None = None
    line_number: str | None = None
    caller: str | None = None  # E.164 of a known caller; None otherwise


async def _stopped_texts_to_line(db: Queries, line: str, raw_from: str, region: str) -> bool:
    """A caller who texted STOP to this line (``line_opt_outs``): their calls to it are refused too."""
    from core.records.outbound import line_opted_out

    try:
        number = identity.normalize_phone(raw_from, region)
    except InvalidInput:
        return False
    return await line_opted_out(db, line, number)


async def classify_call(
    db: Queries, form: Mapping[str, str], *, unknown_caller: UnknownCaller = "refuse", default_region: str = "US"
) -> CallRoute:
    line = await identity.find_line(db, form.get("To", ""), default_region=default_region)
    if line is None:
        return CallRoute("refused", "not-a-line")
    handle = await identity.find_handle(db, "phone", form.get("From", ""), default_region=default_region)
    if handle is not None and await identity.is_blocked(db, handle.id, "voice"):
        return CallRoute("blocked", "caller-opted-out", line.account_id, handle.id, line.number)
    if await _stopped_texts_to_line(db, line.number, form.get("From", ""), default_region):
        return CallRoute("blocked", "caller-opted-out-of-line", line.account_id, None, line.number)
    if form.get("ForwardedFrom"):
        return CallRoute("answering", "forwarded", line.account_id, None, line.number)
    if line.kind == "answering":
        return CallRoute("answering", "answering-line", line.account_id, None, line.number)
    if handle is not None and handle.verified and handle.account_id == line.account_id:
        return CallRoute("owner", "verified-caller", line.account_id, handle.id, line.number, handle.value)
    if unknown_caller == "answering":
        return CallRoute("answering", "unknown-caller", line.account_id, None, line.number)
    return CallRoute("refused", "unknown-caller", line.account_id, None, line.number)
