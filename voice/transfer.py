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

Only the account's own verified number is ever dialled (never a number a caller names). SIP direct
(``voice.sip``) takes only owner calls, never the answering service's, so no SIP call is put through;
a REFER (``live.sessions.refer``) would replace step 2 once answering calls run on SIP.
"""

from __future__ import annotations

import asyncio
import logging
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


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class Transfers:
    def __init__(self, db: Database, *, whisper_url: str, after_url: str, ring_seconds: int = 20):
        self.db = db
        self.whisper_url = whisper_url
        self.after_url = after_url
        self.ring_seconds = ring_seconds

    def tool(self, controls: CallControls, call: AdmittedCall, *, area: str) -> Tool:
        """The call's ``transfer_to_owner`` (in the profile's tool ``area``)."""

        async def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
            return await self._request(controls, call, args)

        return Tool(TOOL, "Put the caller through to the owner's phone (they asked to speak to them).", _PARAMS,
                    handler, area=area)  # fmt: skip

    async def _request(self, controls: CallControls, call: AdmittedCall, args: dict[str, Any]) -> ToolOutcome:
        if controls.closing is not None:
            return ToolOutcome.failed("the call is ending")
        owner = await identity.first_verified_handle(self.db, call.account_id, "phone")
        if owner is None or not call.line_number:
            return ToolOutcome.failed("the owner has no phone number to put the caller through to; take a message")
        if call.caller and owner.value == call.caller:
            return ToolOutcome.failed("the caller is calling from the owner's own number")
        recorded = await records.request(
            self.db, call.call_sid, call.account_id, to_number=owner.value, caller_id=call.line_number,
            caller_name=_clip(args["caller_name"], 80), reason=_clip(args["reason"], 200),
        )  # fmt: skip
        if not recorded:
            return ToolOutcome.failed("this call was already put through once; take a message")
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
        row = await records.get(self.db, parent_sid)
        if row is None or row["status"] != "dialing":
            return twiml.hang_up()
        return twiml.say(
            f"Pepper here. A caller who says they are {row['caller_name']}, calling about: {row['reason']}."
            " Connecting you now."
        )

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
