"""The profile of a call Pepper placed and a person answered (``voice.outbound``).

* **To one of the owner's numbers**: the owner's profile, restricted until the callee proves who
  they are (PIN by keypad or aloud, or a code by text, the same checks and limits as an inbound
  call). Only then do the instructions hold the brief, and the model is asked to give it. Before
  that, it knows only that it called with a message and that the callee must prove who they are.
* **To a number the owner approved for the task** (not the owner's): nobody can prove who they
  are, so the session has no memory, no tools but ``end_call`` (and ``transfer_to_owner`` when the
  owner takes calls put through: the person called wants a word with them), and the brief the
  owner chose to send to that number. A call to one of the owner's own numbers never offers it.

On either, ``send_digits`` presses a menu's keys (``voice.digits``: to the owner's number only
until the callee proved who they are); the call goes on in a new stream of this profile, without
the notice. At the end the attempt's receipt says whether the brief was given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from core.persona import runtime_note_rule
from core.tools.registry import Tool
from voice import digits
from voice.deps import VoiceDeps
from voice.owner_profile import PERSONA, OwnerProfile
from voice.profile import AdmittedCall, CallControls
from voice.transfer import TOOL as TRANSFER

# At the end of the call: (CallSid, how the callee proved who they are or None, whether the
# number is the owner's): ``voice.outbound.OutboundCalls.brief_given``.
Finished = Callable[[str, str | None, bool], Awaitable[None]]

CALLED_RESTRICTED = """You placed this call: Pepper has a scheduled message for the person. Before you can
give it, the callee must prove who they are: they key in their PIN and then the pound key, say their PIN
(pass the digits to verify_pin), or ask for a one-time code by text message (send_code, then check_code).
You do not know the message yet. Never guess or repeat a PIN or code aloud."""

CALLED_VERIFIED = """You placed this call to give the person the message below, the result of their
scheduled task. Give it now, briefly and naturally, then ask if they need anything else.

The message:
{brief}"""

CALLED_OTHER = f"""You are Pepper, a personal assistant, on a phone call you placed for the person you work
for, who asked you to give this message to whoever answers at this number. Speak briefly and naturally.
Give the message, answer nothing about the person beyond it, and end the call politely.
{runtime_note_rule("caller")}

The message:
{{brief}}"""


class OutboundProfile(OwnerProfile):
    route = "outbound"
    medium = "Call Pepper placed"
    verified_reply = "Tell the callee in a few words that they are verified, then give them the message."
    transfer_about = "Put the person you called through to the phone of the person you work for (they asked to)."

    def __init__(
        self, deps: VoiceDeps, call: AdmittedCall, brief: str, *, owner_number: bool, finished: Finished,
        keys: digits.CallKeys | None = None,
    ):  # fmt: skip
        super().__init__(deps, call)
        self.brief = brief
        self.owner_number = owner_number
        self._finished = finished
        self.keys = keys  # send_digits, and the call before this stream (voice.digits)

    @property
    def notice(self) -> str:  # type: ignore[override]
        return "" if self.keys is not None and self.keys.resumed else super().notice

    def attach(self, controls: CallControls) -> None:
        super().attach(controls)
        if self.keys is not None:
            self.registry.add(self.keys.tool(controls))

    def transfer_offered(self) -> bool:
        # Dialling the owner to themselves means nothing: never on a call to the owner's number.
        return not self.owner_number and bool(self._transfer) and not self.returned

    def visible_tools(self) -> list[Tool]:
        if not self.owner_number:
            names = ("end_call", digits.TOOL, TRANSFER) if self.transfer_offered() else ("end_call", digits.TOOL)
            return [t for t in self.registry.all() if t.name in names]
        shown = super().visible_tools()
        return [t for t in shown if t.name != digits.TOOL] if self.trust == "owner_verified" else shown

    def on_listening(self) -> None:
        if self.keys is not None and self.keys.resumed:
            self.controls.spawn("keys-pressed", self.keys.on_listening(self.controls))

    def on_dtmf(self, digit: str) -> None:
        if self.owner_number:  # at another number nobody can become the owner, PIN or not
            super().on_dtmf(digit)

    async def verify_spoken(self, digits: str) -> bool | None:
        return await super().verify_spoken(digits) if self.owner_number else False

    async def instructions(self) -> str:
        await self._load_transfer()
        if not self.owner_number:
            text = CALLED_OTHER.format(brief=self.brief) + self.transfer_notes()
        elif self.trust != "owner_verified":
            text = f"{PERSONA}\n\n{CALLED_RESTRICTED}"
        else:
            return f"{await super().instructions()}\n\n{CALLED_VERIFIED.format(brief=self.brief)}"
        return text if self.keys is None else f"{text}\n\n{self.keys.instructions()}"

    async def finish(self, summary: str, end_reason: str | None) -> None:
        if end_reason == digits.END_REASON:
            return  # the call goes on in a new stream after the keys (voice.digits)
        await self._finished(self._call.call_sid, self.verified_by, self.owner_number)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "outbound": True}
