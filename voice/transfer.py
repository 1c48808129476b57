"""Handing a caller to the owner: the ``transfer_to_owner`` tool, then Twilio ``<Dial>``.

1. The model calls ``transfer_to_owner`` (the caller's name and why they call). The transfer is
   recorded and the call closes once Pepper has said it is putting them through.
2. Pepper closing the media socket makes Twilio ask the ``<Connect action>`` (``after_stream``):
   the answer is ``<Dial>`` to the owner's verified number, from the line, with a whisper.
3. The owner picking up hears the whisper first (who is calling and why, as the caller said it),
   then is bridged to the caller.
4. The ``<Dial>`` action: the owner talked to the caller (hang up), or did not pick up within
   ``ring_seconds`` (busy, no answer, failed): the caller comes back to Pepper on the same call,
   a new media stream, and hears "they did not pick up, may I take a message?".

Where it is offered (the owner turned it on: ``pepper answering set --transfer on``; decided in
code, by the tools each profile shows):

* answering calls (``answering_service.profile``), until the caller came back once;
* calls to the owner's line from the owner's number by a caller who has not proved who they are
  (``voice.owner_profile``: someone at the owner's other phone), never once they proved it;
* calls Pepper placed to a number the owner approved for a task (``voice.outbound_profile``: the
  dentist wants a word), never on a call to one of the owner's own numbers.

Only one of the account's own verified numbers is ever dialled (the oldest that is not the number
on the call; never a number a caller names). On SIP direct (``voice.sip``) step 2 is a REFER
(``live.sessions.refer`` to ``tel:`` that number) when the call ends: the SIP trunk hands the call on,
with no whisper, and nothing comes back to Pepper.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from core import identity
from core.adapters.twilio import twiml
from core.records import transfers as records
from core.store import Database
from core.tools.registry import Tool, ToolContext, ToolOutcome
from voice.profile import AdmittedCall, CallControls
from voice.tokens import issue_token

log = logging.getLogger(__name__)

TOOL = "transfer_to_owner"
CONNECTED = frozenset({"completed", "answered"})
RECORDS_WAIT = 10.0  # seconds, at most, for the first stream's records before the caller comes back
RETURNED_NOTICE = "Sorry, they did not pick up. May I take a message?"
RETURNED_NOTE = (
    "The caller asked to speak to the owner; you tried to put them through and the owner did not pick up."
    " Take a message."
)
# Back on a call with no message taking (the owner's line, a call Pepper placed): what the caller
# says is in the owner's record of the call.
RETURNED_PASS_ON = "Sorry, they did not pick up. Is there anything you would like me to pass on?"
RETURNED_PASS_ON_NOTE = (
    "The caller asked to speak to the person you work for; you tried to put them through and they did not"
    " pick up. What the caller says now is kept in that person's record of this call: if they want to leave"
    " a message, listen, and say you will pass it on."
)
OFFER_NOTE = (
    "If they ask to speak to the person you work for in person, you may put them through (transfer_to_owner)"
    " with their name and why they want to talk."
)
_WHISPERS = {
    "answering": "Pepper here. A caller who says they are {name}, calling about: {reason}. Connecting you now.",
    "owner": (
        "Pepper here. Someone calling your Pepper line from one of your own numbers, who has not proved who"
        " they are, says they are {name}, calling about: {reason}. Connecting you now."
    ),
    "outbound": (
        "Pepper here, on the call you asked me to make{task}. {name} would like to talk to you, about: {reason}."
        " Connecting you now."
    ),
}
PUTTING_THROUGH = "Tell the caller in one short sentence that you are putting them through now."
_PARAMS = {
    "type": "object",
    "properties": {
        "caller_name": {"type": "string", "minLength": 1, "maxLength": 80},
        "reason": {"type": "string", "minLength": 1, "maxLength": 200, "description": "why they call, briefly"},
    },
    "required": ["caller_name", "reason"],
    "additionalProperties": False,
}


# On a full-duplex model (GPT-Live: no tools of its own; SIP direct) a delegated task in these
# words asks to be put through (``asks_to_be_put_through``); the profile decides whether it may be.
_PUT_THROUGH = re.compile(
    r"\b(?:put|patch|transfer|connect|forward)\s+(?:me|us|this call|my call)\b|\bput\s+(?:me\s+)?through\b",
    re.IGNORECASE,
)


def asks_to_be_put_through(words: str) -> bool:
    return _PUT_THROUGH.search(words) is not None


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class Transfers:
    def __init__(self, db: Database, *, whisper_url: str, after_url: str, ring_seconds: int = 20):
        self.db = db
        self.whisper_url = whisper_url
        self.after_url = after_url
        self.ring_seconds = ring_seconds

    async def target(self, call: AdmittedCall) -> str | None:
        """The owner's number to put a caller on ``call`` through to: the account's oldest verified
        phone number that is not the number on the call; None when there is none, or the call has
        no line to call from."""
        if not call.line_number:
            return None
        handles = await identity.list_handles(self.db, call.account_id)
        for handle in handles:
            if handle.kind == "phone" and handle.verified and handle.value != call.caller:
                return handle.value
        return None

    async def offered(self, call: AdmittedCall) -> bool:
        """Whether ``transfer_to_owner`` may be offered on ``call``: the owner turned it on and has a
        number to put the caller through to."""
        return await records.transfer_enabled(self.db, call.account_id) and await self.target(call) is not None

    def tool(self, controls: CallControls, call: AdmittedCall, *, area: str, description: str | None = None) -> Tool:
        """The call's ``transfer_to_owner`` (in the profile's tool ``area``)."""

        async def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
            return await self.request(controls, call, args["caller_name"], args["reason"])

        about = description or "Put the caller through to the owner's phone (they asked to speak to them)."
        return Tool(TOOL, about, _PARAMS, handler, area=area)

    async def request(self, controls: CallControls, call: AdmittedCall, caller_name: str, reason: str) -> ToolOutcome:
        """Record the transfer and close the call once Pepper said it is putting them through."""
        if controls.closing is not None:
            return ToolOutcome.failed("the call is ending")
        if not await records.transfer_enabled(self.db, call.account_id):
            return ToolOutcome.failed("the owner does not take calls put through; take a message")
        to_number = await self.target(call)
        if to_number is None or not call.line_number:
            return ToolOutcome.failed("the owner has no other phone number to put the caller through to")
        recorded = await records.request(
            self.db, call.call_sid, call.account_id, to_number=to_number, caller_id=call.line_number,
            caller_name=_clip(caller_name, 80) or "unknown", reason=_clip(reason, 200) or "unknown",
        )  # fmt: skip
        if not recorded:
            return ToolOutcome.failed("this call was already put through once")
        log.info("handing a caller to the owner")
        await controls.begin_closing("transfer", PUTTING_THROUGH)
        return ToolOutcome.ok("Putting the caller through once you have said so.")

    async def after_stream(self, call_sid: str) -> str | None:
        """The ``<Dial>`` for a call whose stream closed to be handed on; None when it was not."""
        row = await records.take_pending(self.db, call_sid)
        if row is None:
            return None
        return twiml.dial(row["to_number"], caller_id=row["caller_id"], ring_seconds=self.ring_seconds,
                          action_url=self.after_url, whisper_url=self.whisper_url)  # fmt: skip

    async def whisper(self, parent_sid: str) -> str:
        """What the owner hears on picking up, before the bridge: who is on the call and why (as the
        caller said it), and for a call Pepper placed, which task it placed it for."""
        row = await records.get(self.db, parent_sid)
        if row is None or row["status"] != "dialing":
            return twiml.hang_up()
        context = await records.whisper_context(self.db, parent_sid)
        route = context["route"] if context is not None and context["route"] in _WHISPERS else "answering"
        title = context["title"] if context is not None else None
        return twiml.say(_WHISPERS[route].format(
            name=row["caller_name"], reason=row["reason"], task=f" for your task {_clip(title, 80)}" if title else ""
        ))  # fmt: skip

    async def refer_target(self, call_sid: str) -> str | None:
        """A SIP direct call's REFER target (``tel:`` the owner's number) once its session closed to
        be handed on; None when it was not (once only)."""
        row = await records.referred(self.db, call_sid)
        return f"tel:{row['to_number']}" if row is not None else None

    async def refer_failed(self, call_sid: str) -> None:
        await records.refer_failed(self.db, call_sid)

    async def after_dial(self, form: Mapping[str, str], *, stream_url: str, action_url: str | None) -> str:
        call_sid = form.get("CallSid") or ""
        dial_status = (form.get("DialCallStatus") or "no-answer").lower()
        connected = dial_status in CONNECTED
        row = await records.dialled(self.db, call_sid, status="connected" if connected else "returned",
                                    dial_status=dial_status)  # fmt: skip
        if row is None or connected:
            return twiml.hang_up()
        log.info("the owner did not pick up a handed-on call; back to Pepper: status=%s", dial_status)
        # The first stream's records are written just after its socket closed; an owner who
        # declines at once can answer before they are. Reopened after them, or they would close
        # the call again. Twilio waits for this answer (up to 15 s), so waiting here is safe.
        for _ in range(int(RECORDS_WAIT / 0.05)):
            if await records.first_leg_recorded(self.db, call_sid):
                break
            await asyncio.sleep(0.05)
        await records.reopen_call(self.db, call_sid)
        token = await issue_token(self.db, call_sid, timedelta(seconds=60))
        return twiml.connect_stream(stream_url, token, action_url=action_url, name=f"call-{call_sid[-8:]}")

    async def returned(self, call_sid: str) -> bool:
        """Whether the call came back to Pepper after the owner did not pick up."""
        row = await records.get(self.db, call_sid)
        return row is not None and row["status"] == "returned"
