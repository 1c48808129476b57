"""The call service the gateway drives: answer the voice webhook, admit media streams, run calls.

The gateway owns HTTP and the sockets (routes, signature checks, reading frames); this module owns
what a call means. It never imports the gateway, nor the answering service: that comes in as an
:class:`AnsweringLine` (``answering_service.service.AnsweringService``), and gets only the calls
classified for it.

A call is classified once, at its webhook (``voice.routing``), and its route recorded; the media
stream's opening frames are parsed once, and the recorded route picks the call's profile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

from core.adapters.twilio import media_streams as media
from core.adapters.twilio import twiml
from core.models.select import SelectRequest, select_models
from core.records import calls as call_records
from core.security import record_security_event
from core.store import Database
from core.usage.config import DEAD_CALL_MESSAGE, NO_MODEL_CALL_MESSAGE
from core.usage.ledger import usage_tier
from voice import routing
from voice.control import DIED, FINAL_STATUSES, record_call_status
from voice.deps import VoiceConfig, VoiceDeps
from voice.engine import CallEngine, TwilioLink
from voice.owner_profile import OwnerProfile
from voice.profile import AdmittedCall, CallProfile
from voice.routing import CallRoute, UnknownCaller
from voice.tokens import consume_token, issue_token

log = logging.getLogger(__name__)

START_TIMEOUT = 10.0
# Twilio's StirVerstat on a call whose originating carrier vouched that the caller may use the
# number (SHAKEN/STIR attestation A; present only on calls that carry a SHAKEN identity, US only).
ATTESTED = "TN-Validation-Passed-A"


class StreamRefused(Exception):
    """The media socket must be closed with 1008; only a security event was recorded."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class AnsweringLine(Protocol):
    """The answering service, as the call service hands it the calls on the answering route."""

    async def screen(self, route: CallRoute, form: Mapping[str, str]) -> tuple[CallRoute, str | None, bool]:
        """Screen and record a call classified ``answering``: (the route as recorded, what a refused
        caller hears or None to answer it, whether the call was new: False for a retried webhook)."""

    async def admit(self, start: media.StreamStart, row: Any) -> tuple[AdmittedCall, CallProfile] | None:
        """The call and its profile for a stream whose token checked out, on a call recorded on
        the answering route (``row``: its ``calls`` row); None when it is not an answering call."""


@dataclass(frozen=True)
class Admission:
    """A media stream let in: its start, its call and the profile to run it with."""

    start: media.StreamStart
    call: AdmittedCall
    profile: CallProfile


class CallService:
    def __init__(
        self,
        deps: VoiceDeps,
        answering: AnsweringLine,
        *,
        unknown_caller: UnknownCaller = "refuse",
        default_region: str = "US",
        token_ttl: timedelta = timedelta(seconds=60),
    ):
        self.deps = deps
        self.answering = answering
        self.unknown_caller = unknown_caller
        self.default_region = default_region
        self.token_ttl = token_ttl
        self.sessions: dict[str, CallEngine] = {}
        # Calls Pepper places (``voice.outbound.OutboundCalls``), when Twilio and the public URL are set.
        self.outbound: Any = None
        # Handing a caller to the owner (``voice.transfer.Transfers``), when Twilio is set up.
        self.transfers: Any = None
        # Keys pressed on calls Pepper places (``voice.digits.KeyPresses``), when Twilio is set up.
        self.digits: Any = None
        self.sip: Any = None  # voice.sip.SipCalls when calls also come by SIP direct

    # --- The voice webhook -------------------------------------------------------------------

    async def answer(
        self, form: dict[str, str], *, stream_url: str, action_url: str | None,
        on_duplicate: Callable[[], None] | None = None,
    ) -> tuple[CallRoute, str]:  # fmt: skip
        """Classify the call, record it, and return the TwiML that answers it. ``on_duplicate`` is
        called when the call was recorded already (Twilio retried the webhook): it is counted so."""
        call_sid = form.get("CallSid", "")
        db = self.deps.db
        route = await routing.classify_call(db, form, unknown_caller=self.unknown_caller,
                                            default_region=self.default_region)  # fmt: skip
        if route.route in ("owner", "answering") and await self.line_transport(route.line_number) == "sip":
            return route, await self._refuse_on_wrong_transport(call_sid, route)
        if route.route == "answering":
            recorded, text, inserted = await self.answering.screen(route, form)
            if inserted and text is not None:
                return recorded, twiml.say_and_hang_up(text)
        else:
            inserted = await call_records.record_call(
                db, call_sid, account_id=route.account_id, line_number=route.line_number, caller=route.caller,
                handle_id=route.handle_id, route=route.route, attested=form.get("StirVerstat") == ATTESTED,
            )  # fmt: skip
            log.info("voice call classified: route=%s reason=%s", route.route, route.reason)
        if not inserted and on_duplicate is not None:
            on_duplicate()
        if inserted and form.get("StirVerstat"):
            await call_records.set_verstat(db, call_sid, form["StirVerstat"])  # shown with the call's message too
        if route.route == "blocked":
            return route, twiml.say_and_hang_up(routing.BLOCKED_TEXT)
        if route.route == "refused":
            return route, twiml.say_and_hang_up(routing.REFUSED_TEXT)
        if not inserted:
            refusal = await self.refuse_retried_webhook(call_sid, route.route)
            if refusal is not None:
                return route, refusal
        if route.account_id is not None:
            refusal = await self._model_refusal(route.account_id, route.route)
            if refusal is not None:
                return route, twiml.say_and_hang_up(refusal)
        token = await issue_token(db, call_sid, self.token_ttl)
        return route, twiml.connect_stream(stream_url, token, action_url=action_url, name=f"call-{call_sid[-8:]}")

    async def line_transport(self, line_number: str | None) -> str:
        """How calls reach this line: its own ``voice_transport``, else PEPPER_VOICE_TRANSPORT."""
        named = await call_records.line_transport(self.deps.db, line_number) if line_number else None
        return named or self.deps.config.transport

    async def _refuse_on_wrong_transport(self, call_sid: str, route: CallRoute) -> str:
        """A Twilio webhook for a line reached over SIP direct: the number still routes to Pepper's
        voice webhook instead of the Elastic SIP trunk. Refused rather than served over Media
        Streams: the line's setting says where its calls run, and a call that quietly took the other
        path would hide the misrouting. Recorded (refused, ``wrong-transport``) and logged."""
        inserted = await call_records.record_call(
            self.deps.db, call_sid, account_id=route.account_id, line_number=route.line_number, caller=route.caller,
            handle_id=route.handle_id, route="refused", attested=False,
        )  # fmt: skip
        if inserted:
            await call_records.store_end_reason(self.deps.db, call_sid, "wrong-transport")
        log.error("a Twilio voice webhook came for a SIP direct line: route the number to the Elastic SIP trunk,"
                  " or pepper line transport NUMBER media-streams (route=%s)", route.route)  # fmt: skip
        return twiml.say_and_hang_up(routing.WRONG_TRANSPORT_TEXT)

    async def _model_refusal(self, account_id: UUID, route: str) -> str | None:
        """The recorded message for a call that gets no model, or None. The ``model_select`` slot
        is asked once per call with the person's usage tier (call minutes count toward it): a
        fixed reply (the built-in's at the cap: ``dead``) gets the usage-limit message, an empty
        plan the no-model one. The realtime engine itself is the line's (``pepper line engine``):
        the plan's tiers do not choose it."""
        db, deps = self.deps.db, self.deps
        tier = await usage_tier(db, account_id, deps.clock(), deps.usage)
        plan = await select_models(db, SelectRequest(account_id, "voice", "call", tier, deps.usage))
        if plan.reply is not None:
            log.info("call answered with the usage-limit message: route=%s", route)
            return DEAD_CALL_MESSAGE
        if not plan.tiers:
            log.info("call answered with the no-model message: route=%s", route)
            return NO_MODEL_CALL_MESSAGE
        return None

    async def refuse_retried_webhook(self, call_sid: str, route: str) -> str | None:
        """A retried webhook for a call already recorded: ``None`` when it may have a fresh token
        (the call is on ``route`` and still ringing, no stream has run), else the TwiML that hangs
        up. A replay once the call streamed or ended is a security event."""
        existing = await call_records.call_state(self.deps.db, call_sid)
        if existing is None or existing["route"] != route:
            return twiml.hang_up()
        if existing["ended_at"] is not None or existing["status"] not in ("ringing", "refused"):
            log.warning("refused a voice webhook for a call that already streamed or ended")
            await record_security_event(self.deps.db, "voice-webhook-call-over", call_sid=call_sid)
            return twiml.hang_up()
        return None

    async def after_stream(self, call_sid: str) -> str:
        """TwiML once the media socket closed: an apology if the model failed, or if the socket
        closed with no end written (the media process holding the call died: killed, it wrote
        nothing, and the caller would otherwise hear the line go dead); else hang up."""
        if self.digits is not None:
            pressed = await self.digits.after_stream(call_sid)  # keys to press, then the call goes on
            if pressed is not None:
                return pressed
        if self.transfers is not None:
            dial = await self.transfers.after_stream(call_sid)  # the caller is being handed to the owner
            if dial is not None:
                return dial
        reason, cut_short = await call_records.stream_end(self.deps.db, call_sid)
        if cut_short:
            log.warning("a call's media socket closed with no end written; apologising")
        if cut_short or reason in ("model-failed", "error", DIED):
            return twiml.say_and_hang_up(routing.APOLOGY_TEXT)
        return twiml.hang_up()

    async def call_status(self, call_sid: str, status: str) -> None:
        """Twilio's call status callback: a finished call ends its session, in this process at
        once, in another through the process that holds it (``voice.control``)."""
        if status in FINAL_STATUSES:
            session = self.sessions.get(call_sid)
            if session is not None:
                session.hang_up("hangup")
            await record_call_status(self.deps.db, call_sid, status)

    # --- The media socket --------------------------------------------------------------------

    async def read_start(self, receive: Any) -> media.StreamStart | None:
        """The stream's ``start``, read from its first frames (up to three, each parsed once), or
        None when none came within ``START_TIMEOUT`` seconds."""
        try:
            async with asyncio.timeout(START_TIMEOUT):
                for _ in range(3):
                    try:
                        frame = media.parse(await receive())
                        if frame["event"] == "start":
                            return media.parse_start(frame)
                    except media.MalformedFrame:
                        continue
        except TimeoutError:
            pass  # admit() refuses a stream that never started
        return None

    async def admit(self, start: media.StreamStart | None, *, signature_ok: bool) -> Admission:
        """Check a new media stream (its ``start``, from :meth:`read_start`).

        Raises :class:`StreamRefused` after recording a security event when the upgrade was not
        signed over the public URL, the frames are not a stream start, the one-time token is
        unknown, expired, reused or belongs to another call, or the call already streamed or ended.
        """
        if not signature_ok:
            await self._refuse("media-signature-invalid", start)
        if start is None:
            await self._refuse("media-no-start", None)
        assert start is not None
        db = self.deps.db
        check = await consume_token(db, start.parameters.get("call_token"), start.call_sid)
        if not check.ok:
            await self._refuse(f"media-token-{check.problem}", start)
        row = await call_records.call_for_stream(db, start.call_sid)
        admitted: tuple[AdmittedCall, CallProfile] | None = None
        if row is not None and row["route"] == "answering":
            admitted = await self.answering.admit(start, row)
            if admitted is None:
                await self._refuse("media-not-an-answering-call", start)
        elif row is not None and row["route"] == "outbound" and self.outbound is not None:
            # A call Pepper placed (voice.outbound) that a person answered.
            admitted = await self.outbound.admit(start, row, self.deps)
        elif row is None or row["route"] != "owner" or row["account_id"] is None:
            await self._refuse("media-not-an-owner-call", start)
        await self.refuse_call_over(row, start)
        if admitted is None:
            call = AdmittedCall(start.call_sid, row["account_id"], row["handle_id"], row["caller"], row["line_number"],
                                row["attested"])  # fmt: skip
            admitted = call, OwnerProfile(self.deps, call)
        if row["route"] != "answering" and self.transfers is not None and await self.transfers.returned(start.call_sid):
            admitted[1].came_back()  # put through, and the owner did not pick up (the answering service's own)
        return Admission(start, *admitted)

    async def refuse_call_over(self, row: Any, start: media.StreamStart) -> None:
        """Refuse a stream (after its token was consumed) for a call that already streamed or
        ended: ``row`` is its ``calls`` row, with ``status`` and ``ended_at``."""
        if row["ended_at"] is not None or row["status"] != "ringing":
            await self._refuse("media-call-over", start)

    async def _refuse(self, kind: str, start: media.StreamStart | None) -> None:
        log.warning("refused a media stream: reason=%s", kind)
        await record_security_event(self.deps.db, kind, call_sid=start.call_sid if start else None)
        raise StreamRefused(kind)

    def open_session(self, link: TwilioLink, admission: Admission) -> CallEngine:
        session = CallEngine(self.deps, link, admission.start, admission.call, admission.profile)
        self.sessions[admission.call.call_sid] = session
        return session

    async def run_session(self, session: CallEngine) -> None:
        try:
            await session.run()
        finally:
            self.sessions.pop(session.call.call_sid, None)

    def hang_up_all(self) -> None:
        for session in list(self.sessions.values()):
            session.hang_up("shutdown")

    async def aclose(self) -> None:
        self.hang_up_all()
        if self.outbound is not None:
            await self.outbound.aclose()
        if self.sip is not None:
            await self.sip.aclose()
        if self.deps.engines is not None:
            await self.deps.engines.aclose()
            return
        close = getattr(self.deps.model, "aclose", None)
        if close is not None:
            await close()


def voice_deps_from_settings(
    settings: Any, db: Database, *, registry: Any, gate: Any, send_sms: Any, models: Any = None, connectors: Any = None
) -> VoiceDeps:
    """What every call shares, with the configured realtime engine (none without its key: calls
    apologise); a line that names another engine gets it, built on its first call. ``models`` is
    the text model service the cascade answers with. Raises EngineUnavailable if the setting names
    an engine this build lacks."""
    from voice.engines import RealtimeEngines
    from voice.notice import NoticeAudio, local_synthesiser

    engines = RealtimeEngines(settings, models=models)
    notice = None
    if settings.voice_notice_audio == "local" and (synthesise := local_synthesiser()) is not None:
        notice = NoticeAudio(settings.data_dir / "notice-audio", synthesise)
    return VoiceDeps(
        db=db, model=engines.get(settings.voice_engine), registry=registry, gate=gate,
        config=VoiceConfig.from_settings(settings), send_sms=send_sms, engines=engines, connectors=connectors,
        usage=settings.usage, notice_audio=notice,
    )  # fmt: skip
