"""The call service the gateway drives: answer the voice webhook, admit media streams, run calls.

The gateway owns HTTP and the sockets (routes, signature checks, reading frames); this module owns
what a call means. It never imports the gateway.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from core.security import record_security_event
from core.twilio import media_streams as media
from core.twilio import twiml
from voice import routing
from voice.call import CallSession, OwnerCall, TwilioLink, VoiceDeps
from voice.control import FINAL_STATUSES, record_call_status
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


class CallService:
    def __init__(
        self,
        deps: VoiceDeps,
        *,
        unknown_caller: UnknownCaller = "refuse",
        default_region: str = "US",
        token_ttl: timedelta = timedelta(seconds=60),
    ):
        self.deps = deps
        self.unknown_caller = unknown_caller
        self.default_region = default_region
        self.token_ttl = token_ttl
        self.sessions: dict[str, CallSession] = {}

    # --- The voice webhook -------------------------------------------------------------------

    async def answer(self, form: dict[str, str], *, stream_url: str, action_url: str | None) -> tuple[CallRoute, str]:
        """Classify the call, record it, and return the TwiML that answers it."""
        call_sid = form.get("CallSid", "")
        route = await routing.classify_call(
            self.deps.db, form, unknown_caller=self.unknown_caller, default_region=self.default_region
        )
        inserted = await self.deps.db.fetchval(
            """
            INSERT INTO calls (call_sid, account_id, line_number, caller, handle_id, route, status, attested)
            VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 = 'owner' THEN 'ringing' ELSE 'refused' END, $7)
            ON CONFLICT (call_sid) DO NOTHING RETURNING true
            """,
            call_sid,
            route.account_id,
            route.line_number,
            route.caller,
            route.handle_id,
            route.route,
            form.get("StirVerstat") == ATTESTED,
        )
        log.info("voice call classified: route=%s reason=%s", route.route, route.reason)
        if route.route == "owner" and not inserted:
            refusal = await self.refuse_retried_webhook(call_sid, "owner")
            if refusal is not None:
                return route, refusal
        if route.route == "owner":
            token = await issue_token(self.deps.db, call_sid, self.token_ttl)
            return route, twiml.connect_stream(stream_url, token, action_url=action_url, name=f"call-{call_sid[-8:]}")
        if route.route == "answering":
            # The answering service is its own issue; until it exists, a polite message.
            return route, twiml.say_and_hang_up(routing.ANSWERING_UNAVAILABLE_TEXT)
        if route.route == "blocked":
            return route, twiml.say_and_hang_up(routing.BLOCKED_TEXT)
        return route, twiml.say_and_hang_up(routing.REFUSED_TEXT)

    async def refuse_retried_webhook(self, call_sid: str, route: str) -> str | None:
        """A retried webhook for a call already recorded: ``None`` when it may have a fresh token
        (the call is on ``route`` and still ringing, no stream has run), else the TwiML that hangs
        up. A replay once the call streamed or ended is a security event."""
        existing = await self.deps.db.fetchrow("SELECT route, status, ended_at FROM calls WHERE call_sid = $1",
                                               call_sid)  # fmt: skip
        if existing is None or existing["route"] != route:
            return twiml.hang_up()
        if existing["ended_at"] is not None or existing["status"] not in ("ringing", "refused"):
            log.warning("refused a voice webhook for a call that already streamed or ended")
            await record_security_event(self.deps.db, "voice-webhook-call-over", call_sid=call_sid)
            return twiml.hang_up()
        return None

    async def after_stream(self, call_sid: str) -> str:
        """TwiML once Pepper closed the media socket: an apology if the model failed, else hang up."""
        reason = await self.deps.db.fetchval("SELECT end_reason FROM calls WHERE call_sid = $1", call_sid)
        if reason in ("model-failed", "error"):
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

    async def admit(
        self, first_frames: list[str | bytes], *, signature_ok: bool
    ) -> tuple[media.StreamStart, OwnerCall]:
        """Check a new media stream from its first frames (``connected``, ``start``).

        Raises :class:`StreamRefused` after recording a security event when the upgrade was not
        signed over the public URL, the frames are not a stream start, the one-time token is
        unknown, expired, reused or belongs to another call, or the call already streamed or ended.
        """
        start: media.StreamStart | None = None
        for raw in first_frames:
            try:
                frame = media.parse(raw)
                if frame["event"] == "start":
                    start = media.parse_start(frame)
            except media.MalformedFrame:
                continue
        if not signature_ok:
            await self._refuse("media-signature-invalid", start)
        if start is None:
            await self._refuse("media-no-start", None)
        assert start is not None
        check = await consume_token(self.deps.db, start.parameters.get("call_token"), start.call_sid)
        if not check.ok:
            await self._refuse(f"media-token-{check.problem}", start)
        row = await self.deps.db.fetchrow(
            "SELECT account_id, handle_id, caller, line_number, route, attested, status, ended_at FROM calls"
            " WHERE call_sid = $1",
            start.call_sid,
        )
        if row is None or row["route"] != "owner" or row["account_id"] is None:
            await self._refuse("media-not-an-owner-call", start)
        await self.refuse_call_over(row, start)
        return start, OwnerCall(start.call_sid, row["account_id"], row["handle_id"], row["caller"], row["line_number"],
                                row["attested"])  # fmt: skip

    async def refuse_call_over(self, row: Any, start: media.StreamStart) -> None:
        """Refuse a stream (after its token was consumed) for a call that already streamed or
        ended: ``row`` is its ``calls`` row, with ``status`` and ``ended_at``."""
        if row["ended_at"] is not None or row["status"] != "ringing":
            await self._refuse("media-call-over", start)

    async def _refuse(self, kind: str, start: media.StreamStart | None) -> None:
        log.warning("refused a media stream: reason=%s", kind)
        await record_security_event(self.deps.db, kind, call_sid=start.call_sid if start else None)
        raise StreamRefused(kind)

    def open_session(self, link: TwilioLink, start: media.StreamStart, call: OwnerCall) -> CallSession:
        session = CallSession(self.deps, link, start, call)
        self.sessions[call.call_sid] = session
        return session

    async def run_session(self, session: CallSession) -> None:
        try:
            await session.run()
        finally:
            self.sessions.pop(session.call.call_sid, None)

    async def read_first_frames(self, receive: Any) -> list[str | bytes]:
        """Up to the ``start`` frame (or three frames), or whatever came within ``START_TIMEOUT`` seconds."""
        frames: list[str | bytes] = []
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while len(frames) < 3:
                    raw = await receive()
                    frames.append(raw)
                    try:
                        if media.parse(raw)["event"] == "start":
                            break
                    except media.MalformedFrame:
                        continue
        except TimeoutError:
            pass  # admit() refuses a stream that never started
        return frames

    def hang_up_all(self) -> None:
        for session in list(self.sessions.values()):
            session.hang_up("shutdown")

    async def aclose(self) -> None:
        self.hang_up_all()
        if self.deps.engines is not None:
            await self.deps.engines.aclose()
            return
        close = getattr(self.deps.model, "aclose", None)
        if close is not None:
            await close()


def call_service_from_settings(
    settings: Any, db: Any, *, registry: Any, gate: Any, send_sms: Any, models: Any = None, connectors: Any = None
) -> CallService:
    """The call service with the configured realtime engine (none without its key: calls apologise);
    a line that names another engine gets it, built on its first call. ``models`` is the text model
    service the cascade answers with. Raises EngineUnavailable if the setting names an engine this
    build lacks."""
    from voice.call import VoiceConfig
    from voice.engines import RealtimeEngines

    engines = RealtimeEngines(settings, models=models)
    deps = VoiceDeps(
        db=db, model=engines.get(settings.voice_engine), registry=registry, gate=gate,
        config=VoiceConfig.from_settings(settings), send_sms=send_sms, engines=engines, connectors=connectors,
    )  # fmt: skip
    return CallService(
        deps,
        unknown_caller=settings.voice_unknown_caller,
        default_region=settings.default_region,
        token_ttl=timedelta(seconds=settings.voice_token_ttl_seconds),
    )
