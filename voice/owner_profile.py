"""The owner's profile: a call from the account's verified number, restricted until the caller
proves who they are.

* **Restricted until proven.** The session starts ``owner_unverified``: no memory in the
  instructions, only the tools the gate shows an unverified owner (read-only, nothing personal,
  nothing connected), plus the call's own controls. The PIN (keypad, or spoken digits the model
  passes to ``verify_pin``) or a one-time code sent by SMS is checked in code; on success the same
  model session is reconfigured with the memory block and the full tool set. Repeated failures end
  the call and notify the owner. The limits kept across calls are ``voice.verification``'s.
* **Web research** (``core.web.permission``), decided as for a text turn, from the person's own
  words: a verified call sees ``web_research`` when the conversation's web window is open when the
  caller proves who they are, or once an utterance begun after that asks for the web (the tool is
  added at once and the model reconfigured; what was said before verification never counts). A
  call is one turn, so the gate lets it hand off one question per call, and after it the rest of
  the call is an after-web turn (sends become drafts). The caller hears the filler while it runs.
* **Records.** The transcript lands in the person's one conversation as it comes; speech begun
  before verification is recorded as an unverified caller's, and a PIN or code the caller gave
  never reaches the records.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from typing import Any

from core import identity
from core.conversation import UNVERIFIED_CALLER, record_inbound, record_outbound
from core.owner_context import dossier_section, load_owner_context, session_tools
from core.persona import CONFIRM_FIRST, NEVER_PRETEND, RESULT_WORDING, runtime_note_rule
from core.records import calls as call_records
from core.security import record_security_event
from core.tools.connectors import web_window
from core.tools.context import SessionContext
from core.tools.registry import Tool, ToolContext, ToolOutcome, ToolRegistry
from core.web.permission import WEB, asks_for_web
from voice import verification
from voice.deps import VoiceDeps
from voice.profile import AdmittedCall, CallControls, CallProfile, withhold_digits
from voice.transfer import OFFER_NOTE, RETURNED_PASS_ON, RETURNED_PASS_ON_NOTE, asks_to_be_put_through
from voice.transfer import TOOL as TRANSFER

log = logging.getLogger(__name__)

PERSONA = f"""You are Pepper, a personal assistant, on a phone call. Speak briefly and naturally: one or
two short sentences at a time, no lists, no markdown. {NEVER_PRETEND}
Use the tools to look things up or change things; never invent their results. {RESULT_WORDING}
{CONFIRM_FIRST} When a write is done, say in one sentence what changed.
{runtime_note_rule("caller")}"""

RESTRICTED = """The caller has not yet proved who they are, so you cannot see the person's memory or
accounts. They can key in their PIN and then the pound key, say their PIN (pass the digits to
verify_pin), or ask for a one-time code by text message (send_code, then check_code with the digits
they read back). Never guess or repeat a PIN or code aloud."""

PIN_LOCKED_WORDS = (
    "Not checked: the PIN cannot be used on calls for now, after too many wrong tries."
    " Offer to text a one-time code to the caller's phone instead (send_code)."
)
FAILED_NOTICE = "Pepper: someone calling from your number failed to verify and the call was ended."
PIN_LOCKED_NOTICE = (
    "Pepper: too many wrong PINs were tried on calls from your number or to your account in the last hour,"
    " so the PIN is switched off on calls for now. On a call you can still ask for a code texted to this phone."
)

UNATTESTED = """The phone network did not confirm that this call really comes from the person's number
(its caller ID was not fully attested), so the call stays restricted until the caller proves who they are.
Tell the caller this once, briefly, before anything else."""

VERIFIED = """The caller proved who they are: you may use the person's memory and every tool."""

# Owner notices under way: kept here, not among a call's tasks, so they outlive the call.
_NOTICES: set[asyncio.Task[None]] = set()
VERIFY_TOOLS = ("verify_pin", "send_code", "check_code")


class OwnerProfile(CallProfile):
    # What the model is asked to say once the caller keyed in the right PIN.
    verified_reply = "Tell the caller in a few words that they are verified, and ask how you can help."
    # How ``transfer_to_owner`` is described to the model (None: the tool's own words).
    transfer_about: str | None = None

    def __init__(self, deps: VoiceDeps, call: AdmittedCall):
        self.deps = deps
        self.trust = "owner_unverified"
        self.verified_by = None
        self.gate = deps.gate
        self._call = call
        self._account = call.account_id
        self._dtmf: list[str] = []
        self._dtmf_timer: asyncio.TimerHandle | None = None
        self._code: tuple[str, float] | None = None
        self._codes_sent = 0
        self._verify_failures = 0
        self._verify_lock = asyncio.Lock()  # one PIN or code checked at a time
        # Every PIN or code tried (and the code sent), and the speech begun after verification:
        # only that speech keeps its digits in the records, and never these.
        self._secrets: set[str] = set()
        self._spoken_verified: set[str] = set()
        self._connections: frozenset[str] = frozenset()  # the person's, read once they proved who they are
        # Web research on this server (None: none), and the caller's verified words that asked for it.
        self._web = web_window(deps.connectors, deps.registry)
        self._web_words: str | None = None
        self._verstat: str | None = None  # the call's StirVerstat, read once ("" for none)
        # transfer_to_owner (voice.transfer): whether the owner takes calls put through here, read
        # once with the first instructions (None until then: not offered); the caller came back.
        self._transfer: bool | None = None
        self.returned = False

    @property
    def notice(self) -> str:  # type: ignore[override]
        return RETURNED_PASS_ON if self.returned else self.deps.config.notice

    def came_back(self) -> None:
        self.returned = True

    async def _load_transfer(self) -> None:
        if self._transfer is None and self.trust != "owner_verified":  # never offered to the verified owner
            transfers = self.deps.transfers
            self._transfer = transfers is not None and await transfers.offered(self._call)

    def transfer_offered(self) -> bool:
        """``transfer_to_owner`` is shown to a caller who has not proved who they are (someone at
        the owner's other phone), never once they have, and not again after they came back."""
        return bool(self._transfer) and not self.returned and self.trust != "owner_verified"

    def attach(self, controls: CallControls) -> None:
        self.controls = controls
        digits = {"type": "object", "properties": {"digits": {"type": "string", "minLength": 1, "maxLength": 40}},
                  "required": ["digits"], "additionalProperties": False}  # fmt: skip
        empty = {"type": "object", "properties": {}, "additionalProperties": False}
        own: list[Tool] = [
            Tool("verify_pin", "Check the PIN the caller said aloud (digits only).", digits, self._tool_verify_pin,
                 area="call"),
            Tool("send_code", "Text a one-time code to the caller's verified phone number.", empty,
                 self._tool_send_code, area="call"),
            Tool("check_code", "Check the one-time code the caller read back (digits only).", digits,
                 self._tool_check_code, area="call"),
            controls.end_call_tool("call"),
        ]  # fmt: skip
        if self.deps.transfers is not None:
            own.append(self.deps.transfers.tool(controls, self._call, area="call", description=self.transfer_about))
        registry = ToolRegistry(own)
        for tool in self.deps.registry.all():
            if tool.name not in registry:
                registry.add(tool)
        self.registry = registry

    # --- The session -------------------------------------------------------------------------

    def session_context(self) -> SessionContext:
        return SessionContext(
            kind="call",
            trust=self.trust,  # type: ignore[arg-type]
            channel="voice",
            account_id=self._account,
            conversation_id=self.controls.conversation_id,
            turn_id=self.controls.turn_id,
            timezone=self.controls.timezone,
            connections=self._connections,
        )

    def visible_tools(self) -> list[Tool]:
        shown = session_tools(self.registry, self.gate, self.session_context())
        if self.trust == "owner_verified":
            shown = [t for t in shown if t.name not in VERIFY_TOOLS]
        if not self.transfer_offered():
            shown = [t for t in shown if t.name != TRANSFER]
        return shown

    async def delegated(self, words: str) -> str | None:
        # A full-duplex model (SIP direct) has no tools: a task asking to be put through is this
        # profile's, when the transfer is offered; anything else runs as a Pepper turn.
        if not asks_to_be_put_through(words):
            return None
        await self._load_transfer()
        if not self.transfer_offered() or self.deps.transfers is None:
            return None
        outcome = await self.deps.transfers.request(self.controls, self._call, "the caller (no name given)", words)
        return outcome.content

    def transfer_notes(self) -> str:
        """The instructions' lines about putting the caller through, as of now."""
        if self.returned:
            return f"\n\n{RETURNED_PASS_ON_NOTE}"
        return f"\n\n{OFFER_NOTE}" if self.transfer_offered() else ""

    async def instructions(self) -> str:
        await self._load_transfer()
        if self.trust != "owner_verified":
            return f"{PERSONA}\n\n{RESTRICTED}{await self._attestation_note()}{self.transfer_notes()}"
        # The owner's context as a text turn gets it: connections (so the connected tools), the
        # dossier and the memory block, built in core (``core.owner_context``). The call's own lines
        # are left out of the block, as a text turn's own messages are: the model has them already.
        conversation_id = self.controls.conversation_id
        assert conversation_id is not None
        db = self.deps.db
        own = await call_records.call_message_ids(db, conversation_id, self.controls.turn_id, self._call.call_sid)
        context = await load_owner_context(
            db, self._account, conversation_id, self.controls.timezone, self.deps.clock(),
            connectors=self.deps.connectors, memory=self.deps.memory, exclude_message_ids=own, web=self._web,
            text=self._web_words or "",
        )  # fmt: skip
        self._connections = context.connections
        return "\n\n".join([PERSONA, VERIFIED, dossier_section(context.dossier), context.memory])

    async def _attestation_note(self) -> str:
        """For a call whose carrier signed it without attestation A (``StirVerstat`` present, not
        ``TN-Validation-Passed-A``): the caller is told the call stays restricted, and why."""
        if self._call.attested:
            return ""
        if self._verstat is None:
            self._verstat = await call_records.verstat(self.deps.db, self._call.call_sid) or ""
        return f"\n\n{UNATTESTED}" if self._verstat else ""

    # --- What the records keep ----------------------------------------------------------------

    def on_speech_started(self, item_id: str | None) -> None:
        if self.trust == "owner_verified" and item_id:
            self._spoken_verified.add(item_id)

    def caller_text(self, item_id: str, text: str) -> str:
        # A transcript often comes after the reply it started (OpenAI transcribes beside the
        # model), so what counts is when the speech began, not the trust at this moment.
        verified = item_id in self._spoken_verified
        return withhold_digits(text, only=self._secrets if verified else None)

    def on_caller_words(self, item_id: str, text: str) -> None:
        # Only the person's words grant the web: speech begun after they proved who they are.
        if self._web is None or self._web_words is not None or item_id not in self._spoken_verified:
            return
        if not asks_for_web(text):
            return
        self._web_words = text
        if WEB in self._connections:
            return  # the conversation's window had it open already
        # At once: the model's call of the tool may already be on its way (the transcript often
        # comes beside the reply); the model is reconfigured and told in a task of the call.
        self._connections = self._connections | {WEB}
        self.controls.spawn("web-permitted", self._web_permitted())

    async def _web_permitted(self) -> None:
        await self.controls.reconfigure()
        await self.controls.tell_model("The caller asked for the web: web_research is available now, once per call.")

    def pepper_text(self, text: str) -> str:
        # Pepper's side too: a model may read a PIN back. Before verification every run of
        # digits is withheld (the digits may be tried only after this line was said).
        return withhold_digits(text, only=None if self.trust == "owner_unverified" else self._secrets)

    async def record(self, direction: str, item_id: str, text: str) -> None:
        """Into the person's one conversation, line by line."""
        db, call = self.deps.db, self._call
        if direction == "in":
            # Speech begun before the caller proved who they are is an unverified caller's.
            author = None if item_id in self._spoken_verified else UNVERIFIED_CALLER
            await record_inbound(db, call.account_id, "voice", text, provider_message_id=f"{call.call_sid}:{item_id}",
                                 handle_id=call.handle_id, author=author)  # fmt: skip
        else:
            conversation_id = self.controls.conversation_id
            assert conversation_id is not None
            await record_outbound(db, conversation_id, "voice", text, turn_id=self.controls.turn_id)

    def stats(self) -> dict[str, Any]:
        return {"verify_failures": self._verify_failures}

    def stop(self) -> None:
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()

    # --- Verification ------------------------------------------------------------------------

    async def _verified(self, how: str, digits: str) -> None:
        self.trust = "owner_verified"
        self.verified_by = how
        self._secrets.add(digits)
        self._code = None
        self.controls.reconfigure_after_tools()
        log.info("caller verified on a call: method=%s", how)

    async def _failed_verification(self) -> str:
        self._verify_failures += 1
        left = self.deps.config.max_verify_failures - self._verify_failures
        if left > 0:
            return f"That did not match. {left} attempt{'s' if left > 1 else ''} left."
        await record_security_event(self.deps.db, "call-verification-failed", call_sid=self._call.call_sid)
        self._notify_owner_soon(FAILED_NOTICE)
        await self.controls.begin_closing(
            "verification-failed",
            "Tell the caller you could not verify them, so you are ending the call. Say goodbye in one sentence.",
        )
        return "Verification failed too many times; the call is ending."

    def _limits(self) -> dict[str, Any]:
        config, call = self.deps.config, self._call
        return {"attested": call.attested, "per_source": config.pin_failures_per_source,
                "per_account": config.pin_failures_per_account, "window": config.verify_window_seconds}  # fmt: skip

    async def _attempt(
        self, digits: str, *, pin: bool, code: bool, method: str, code_method: str = ""
    ) -> tuple[str, str]:
        """Check one PIN (``pin``) and/or the code waiting (``code``), one check at a time per call
        (concurrent tool calls wait their turn). (verdict, detail): ``verified`` (detail: the method),
        ``already``, ``refused`` (the call is closing or out of tries: nothing checked), ``locked``
        (the PIN path is locked across calls: nothing checked), ``no-code``, or ``wrong``."""
        async with self._verify_lock:
            if self.trust == "owner_verified":
                return "already", "The caller is already verified."
            if self.controls.closing is not None or self._verify_failures >= self.deps.config.max_verify_failures:
                return "refused", "Not checked: the call is ending."
            db, account, call = self.deps.db, self._account, self._call
            code_waiting = code and self._code is not None
            locked = pin and await verification.pin_locked(db, account, call.caller, **self._limits())
            if locked and not code_waiting:
                return "locked", PIN_LOCKED_WORDS
            if not pin and not code_waiting:
                return "no-code", "no code is waiting; use send_code first"
            if digits:
                self._secrets.add(digits)
            if pin and not locked and await identity.verify_pin(db, account, digits):
                await self._verified(method, digits)
                return "verified", method
            if code_waiting:
                matched = self._code_matches(digits)
                self._code = None  # a code is checked once: right, or burnt
                if matched:
                    await self._verified(code_method, digits)
                    return "verified", code_method
            kind = verification.WRONG_PIN if pin and not locked else verification.WRONG_CODE
            limits = self._limits()
            now_locked = await verification.record_wrong(db, account, call.caller, call.call_sid, kind, **limits)
            if now_locked:
                log.warning("the PIN path is locked after repeated wrong PINs")
                self._notify_owner_soon(PIN_LOCKED_NOTICE)
            message = await self._failed_verification()
            return "wrong", f"{message} {PIN_LOCKED_WORDS[len('Not checked: ') :]}" if now_locked else message

    @staticmethod
    def _verdict(verdict: str, detail: str) -> ToolOutcome:
        if verdict == "verified":
            what = "Code" if detail.startswith("sms-code") else "PIN"
            return ToolOutcome.ok(f"{what} correct: the caller is verified. Memory and every tool are now available.")
        if verdict == "already":
            return ToolOutcome.ok(detail)
        return ToolOutcome.failed(detail)

    async def _tool_verify_pin(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        digits = re.sub(r"\D", "", args["digits"])
        return self._verdict(*await self._attempt(digits, pin=True, code=False, method="pin-spoken"))

    async def verify_spoken(self, digits: str) -> bool | None:
        # A full-duplex model's verify task: a code is tried when one is waiting, else the PIN.
        verdict, _ = await self._attempt(digits, pin=True, code=self._code is not None, method="pin-spoken",
                                         code_method="sms-code")  # fmt: skip
        return verdict in ("verified", "already")

    async def _tool_send_code(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        call = self._call
        if self.trust == "owner_verified":
            return ToolOutcome.ok("The caller is already verified.")
        if self.deps.send_sms is None or not call.caller or not call.line_number:
            return ToolOutcome.failed("text messages cannot be sent from this line")
        config = self.deps.config
        async with self._verify_lock:
            if self.trust == "owner_verified":
                return ToolOutcome.ok("The caller is already verified.")
            if self.controls.closing is not None:
                return ToolOutcome.failed("no code was sent: the call is ending")
            if self._codes_sent >= config.codes_per_call:
                return ToolOutcome.failed("no code was sent: this call has had all the codes it can have")
            claim = await verification.claim_code_send(
                self.deps.db, call.account_id, call.caller, call.call_sid, attested=call.attested,
                per_hour=config.codes_per_hour,
            )  # fmt: skip
            if claim is None:
                return ToolOutcome.failed("no code was sent: too many codes were texted in the last hour")
            code = f"{secrets.randbelow(10**6):06d}"
            try:
                await self.deps.send_sms(call.caller, call.line_number, f"Your Pepper call code is {code}.")
            except Exception:
                log.exception("sending a one-time call code failed")
                await verification.release_code_send(self.deps.db, claim)
                return ToolOutcome.failed("the text message could not be sent")
            self._codes_sent += 1
            self._secrets.add(code)
            self._code = (code, time.monotonic() + config.code_ttl_seconds)
        return ToolOutcome.ok("A six-digit code was texted to the caller's phone. Ask them to read it out or key it.")

    def _code_matches(self, digits: str) -> bool:
        if self._code is None or time.monotonic() > self._code[1]:
            return False
        return secrets.compare_digest(digits, self._code[0])

    async def _tool_check_code(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        digits = re.sub(r"\D", "", args["digits"])
        return self._verdict(*await self._attempt(digits, pin=False, code=True, method="", code_method="sms-code"))

    # --- The keypad --------------------------------------------------------------------------

    def on_dtmf(self, digit: str) -> None:
        if self.trust == "owner_verified" or self.controls.closing is not None:
            return
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()
            self._dtmf_timer = None
        if digit == "#":
            self._submit_dtmf()
            return
        if digit.isdigit():
            self._dtmf.append(digit)
        if len(self._dtmf) >= 12:
            self._submit_dtmf()
            return
        self._dtmf_timer = asyncio.get_running_loop().call_later(self.deps.config.dtmf_idle_seconds, self._submit_dtmf)

    def _submit_dtmf(self) -> None:
        if self._dtmf_timer is not None:
            self._dtmf_timer.cancel()
            self._dtmf_timer = None
        digits, self._dtmf = "".join(self._dtmf), []
        if len(digits) >= 4:
            self.controls.spawn("dtmf-check", self._check_dtmf(digits))

    async def _check_dtmf(self, digits: str) -> None:
        verdict, detail = await self._attempt(digits, pin=True, code=True, method="pin-keypad",
                                              code_method="sms-code-keypad")  # fmt: skip
        if verdict in ("already", "refused"):
            return
        event = {"verified": "verified", "wrong": "wrong digits"}.get(verdict, "not checked")
        self.controls.note("keypad", event=event)
        if verdict == "verified":
            await self.controls.reconfigure()
            await self.controls.tell_model("The caller keyed in the right PIN: they are verified.", respond=True,
                                           instructions=self.verified_reply)  # fmt: skip
            return
        if self.controls.closing is None:
            wrong = verdict == "wrong"
            say = (
                "Tell the caller the PIN was wrong, in a few words."
                if wrong
                else "Tell the caller what the note says, in a few words."
            )
            await self.controls.tell_model(f"The caller keyed in {'a wrong' if wrong else 'a'} PIN. {detail}",
                                           respond=True, instructions=say)  # fmt: skip

    # --- Telling the owner ---------------------------------------------------------------------

    def _notify_owner_soon(self, body: str) -> None:
        """Tell the owner, in a task the end of the call does not cancel: a caller who hangs up at
        once must not stop the notice."""
        task = asyncio.get_running_loop().create_task(self._notify_owner(body), name="call-notify-owner")
        _NOTICES.add(task)
        task.add_done_callback(_NOTICES.discard)

    async def _notify_owner(self, body: str) -> None:
        """A text to the number calling: the owner route admits only a number verified to the account."""
        call = self._call
        if self.deps.send_sms is None or not call.caller or not call.line_number:
            return
        try:
            await self.deps.send_sms(call.caller, call.line_number, body)
        except Exception:
            log.exception("could not text the owner about failed verification on a call")


class BrowserOwnerProfile(OwnerProfile):
    """A call from the owner's signed-in web session (``voice.adapters.webrtc``): the browser
    proved who they are when it signed in and sent the session's CSRF token with the offer, so the
    call is verified from its first word (no PIN, no code, no keypad). Everything else is the
    owner's profile: the notice, the gate, the tools, the records. ``on_line`` gets each transcript
    line as it is stored (the page's live transcript)."""

    medium = "Browser call"

    def __init__(self, deps: VoiceDeps, call: AdmittedCall, on_line: Any = None):
        super().__init__(deps, call)
        self.trust = "owner_verified"
        self.verified_by = "web-session"
        self._on_line = on_line

    def on_dtmf(self, digit: str) -> None:
        return None

    async def record(self, direction: str, item_id: str, text: str) -> None:
        await super().record(direction, item_id, text)
        if self._on_line is not None:
            self._on_line(direction, text)
