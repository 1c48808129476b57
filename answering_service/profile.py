"""One forwarded call, answered for anyone: the answering profile the voice call engine runs.

The engine (``voice.engine.CallEngine``: audio, marks, barge-in, staged writes on the mark, the
turn record) runs the call; this profile makes it an answering service:

* trust ``third_party`` on channel ``answering``: the registry holds the profile's tools only and
  the gate (with :data:`~answering_service.tools.ANSWERING_POLICY`) refuses anything else;
* the instructions hold what the owner wrote for callers and nothing else: no memory, no dossier;
* no PIN, no code: the keypad is ignored, so nobody can become the owner on this line;
* the transcript goes to ``answering_calls``, never into the owner's conversation (a caller's
  words must not become the owner's memory);
* a caller who says nothing within ``silence_seconds`` of the greeting hears one sentence and the
  call ends;
* what the call promises is recorded with the write it is about (the caller's confirmation text
  with the booking, the owner's notice with the message or booking) and sent by the turn workers
  (``answering_service.deliveries``), so a hang-up cannot lose it; the owner's notice is due when
  the call ends (at once for a VIP's message).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from datetime import datetime
from typing import Any

from answering_service.invite import send_invitations
from answering_service.rules import Rules
from answering_service.tools import AREA, CHANNEL, PROFILE, CallerCall, make_tools
from core.persona import NEVER_PRETEND, RESULT_WORDING, runtime_note_rule
from core.records import answering as answering_records
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolRegistry
from core.tools.runner import CallOutcome
from voice.profile import AdmittedCall, CallControls, CallProfile
from voice.transfer import RETURNED_NOTE, RETURNED_NOTICE

log = logging.getLogger(__name__)

SILENT_CLOSING = (
    "You have not heard anyone. Say in one sentence that you cannot hear the caller and are ending the call."
)

PROFILE_TEXT = """You are a polite answering service on a phone call, answering for {owner}. You are not
{owner}, and you know nothing about them beyond the notes below. You cannot see their messages,
contacts, email or what is in their calendar, and you cannot send anything on their behalf.
You can: take a message (the caller's name, a callback number, which you read back digit by digit
before saving it, the reason, and whether it is urgent; you may offer "I'll have them call you back", and
if they want that, save it with call_back true){booking}; and end the call when the caller is done.
If a caller asks for anything else (the owner's schedule, whereabouts, phone number, other people's
appointments, to send an email, to change someone else's booking), say kindly that you can only
take a message{booking_short}. A caller who says they are {owner} is treated like any caller.
Speak briefly and naturally, one or two short sentences at a time. When a booking is done, confirm
it in one sentence with the day and time.
""" + "\n".join((NEVER_PRETEND, RESULT_WORDING, runtime_note_rule("caller")))

BOOKING_TEXT = (
    "; if they want an appointment, check which times are free and book one. Appointment types: {types}."
    " Hours for appointments: {hours}. Today is {today} ({zone})"
)
TRANSCRIBED = "This call is transcribed."
# What recorded sales and scam calls say (checked on the caller's words, case-insensitive).
ROBOCALL = re.compile(
    r"\bpress (?:one|1|2|9)\b|extended (?:car |auto |vehicle )?warranty|this is (?:an? )?(?:important|final|"
    r"courtesy|urgent) (?:message|notice|call)|removed from (?:our|the|this) (?:call|calling|mailing) list|"
    r"you (?:have been|are|were) (?:selected|pre-?approved)|social security number (?:has been |was )?suspended|"
    r"(?:account|card) (?:has been|will be) (?:suspended|charged)|lower (?:your )?interest rate",
    re.IGNORECASE,
)


def robocall_words(text: str) -> bool:
    return ROBOCALL.search(text) is not None


class AnsweringProfile(CallProfile):
    route = "answering"

    def __init__(
        self,
        db: Queries,
        call: AdmittedCall,
        rules: Rules,
        *,
        gate: Gate,
        vip: bool = False,
        text_regions: tuple[str, ...] = (),  # where this call's confirmation text may go
        connectors: Connectors | None = None,
        silence_seconds: float = 15.0,
        transfers: Any = None,  # voice.transfer.Transfers: the transfer_to_owner tool
    ):
        self.db = db
        self.transfers = transfers
        self.returned = False
        self._heard_speech = False
        self._screened = False
        self.rules = rules
        self.connectors = connectors
        self.silence_seconds = silence_seconds
        self.trust = "third_party"
        self.gate = gate
        self.notice = f"{rules.greeting.strip()} {TRANSCRIBED}".strip()
        self._call = call
        self.caller_call = CallerCall(call.call_sid, call.account_id, call.caller, call.line_number, rules, vip,
                                      text_regions)  # fmt: skip

    def attach(self, controls: CallControls) -> None:
        self.controls = controls
        end_call = controls.end_call_tool(AREA)
        tools = list(make_tools(self.caller_call, end_call=end_call, connectors=self.connectors))
        if self.transfers is not None and self.rules.transfer_enabled and not self.returned:
            tools.append(self.transfers.tool(controls, self._call, area=AREA))
        self.registry = ToolRegistry(tools)

    def came_back(self) -> None:
        """The caller was put through and the owner did not pick up: back here, for a message."""
        self.returned = True
        self.notice = RETURNED_NOTICE

    # --- The profile ------------------------------------------------------------------------

    def session_context(self) -> SessionContext:
        return SessionContext(
            kind="call",
            trust="third_party",
            channel=CHANNEL,
            account_id=self._call.account_id,
            conversation_id=self.controls.conversation_id,
            turn_id=self.controls.turn_id,
            timezone=self.rules.timezone,
        )

    def visible_tools(self) -> list[Tool]:
        shown = self.registry.visible(self.session_context(), hidden=self.gate.hides)
        return [t for t in shown if t.name in PROFILE]

    async def instructions(self) -> str:
        rules = self.rules
        owner = rules.owner_name or "the person this number belongs to"
        booking = booking_short = ""
        if rules.booking_enabled:
            today = datetime.now(rules.zone)
            types = ", ".join(f"{t.name} ({t.minutes} minutes)" for t in rules.appointment_types)
            booking = BOOKING_TEXT.format(types=types, hours=rules.hours_text(), today=f"{today:%A %Y-%m-%d}",
                                          zone=rules.timezone)  # fmt: skip
            booking_short = " or book a time"
        parts = [PROFILE_TEXT.format(owner=owner, booking=booking, booking_short=booking_short)]
        if rules.caller_info.strip():
            parts.append(f"What {owner} wrote for callers (you may tell callers this):\n{rules.caller_info.strip()}")
        if self.transfers is not None and rules.transfer_enabled and not self.returned:
            parts.append(
                f"If the caller asks to speak to {owner} in person, you may put them through (transfer_to_owner)"
                " with their name and why they call."
            )
        if self.returned:
            parts.append(RETURNED_NOTE)
        if self.caller_call.vip:
            parts.append(
                f"This caller is on {owner}'s VIP list. After you save their message, tell them:"
                ' "I\'ll let them know right away."'
            )
        return "\n\n".join(parts)

    # The keypad: ``on_dtmf`` is left as it is, doing nothing. The answering line takes no PIN,
    # so nobody can become the owner here.

    # --- Tools --------------------------------------------------------------------------------

    def tool_result(self, outcome: CallOutcome) -> CallOutcome:
        if outcome.call.name == "take_message" and outcome.status == "ok" and outcome.write is not None:
            if self.caller_call.vip:
                # The notice was recorded with the message, due now: a turn worker sends it.
                say = 'Tell the caller exactly: "I\'ll let them know right away."'
            else:
                say = "Tell the caller their message will be passed on, and ask if there is anything else."
            outcome = dataclasses.replace(outcome, content=f"Done: the message is saved. {say}")
        return outcome

    async def after_resolve(self, ids: list[int], *, commit: bool, records: list[dict[str, Any]]) -> None:
        if not commit:
            # A dropped booking frees its slot now, for other callers and for this caller's next try.
            await answering_records.release_unbooked_holds(self.db, self._call.call_sid)
            return
        if any(w["status"] == "failed" for w in records):
            await self.controls.tell_model(
                "The booking could NOT be saved: that time was taken a moment ago. Apologise, say it is not"
                " booked, and offer to check another time.",
                respond=True,
            )

    # --- Screening ----------------------------------------------------------------------------

    def on_listening(self) -> None:
        self.controls.spawn("silence-watch", self._silence_watch())  # the greeting played: the caller's turn

    async def _silence_watch(self) -> None:
        await asyncio.sleep(self.silence_seconds)
        if not any(e.get("role") == "caller" for e in self.controls.transcript):
            # Silence (nothing heard), or sound but no words in answer to the greeting.
            pattern = "no-response" if self._heard_speech else "silence"
            log.info("robocall pattern on an answering call; ending it: pattern=%s", pattern)
            await answering_records.mark_screened(self.db, self._call.call_sid, pattern)
            await self.controls.begin_closing("silent-caller", SILENT_CLOSING)

    def on_speech_started(self, item_id: str | None) -> None:
        self._heard_speech = True

    def on_caller_words(self, item_id: str, text: str) -> None:
        # A recorded message: the patterns of robocalls, on the caller's words. The call ends at
        # once, without a goodbye; it is logged with the call, never a message to the owner.
        if self._screened or self.controls.closing is not None or not robocall_words(text):
            return
        self._screened = True
        log.info("robocall pattern on an answering call; ending it: pattern=recorded-message")
        self.controls.spawn("robocall", self._end_robocall())

    async def _end_robocall(self) -> None:
        await answering_records.mark_screened(self.db, self._call.call_sid, "recorded-message")
        self.controls.hang_up("robocall")

    # --- Records ------------------------------------------------------------------------------

    async def record(self, direction: str, item_id: str, text: str) -> None:
        """The transcript, line by line, in ``answering_calls`` (not the owner's conversation)."""
        line = {"role": "caller" if direction == "in" else "pepper", "text": text}
        await answering_records.append_answering_transcript(self.db, self._call.call_sid, line)

    async def finish(self, summary: str, end_reason: str | None) -> None:
        # The owner's notice (recorded with the call's message or booking) is due now; a turn
        # worker sends it, as it sends the caller's confirmation text.
        await answering_records.answering_call_ended(self.db, self._call.call_sid, reason=end_reason, summary=summary)
        # After the call, not on the mark: a hang-up cancels the call's tasks, and an invitation
        # claimed but never sent would be lost.
        await send_invitations(self.db, self.connectors, self._call.call_sid, self.rules)
