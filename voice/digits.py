"""Pressing keys on a call Pepper placed: the ``send_digits`` tool, then Twilio ``<Play digits>``.

A Media Stream cannot carry DTMF out, and ``<Play digits>`` is a verb of its own, so a press
swaps the stream, as a caller handed on and back does (``voice.transfer``):

1. The model calls ``send_digits`` (``0-9``, ``*``, ``#``; ``w`` waits half a second; 1 to 32 of
   them: checked by the tool's JSON Schema and again here). The keys are recorded in
   ``call_digits`` with the call's transcript so far, and the stream closes as soon as what the
   model is saying has played.
2. Pepper closing the media socket makes Twilio ask the ``<Connect action>`` (``after_stream``):
   when keys wait for that CallSid they are taken (once: a repeated request plays nothing) and the
   answer is ``<Play digits>`` then a new ``<Connect><Stream>`` with a fresh one-time token for the
   same call. The store holds the keys, so any process may answer the request.
3. The new stream runs the same call (the same ``calls`` row, the same placed attempt and its
   brief). Pepper says no notice there: the model gets the transcript before the press in its
   instructions and a note saying which keys it pressed, and listens for the menu's next prompt.

Offered only on calls Pepper placed (``voice.outbound_profile``): to an approved number always, to
the owner's own number only until the callee proved who they are (a switchboard before the
person). No inbound profile has the tool. ``pepper calls show CALL`` lists every press.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from core.adapters.twilio import twiml
from core.records import digits as records
from core.records import transfers as call_legs
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import CALLER_LABEL, quoted
from voice.profile import AdmittedCall, CallControls
from voice.tokens import issue_token

log = logging.getLogger(__name__)

TOOL = "send_digits"
END_REASON = "digits"  # the end reason of a stream closed to press keys
DIGITS = re.compile(r"^[0-9*#w]{1,32}$")
RECORDS_WAIT = 10.0  # seconds, at most, for the closed stream's records before the new stream opens
CARRIED_LINES = 40  # the last lines of the call carried to the next stream
CARRIED_CHARS = 4000
_PARAMS = {
    "type": "object",
    "properties": {
        "digits": {
            "type": "string",
            "pattern": DIGITS.pattern,
            "description": "the keys to press, in order: 0-9, * and #; w waits half a second (w1 = pause, then 1)",
        },
    },
    "required": ["digits"],
    "additionalProperties": False,
}
BAD_DIGITS = "not pressed: digits may be only 0-9, * and #, with w for a half-second pause, 1 to 32 of them"
PRESSING = "The keys are pressed as soon as you stop speaking. Say nothing more now."
KEYS_TEXT = (
    'If an automated menu answers ("press 1 for ..."), choose the option that reaches the right person'
    " or service and press it with send_digits; after it you keep listening on the same call. Never press"
    " keys a menu did not ask for."
)
PRESSED_NOTE = (
    "You pressed {digits} on the keypad; the call goes on. Listen for what the menu or person says next"
    " and answer that; say nothing before it."
)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def carried_lines(before: Sequence[Mapping[str, Any]], transcript: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The call so far as the next stream is told it: the callee's and Pepper's lines, the last
    :data:`CARRIED_LINES` of them within :data:`CARRIED_CHARS`, and each press (``keys``)."""
    lines: list[dict[str, Any]] = [dict(e) for e in before]
    for entry in transcript:
        role, text = entry.get("role"), entry.get("text")
        if role in ("caller", "pepper") and isinstance(text, str) and text.strip():
            lines.append({"role": role, "text": _clip(text, 500)})
        elif role == "keys" and isinstance(entry.get("digits"), str):
            lines.append({"role": "keys", "digits": entry["digits"]})
    lines = lines[-CARRIED_LINES:]
    while len(lines) > 1 and sum(len(e.get("text", "")) for e in lines) > CARRIED_CHARS:
        lines.pop(0)
    return lines


class CallKeys:
    """``send_digits`` on one stream of a call Pepper placed, and what the stream before it left:
    ``pressed`` (the keys whose press opened this stream, None on the first) and ``carried`` (the
    call's lines until then)."""

    def __init__(self, db: Queries, call: AdmittedCall, *, pressed: str | None = None,
                 carried: Sequence[Mapping[str, Any]] = ()):  # fmt: skip
        self.db = db
        self.call = call
        self.pressed = pressed
        self.carried = list(carried)

    @classmethod
    async def load(cls, db: Queries, call: AdmittedCall) -> CallKeys:
        last = await records.last_played(db, call.call_sid)
        if last is None:
            return cls(db, call)
        return cls(db, call, pressed=last[0], carried=last[1])

    @property
    def resumed(self) -> bool:
        """This stream continues the call after a press (no notice: the far end is mid-menu)."""
        return self.pressed is not None

    def tool(self, controls: CallControls, *, area: str = "call") -> Tool:
        async def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
            return await self._press(controls, args)

        return Tool(TOOL, "Press keys on the phone's keypad (DTMF), for an automated menu on this call.", _PARAMS,
                    handler, area=area)  # fmt: skip

    async def _press(self, controls: CallControls, args: dict[str, Any]) -> ToolOutcome:
        digits = args.get("digits")
        if not isinstance(digits, str) or not DIGITS.match(digits):
            return ToolOutcome.failed(BAD_DIGITS)
        if controls.closing is not None:
            return ToolOutcome.failed("not pressed: the call is ending")
        context = [*carried_lines(self.carried, controls.transcript), {"role": "keys", "digits": digits}]
        if not await records.request(self.db, self.call.call_sid, self.call.account_id, digits, context):
            return ToolOutcome.failed("not pressed: other keys are waiting to be pressed on this call")
        controls.note("keys", digits=digits)
        log.info("pressing keys on a call Pepper placed")
        await controls.begin_closing(END_REASON, None)
        return ToolOutcome.ok(PRESSING)

    def instructions(self) -> str:
        """What the instructions add: how to use the keypad, and the call before this stream."""
        parts = [KEYS_TEXT]
        if self.carried:
            said = []
            for line in self.carried:
                if line.get("role") == "keys":
                    said.append(f"(you pressed {line.get('digits')})")
                else:
                    # Theirs (a menu, a stranger) as the callers' words always are: one quoted
                    # line each, under the label, never free text in the instructions.
                    who = "You" if line.get("role") == "pepper" else "They"
                    said.append(f"{who}: {quoted(str(line.get('text', '')))}")
            parts.append("This call so far, before the keys you pressed; their lines are " + CALLER_LABEL
                         + "\n" + "\n".join(said))  # fmt: skip
        if self.pressed is not None:
            parts.append(PRESSED_NOTE.format(digits=self.pressed))
        return "\n\n".join(parts)

    async def on_listening(self, controls: CallControls) -> None:
        if self.pressed is not None:
            await controls.tell_model(PRESSED_NOTE.format(digits=self.pressed))


class KeyPresses:
    """Answers Twilio's ``<Connect action>`` for a stream closed to press keys. One per process;
    the keys are in the store, so the request may come to any process."""

    def __init__(self, db: Queries, *, stream_url: str, action_url: str, token_ttl: timedelta = timedelta(seconds=60)):
        self.db = db
        self.stream_url = stream_url
        self.action_url = action_url
        self.token_ttl = token_ttl

    async def after_stream(self, call_sid: str) -> str | None:
        """``<Play digits>`` and a new ``<Connect><Stream>`` when keys wait for this call and its
        stream closed to press them (taken once); None otherwise."""
        row = await records.take_pending(self.db, call_sid, END_REASON)
        if row is None:
            return None
        # The closed stream's records are written just after its socket closed; the call is
        # reopened after them, or they would close it again. Twilio waits for this answer.
        for _ in range(int(RECORDS_WAIT / 0.02)):
            if await call_legs.first_leg_recorded(self.db, call_sid):
                break
            await asyncio.sleep(0.02)
        await call_legs.reopen_call(self.db, call_sid)
        token = await issue_token(self.db, call_sid, self.token_ttl)
        log.info("playing keys, then a new stream on the same call")
        return twiml.play_digits_then_stream(row["digits"], self.stream_url, token, action_url=self.action_url,
                                             name=f"call-{call_sid[-8:]}")  # fmt: skip
