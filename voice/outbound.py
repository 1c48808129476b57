"""Calls Pepper places: a scheduled run's result delivered by phone (Twilio REST ``Calls`` with
``MachineDetection=DetectMessageEnd``), answered by a person, a machine or nobody.

* **Who may be called** is decided here, in code, at the point of dialing (:func:`may_call`):
  one of the owner's verified phone numbers, or the one number the owner approved for that task
  (``pepper tasks call-number``, or the task tool in a live owner turn). A number set by a
  scheduled run is stored unapproved and never dialled. A refusal is a receipt and a security
  event, and the Calls request is never made.
* **A person** (``AnsweredBy=human``, or ``unknown``) gets a live session
  (:class:`voice.outbound_profile.OutboundProfile`): restricted until they prove who they are
  (the PIN, as on an inbound call), then the brief.
* **A machine** (``machine_end_*``, ``fax``) gets :data:`VOICEMAIL`, fixed words that hold no
  private detail (never the brief, the task's title, a name or a number), and a hang-up.
* **No answer** (``no-answer``, ``busy``, ``failed``, ``canceled`` before anyone answered) is
  tried once more ``retry_after`` later; after the second, the receipt says so.

Every attempt is a row in ``outbound_calls`` with its receipt (``pepper calls list/show``, and
under the task's runs in ``pepper tasks``). Status callbacks are signature-checked by the gateway,
then deduplicated here on (``CallSid``, ``CallStatus``): a retried callback does nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from core import identity
from core.adapters.twilio import media_streams as media
from core.adapters.twilio import twiml
from core.conversation import conversation_for, record_sent_once
from core.errors import InvalidInput, NotFound, PepperError
from core.records import calls as call_records
from core.records import outbound as records
from core.records import transfers as transfer_records
from core.scheduling import runs
from core.security import record_security_event
from core.store.queries import Queries
from voice.deps import VoiceDeps
from voice.digits import CallKeys
from voice.outbound_profile import OutboundProfile
from voice.profile import AdmittedCall, CallProfile
from voice.tokens import issue_token

log = logging.getLogger(__name__)

VOICEMAIL = "Hi, this is Pepper, your assistant, with a message for you. Please call me back when you can. Goodbye."
HUMAN = frozenset({"human", "unknown"})
NOT_ANSWERED = frozenset({"no-answer", "busy", "failed", "canceled"})
CALL_STATUSES = frozenset({"queued", "initiated", "ringing", "in-progress", "answered", "completed", *NOT_ANSWERED})
_CALL_SID = re.compile(r"^CA[0-9a-f]{32}$")
MAX_ATTEMPTS = 2


class Telephony(Protocol):
    """Twilio's REST API for calls (``core.adapters.twilio.voice_rest.TwilioVoice``)."""

    async def place_call(
        self, *, to: str, from_: str, url: str, status_callback: str, send_digits: str | None = None,
        ring_seconds: int = 25,
    ) -> str: ...  # fmt: skip

    async def redirect(self, call_sid: str, twiml: str) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class OutboundConfig:
    retry_after: timedelta = timedelta(minutes=10)
    poll: float = 5.0
    ring_seconds: int = 25


@dataclass(frozen=True)
class Placed:
    """What :meth:`OutboundCalls.deliver` did: ``status`` as a scheduled delivery reports it
    (``queued``: the call is ringing; ``unavailable``: refused or not set up, so chat)."""

    status: str
    detail: str
    call_sid: str | None = None


async def owner_numbers(db: Queries, account_id: UUID) -> list[str]:
    return [h.value for h in await identity.list_handles(db, account_id) if h.kind == "phone" and h.verified]


async def may_call(db: Queries, account_id: UUID, task_id: int | None, number: str) -> tuple[bool, bool]:
    """(whether ``number`` may be dialled for this task now, whether it is the owner's own):
    the owner's verified numbers, or the number the owner approved for the task."""
    if number in await owner_numbers(db, account_id):
        return True, True
    if task_id is None:
        return False, False
    row = await records.task_call_target(db, task_id, account_id)
    return bool(row and row["call_approved"] and row["call_number"] == number), False


def check_call_form(form: Mapping[str, str]) -> tuple[str, str]:
    """(CallSid, CallStatus) of a Twilio form about a call; raises ``InvalidInput``."""
    call_sid, status = form.get("CallSid") or "", (form.get("CallStatus") or "").lower()
    if not _CALL_SID.match(call_sid):
        raise InvalidInput("CallSid is missing or is not a Twilio call id")
    if status not in CALL_STATUSES:
        raise InvalidInput("CallStatus is missing or unknown")
    return call_sid, status


class OutboundCalls:
    """Places calls and settles them. One per process; any number of processes share the store
    (due retries are claimed with ``FOR UPDATE SKIP LOCKED``)."""

    def __init__(
        self,
        db: Queries,
        telephony: Telephony | None,
        *,
        answer_url: str | None,
        status_url: str | None,
        config: OutboundConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.db = db
        self.telephony = telephony
        self.answer_url = answer_url
        self.status_url = status_url
        self.config = config or OutboundConfig()
        self.clock = clock
        self._sweep: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self.telephony is not None and self.answer_url is not None and self.status_url is not None

    # --- Placing -----------------------------------------------------------------------------

    async def deliver(
        self, account_id: UUID, *, task_id: int | None, run_id: int | None, key: str | None, brief: str,
        purpose: str = "brief",
    ) -> Placed:  # fmt: skip
        """Call the task's number (the approved one, else the owner's first verified number) with
        ``brief``; the first attempt is dialled now, in this task."""
        if not self.ready:
            return Placed("unavailable", "phone calls are not set up (Twilio and PEPPER_PUBLIC_URL)")
        db = self.db
        found = await self._target(account_id, task_id)
        if found is None:
            return Placed("unavailable", "no verified phone number to call")
        target, own = found
        line = await identity.personal_line(db, account_id)
        if line is None:
            return Placed("unavailable", "the account has no personal line to call from")
        attempt_id = await records.add_attempt(
            db, account_id=account_id, task_id=task_id, run_id=run_id, delivery_key=key, purpose=purpose,
            attempt=1, to_number=target, from_number=line.number, owner_number=own, brief=brief,
            dial_at=self.clock(),
        )  # fmt: skip
        if attempt_id is None:
            row = await records.attempt_of(db, key, 1)
            return Placed("queued", "already placed", row["call_sid"] if row else None)
        row = await records.claim_one(db, attempt_id)
        if row is None:
            return Placed("queued", "being placed by another process")
        return await self._dial(row)

    async def _target(self, account_id: UUID, task_id: int | None) -> tuple[str, bool] | None:
        """(the number to call: the task's own if it has one, else the owner's first verified
        number; whether it is the owner's). Whether it may be called is :func:`may_call`'s."""
        numbers = await owner_numbers(self.db, account_id)
        if task_id is not None:
            number = await records.approved_number(self.db, task_id, account_id)
            if number:
                return number, number in numbers
        return (numbers[0], True) if numbers else None

    async def _dial(self, row: Any) -> Placed:
        """Dial one claimed attempt, after checking, here at the point of dialing, that its number may
        be called."""
        db = self.db
        allowed, _ = await may_call(db, row["account_id"], row["task_id"], row["to_number"])
        if not allowed:
            receipt = "refused: the number is neither the owner's nor approved by the owner for this task"
            await records.settle(db, row["id"], status="refused", outcome="refused", receipt=receipt)
            await record_security_event(db, "outbound-call-refused", account_id=str(row["account_id"]),
                                        task_id=str(row["task_id"]))  # fmt: skip
            log.warning("refused to place a call to a number that is not approved: task=%s", row["task_id"])
            return Placed("unavailable", receipt)
        assert self.telephony is not None and self.answer_url and self.status_url
        digits = await records.task_digits(db, row["task_id"]) if row["task_id"] is not None else None
        try:
            sid = await self.telephony.place_call(
                to=row["to_number"], from_=row["from_number"], url=self.answer_url, status_callback=self.status_url,
                ring_seconds=self.config.ring_seconds, send_digits=digits,
            )  # fmt: skip
        except PepperError as exc:
            await records.settle(db, row["id"], status="failed", outcome="failed", receipt=f"not placed: {exc.code}")
            log.error("placing a call failed: %s", exc.code)
            return Placed("failed", exc.code)
        await records.placed(db, row["id"], sid, self.clock())
        return Placed("queued", f"ringing (attempt {row['attempt']})", sid)

    # --- Twilio asks what to do with an answered call -----------------------------------------

    async def answer(self, form: Mapping[str, str], *, stream_url: str, action_url: str | None) -> str:
        """TwiML for a placed call that someone or something answered (``AnsweredBy``)."""
        call_sid = form.get("CallSid") or ""
        db = self.db
        row = await records.by_sid(db, call_sid)
        if row is None:
            return twiml.hang_up()
        answered_by = (form.get("AnsweredBy") or "unknown").lower()
        if answered_by not in HUMAN:
            if await records.first_event(db, call_sid, "answer"):
                receipt = "reached voicemail; left a short message with no details; the brief is in chat"
                await records.answered(db, call_sid, answered_by, "machine", receipt)
                await self._delivery(row, "delivered", receipt)
                await self._to_chat(row, "I left you a voicemail without details")
            return twiml.say_and_hang_up(VOICEMAIL)
        if await records.first_event(db, call_sid, "answer"):
            await records.answered(db, call_sid, answered_by, "human", "answered by a person")
            handle = await identity.find_handle(db, "phone", row["to_number"]) if row["owner_number"] else None
            await call_records.record_call(
                db, call_sid, account_id=row["account_id"], line_number=row["from_number"], caller=row["to_number"],
                handle_id=handle.id if handle else None, route="outbound", attested=False, answered_route="outbound",
            )  # fmt: skip
        state = await call_records.call_state(db, call_sid)
        if state is None or state["ended_at"] is not None or state["status"] != "ringing":
            return twiml.hang_up()
        token = await issue_token(db, call_sid, timedelta(seconds=60))
        return twiml.connect_stream(stream_url, token, action_url=action_url, name=f"call-{call_sid[-8:]}")

    async def admit(self, start: media.StreamStart, row: Any, deps: VoiceDeps) -> tuple[AdmittedCall, CallProfile]:
        """The call and profile for the media stream of a placed call a person answered."""
        attempt = await records.by_sid(self.db, start.call_sid)
        if attempt is None:
            raise NotFound("not a call Pepper placed")
        call = AdmittedCall(start.call_sid, row["account_id"], row["handle_id"], row["caller"], row["line_number"],
                            False)  # fmt: skip
        keys = await CallKeys.load(self.db, call)  # send_digits, and the call before a press
        return call, OutboundProfile(
            deps, call, attempt["brief"], owner_number=attempt["owner_number"], finished=self.brief_given, keys=keys
        )

    async def brief_given(self, call_sid: str, verified_by: str | None, owner_number: bool) -> None:
        """The end of a person's call: its receipt says whether they heard the brief."""
        row = await records.by_sid(self.db, call_sid)
        if row is None:
            return
        if verified_by or not owner_number:
            receipt = "answered by a person" + (f", verified by {verified_by}" if verified_by else "") + "; brief given"
            status = "delivered"
            handed = await transfer_records.get(self.db, call_sid)  # voice.transfer: they asked for the owner
            if handed is not None:
                receipt += "; put through to you" + (", who did not pick up" if handed["status"] == "returned" else "")
        else:
            receipt = "answered, but the callee did not prove who they are: the brief was not given"
            status = "failed"
        await records.settle(self.db, row["id"], status="done", outcome="human", receipt=receipt)
        await self._delivery(row, status, receipt)

    # --- Status callbacks ----------------------------------------------------------------------

    async def status(self, form: Mapping[str, str]) -> str:
        """A status callback: ``acted``, ``duplicate`` or ``not-ours``. Raises ``InvalidInput``."""
        call_sid, status = check_call_form(form)
        db = self.db
        row = await records.by_sid(db, call_sid)
        if row is None:
            return "not-ours"
        if not await records.first_event(db, call_sid, f"status:{status}"):
            return "duplicate"
        if status in NOT_ANSWERED and row["status"] in ("placed", "dialing"):
            await self._not_answered(row, status)
        elif status == "completed" and row["status"] in ("placed", "dialing"):
            # Ended before anyone answered (the AMD gave up): as no answer.
            await self._not_answered(row, "no-answer")
        elif status == "completed" and row["status"] == "answered" and row["outcome"] == "machine":
            await records.settle(db, row["id"], status="done", outcome="machine", receipt=row["receipt"])
        elif status == "completed" and row["status"] == "answered":
            # A person answered; the call's own end (``brief_given``) says whether they heard the
            # brief. Until it does (or if the media stream never started), this stands.
            receipt = "answered, but the call ended before the brief was given"
            # Only if the call's end has not settled it since ``row`` was read: the two may run at
            # once, and the call's end must not be overwritten by this guess.
            if await records.settle_answered(db, row["id"], outcome="human", receipt=receipt):
                await self._delivery(row, "failed", receipt)
        return "acted"

    async def _not_answered(self, row: Any, status: str) -> None:
        db = self.db
        if row["attempt"] < MAX_ATTEMPTS:
            due = self.clock() + self.config.retry_after
            receipt = f"{status}; trying once more after {int(self.config.retry_after.total_seconds())} s"
            await records.settle(db, row["id"], status="done", outcome=status, receipt=receipt)
            await records.add_attempt(
                db, account_id=row["account_id"], task_id=row["task_id"], run_id=row["run_id"],
                delivery_key=row["delivery_key"], purpose=row["purpose"], attempt=row["attempt"] + 1,
                to_number=row["to_number"], from_number=row["from_number"], owner_number=row["owner_number"],
                brief=row["brief"], dial_at=due,
            )  # fmt: skip
            self._wake_later(self.config.retry_after.total_seconds())
            return
        receipt = f"{status} on attempt {row['attempt']} of {MAX_ATTEMPTS}: not calling again; the brief is in chat"
        await records.settle(db, row["id"], status="done", outcome=status, receipt=receipt)
        await self._delivery(row, "failed", receipt)
        await self._to_chat(row, f"I called you {MAX_ATTEMPTS} times and nobody answered")

    async def _to_chat(self, row: Any, why: str) -> None:
        """The brief, in the owner's chat (once), when the call could not give it: only for a call
        to the owner's own number (the brief is theirs), so it is there when they call back."""
        if not row["owner_number"]:
            return
        conversation_id = await conversation_for(self.db, row["account_id"])
        key = f"{row['delivery_key'] or 'call-' + str(row['id'])}#call-fallback"
        body = f"{why}. Here is what I was calling about:\n\n{row['brief']}"
        await record_sent_once(self.db, conversation_id, "web", body, provider_message_id=key,
                               delivery_status="delivered")  # fmt: skip

    async def _delivery(self, row: Any, status: str, detail: str) -> None:
        if row["delivery_key"]:
            await runs.record_delivery(self.db, row["delivery_key"], status, detail, row["call_sid"])

    # --- Retries -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._sweep is None and self.ready:
            self._sweep = asyncio.get_running_loop().create_task(self._loop(), name="pepper-outbound-calls")

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            await asyncio.gather(self._sweep, return_exceptions=True)
            self._sweep = None

    async def aclose(self) -> None:
        await self.stop()
        close = getattr(self.telephony, "close", None)
        if close is not None:
            await close()

    def _wake_later(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(max(0.0, seconds), self._wake.set)

    async def dial_due(self) -> int:
        """Dial every attempt due now; how many were dialled."""
        rows = await records.claim_due(self.db, self.clock(), 20)
        for row in rows:
            await self._dial(row)
        return len(rows)

    async def _loop(self) -> None:
        while True:
            try:
                await self.dial_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("dialing due calls failed; retrying: error=%s", type(exc).__name__, exc_info=True)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.poll)
            except TimeoutError:
                pass
