"""SIP direct: calls that a Twilio Elastic SIP trunk sends straight to OpenAI's SIP endpoint, run
on GPT-Live with Pepper as the backend; media never passes through Pepper.

1. OpenAI posts ``live.transport.incoming`` to ``/openai/live/webhook`` (and, for the same pending
   session, ``realtime.call.incoming``: acknowledged and ignored, its id is the Realtime API's).
   The signature is checked by the SDK (``voice.adapters.gpt_live_sip``); a forged, unsigned or
   stale one is refused with 401 and nothing is recorded; garbage is a 400.
2. The ``webhook-id`` is claimed in ``sip_webhooks``: a redelivery is answered 200 and starts
   nothing (nor does a second webhook for the same session: its ``calls`` row exists).
3. The caller is classified from the SIP ``From`` / ``To`` headers by the same rule as a Twilio
   webhook (``voice.routing.classify_call``): those headers are untrusted metadata, so a number
   verified to the line's account gets the owner's session **restricted until proven** (PIN), and
   anyone else is rejected (``403``; ``603`` for a caller who opted out). The answering service
   runs on Media Streams only: a call it would take is rejected with ``480`` on SIP direct. A call
   to a line whose transport is not ``sip`` (``pepper line transport``; PEPPER_VOICE_TRANSPORT for
   lines that name none) is rejected with ``404``, whoever calls.
4. The session is accepted with the GPT-Live session config (front instructions, voice, client
   delegation) and the call runs in the same call engine as a Media Streams call on GPT-Live
   (``voice.live_call``: delegations as Pepper turns, the PIN checked by Pepper, the notice as the
   session's audio fixture), over the sideband socket. With no media, the link below stands in for
   Twilio's: marks come back at once (Pepper cannot see the caller's playback; the model's own
   timeline, ``…fixture.played`` and its transcript, marks what was said).
5. A caller who asked to be put through to the owner (``voice.transfer``: someone at the owner's
   other phone, before they proved who they are) is handed on when the call closes: a REFER to
   ``tel:`` the owner's number (``live.sessions.refer``) instead of the hang-up.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from core.adapters.twilio import media_streams as media
from core.records import calls as call_records
from core.usage.ledger import usage_tier
from voice import routing
from voice.engine import CallEngine
from voice.live_call import FRONT
from voice.owner_profile import OwnerProfile
from voice.profile import AdmittedCall
from voice.realtime import RealtimeError, SessionConfig

log = logging.getLogger(__name__)

# SIP statuses Pepper rejects with: not the owner's number, opted out, a route SIP direct lacks.
REJECT_UNKNOWN = 403
REJECT_BLOCKED = 603
REJECT_UNAVAILABLE = 480
REJECT_CAPPED = 486  # busy here: the person's usage is at its cap for the day
REJECT_NOT_HERE = 404  # not found: the number's line takes its calls over Media Streams, not SIP
_SIP_USER = re.compile(r"<?(?:sips?|tel):([+0-9A-Za-z().-]{1,40})[@;>]")


def sip_number(header: str | None) -> str:
    """The user part of a SIP ``From``/``To`` header (``"Ada" <sip:+14155552671@host>;tag=x`` ->
    ``+14155552671``); empty when there is none. Untrusted: only ever looked up, never believed."""
    match = _SIP_USER.search(header or "")
    return match.group(1).strip() if match else ""


class SipLink:
    """The call engine's link on a SIP direct call (``voice.engine.TwilioLink``): no media, so
    nothing waits; each mark is echoed at once; ``close`` hangs the SIP call up."""

    backed_up = False
    audio_free = True  # the model's speech is known from its transcript (voice.live_call)

    def __init__(self, control: Any, session_id: str, transfers: Any = None):
        self.control = control
        self.session_id = session_id
        self.transfers = transfers  # voice.transfer.Transfers: a call closed to be put through is referred
        self.engine: CallEngine | None = None
        self._closed = False

    def send(self, text: str) -> None:
        if self._closed or '"event":"mark"' not in text:
            return  # media and clear have no SIP leg to go to: OpenAI plays and stops the audio itself
        asyncio.get_running_loop().call_soon(self._echo, text)

    def _echo(self, text: str) -> None:
        if self.engine is not None and not self._closed:
            self.engine.feed(text)

    def send_many(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.send(text)

    async def drained(self) -> None:
        return None

    async def close(self, code: int = 1000) -> None:
        """Hang the SIP call up, or, when it closed to be put through to the owner
        (``voice.transfer``), REFER it to ``tel:`` their number (hung up if the REFER fails)."""
        if self._closed:
            return
        self._closed = True
        target = await self.transfers.refer_target(self.session_id) if self.transfers is not None else None
        if target is not None:
            try:
                await self.control.refer(self.session_id, target)
                log.info("a SIP call was referred to the owner")
                return
            except RealtimeError:
                log.warning("could not refer a SIP call; hanging up", exc_info=True)
                await self.transfers.refer_failed(self.session_id)
        await self.control.hangup(self.session_id)


class SipCalls:
    """Answers SIP direct webhooks for a :class:`voice.service.CallService` (its deps, the unknown
    caller rule, its sessions) with ``control`` (``voice.adapters.gpt_live_sip.GptLiveSip``)."""

    def __init__(self, service: Any, control: Any):
        self.service = service
        self.control = control
        self._runs: set[asyncio.Task[None]] = set()

    async def incoming(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, str]:
        """One webhook: (HTTP status, a short reason)."""
        from voice.adapters.gpt_live_sip import SipWebhookRefused

        try:
            call = self.control.verify(body, headers)
        except SipWebhookRefused as exc:
            log.warning("refused a SIP webhook: reason=%s", exc.reason)
            return exc.status, exc.reason
        if not call.webhook_id:
            return 400, "no-webhook-id"
        if call.event_type != "live.transport.incoming":
            # The same pending session also posts realtime.call.incoming, whose call_id is for the
            # Realtime API's accept: acknowledged, and the Live event is the one acted on.
            return 200, "ignored"
        deps = self.service.deps
        db = deps.db
        if not await call_records.claim_sip_webhook(db, call.webhook_id, call.session_id):
            return 200, "duplicate"
        form = {"To": sip_number(call.headers.get("to")), "From": sip_number(call.headers.get("from"))}
        route = await routing.classify_call(db, form, unknown_caller=self.service.unknown_caller,
                                            default_region=self.service.default_region)  # fmt: skip
        # A line whose calls come over Media Streams takes none by SIP: the trunk reaches a number
        # this endpoint does not serve (404, recorded refused), and the line's setting stays the truth.
        wrong = route.line_number is not None and await self.service.line_transport(route.line_number) != "sip"
        inserted = await call_records.record_call(
            db, call.session_id, account_id=route.account_id, line_number=route.line_number, caller=route.caller,
            handle_id=route.handle_id, route="refused" if wrong else route.route, attested=False,
        )  # fmt: skip
        if not inserted:
            return 200, "duplicate-session"
        log.info("SIP call classified: route=%s reason=%s", route.route, route.reason)
        if wrong:
            log.warning("a SIP call came for a line on Media Streams: rejected %d (pepper line transport NUMBER sip"
                        " to take its calls over SIP direct)", REJECT_NOT_HERE)  # fmt: skip
            return await self._reject(call.session_id, REJECT_NOT_HERE, "sip-wrong-transport")
        dead = (
            route.account_id is not None and await usage_tier(db, route.account_id, deps.clock(), deps.usage) == "dead"
        )
        if route.route != "owner" or route.account_id is None or dead:
            # A person at the day's cap gets no call (on Media Streams they hear the recorded message).
            by_route = {"blocked": REJECT_BLOCKED, "answering": REJECT_UNAVAILABLE}
            status = REJECT_CAPPED if dead else by_route.get(route.route, REJECT_UNKNOWN)
            return await self._reject(call.session_id, status, "usage-cap" if dead else f"sip-rejected-{route.reason}")
        try:
            await self.control.accept(call.session_id, SessionConfig(FRONT, (), voice=deps.config.voice))
        except RealtimeError:
            log.warning("could not accept a SIP call", exc_info=True)
            await call_records.store_end_reason(db, call.session_id, "model-failed")
            return 502, "accept-failed"
        admitted = AdmittedCall(call.session_id, route.account_id, route.handle_id, route.caller, route.line_number)
        link = SipLink(self.control, call.session_id, deps.transfers)
        start = media.StreamStart(call.session_id, call.session_id, "", {}, "sip")
        engine = CallEngine(deps, link, start, admitted, OwnerProfile(deps, admitted),
                            model=self.control.for_session(call.session_id))  # fmt: skip
        link.engine = engine
        self.service.sessions[call.session_id] = engine
        task = asyncio.get_running_loop().create_task(self.service.run_session(engine),
                                                      name=f"sip-call-{call.session_id[-8:]}")  # fmt: skip
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return 200, "accepted"

    async def _reject(self, session_id: str, status: int, reason: str) -> tuple[int, str]:
        try:
            await self.control.reject(session_id, status)
        except RealtimeError:
            log.warning("could not reject a SIP call", exc_info=True)
            return 502, "reject-failed"
        await call_records.store_end_reason(self.service.deps.db, session_id, reason)
        return 200, "rejected"

    async def aclose(self) -> None:
        for task in list(self._runs):
            task.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)
        await self.control.aclose()


def sip_calls_from_settings(settings: Any, service: Any) -> SipCalls | None:
    """SIP direct for this server, or None when ``OPENAI_API_KEY`` or ``OPENAI_WEBHOOK_SECRET`` is
    missing. Served whenever both are set, whatever ``PEPPER_VOICE_TRANSPORT`` says: a line may be
    set to ``sip`` while the server runs (``pepper line transport``), and the webhook takes calls
    only for lines on ``sip``."""
    if settings.openai_api_key is None or settings.openai_webhook_secret is None:
        if settings.voice_transport == "sip":
            log.warning("PEPPER_VOICE_TRANSPORT=sip needs OPENAI_API_KEY and OPENAI_WEBHOOK_SECRET:"
                        " SIP calls are refused")  # fmt: skip
        return None
    from voice.adapters.gpt_live_sip import GptLiveSip

    control = GptLiveSip(
        api_key=settings.openai_api_key.get_secret_value(),
        webhook_secret=settings.openai_webhook_secret.get_secret_value(),
        model=settings.gpt_live_model,
        base_url=settings.openai_live_api_url or settings.openai_base_url,
        websocket_base_url=settings.gpt_live_url,
    )
    return SipCalls(service, control)
