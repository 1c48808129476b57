"""The call service with the answering service in it: forwarded calls and calls to an answering
line are answered (screened first), streamed with a one-time token like the owner's calls, and run
as an :class:`~answering_service.session.AnsweringSession`. Every other route is the voice
package's :class:`~voice.service.CallService`, unchanged.

Screening, in code, before any audio: STOP-blocked callers (voice routing), numbers on the
owner's block list, more than ``max_calls_per_hour`` answering calls from one number in an hour
(every anonymous or withheld caller counts as one number), and more than
``max_line_calls_per_hour`` answering calls on one line in an hour are refused politely. A silent
caller gets one sentence and a hang-up (the session).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from answering_service.notify import OwnerNotifier, SendEmail
from answering_service.rules import load_rules, text_countries
from answering_service.session import AnsweringCall, AnsweringSession
from answering_service.tools import ANSWERING_POLICY
from core import identity
from core.errors import InvalidInput
from core.tools.connectors import Connectors
from core.twilio import media_streams as media
from core.twilio import twiml
from voice import routing
from voice.call import CallSession, OwnerCall, TwilioLink
from voice.routing import CallRoute
from voice.service import CallService, call_service_from_settings
from voice.tokens import consume_token, issue_token

log = logging.getLogger(__name__)

RATE_LIMITED_TEXT = "Sorry, this number has had too many calls from you today. Please try again later. Goodbye."
LINE_BUSY_TEXT = "Sorry, this line cannot take more calls right now. Please try again later. Goodbye."
# What Twilio puts in From for a withheld number (as well as "Anonymous", "Restricted"...).
TWILIO_WITHHELD = frozenset({"+266696687", "+7378742833", "+2562533", "+8656696", "+86282452253"})


async def _rate_verdict(
    conn: Any, account_id: Any, line: str | None, caller: str | None, rules: Any
) -> tuple[str, str | None]:
    """The verdict ("answering" or "refused") and what a refused caller hears. Each caller ID has its own hourly
    count; every anonymous or withheld caller shares one (a withheld number is not a way round
    the limit); and each line has a cap over all callers."""
    recent = await conn.fetchval(
        "SELECT count(*) FROM answering_calls WHERE account_id = $1 AND caller IS NOT DISTINCT FROM $2"
        " AND started_at > now() - interval '1 hour'",
        account_id,
        caller,
    )
    if recent >= rules.max_calls_per_hour:
        return "refused", RATE_LIMITED_TEXT
    on_line = await conn.fetchval(
        "SELECT count(*) FROM calls WHERE account_id = $1 AND line_number IS NOT DISTINCT FROM $2"
        " AND route = 'answering' AND started_at > now() - interval '1 hour'",
        account_id,
        line,
    )
    if on_line >= rules.max_line_calls_per_hour:
        return "refused", LINE_BUSY_TEXT
    return "answering", None


TRANSCRIBED = "This call is transcribed."


class AnsweringCallService(CallService):
    def __init__(
        self,
        *args: Any,
        notifier: OwnerNotifier,
        connectors: Connectors | None = None,
        silence_seconds: float = 15.0,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.notifier = notifier
        self.connectors = connectors
        self.silence_seconds = silence_seconds
        self.answering_gate = self.deps.gate.with_policy(ANSWERING_POLICY)

    # --- The voice webhook -------------------------------------------------------------------

    async def answer(self, form: dict[str, str], *, stream_url: str, action_url: str | None) -> tuple[CallRoute, str]:
        db = self.deps.db
        route = await routing.classify_call(db, form, unknown_caller=self.unknown_caller,
                                            default_region=self.default_region)  # fmt: skip
        if route.route != "answering" or route.account_id is None:
            return await super().answer(form, stream_url=stream_url, action_url=action_url)
        call_sid = form.get("CallSid", "")
        caller = _e164(form.get("From", ""), self.default_region)
        rules = await load_rules(db, route.account_id)
        async with db.transaction() as conn:
            # Screening and recording under one lock per owner: calls ringing at once are counted
            # one after the other, so a burst cannot slip past the limits together.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('answering-screen:' || $1::uuid::text, 0))",
                route.account_id,
            )
            text: str | None
            if caller is not None and caller in rules.blocked_numbers:
                verdict, text = "blocked", routing.BLOCKED_TEXT
            else:
                verdict, text = await _rate_verdict(conn, route.account_id, route.line_number, caller, rules)
            inserted = await conn.fetchval(
                """
                INSERT INTO calls (call_sid, account_id, line_number, route, status)
                VALUES ($1, $2, $3, $4, CASE WHEN $4 = 'answering' THEN 'ringing' ELSE 'refused' END)
                ON CONFLICT (call_sid) DO NOTHING RETURNING true
                """,
                call_sid,
                route.account_id,
                route.line_number,
                verdict,
            )
            if inserted and verdict == "answering":
                await conn.execute(
                    """
                    INSERT INTO answering_calls (call_sid, account_id, caller, forwarded_from, vip)
                    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (call_sid) DO NOTHING
                    """,
                    call_sid,
                    route.account_id,
                    caller,
                    _e164(form.get("ForwardedFrom", ""), self.default_region),
                    caller is not None and caller in rules.vip_numbers,
                )
        log.info("answering call screened: verdict=%s reason=%s", verdict, route.reason)
        if not inserted:
            # A retried webhook: a fresh token only while the call still rings (one check with the
            # owner's calls); a replay once it streamed or ended hangs up.
            refusal = await self.refuse_retried_webhook(call_sid, "answering")
            if refusal is not None:
                return route, refusal
        elif text is not None:
            return dataclasses.replace(route, route=verdict), twiml.say_and_hang_up(text)  # type: ignore[arg-type]
        token = await issue_token(db, call_sid, self.token_ttl)
        return route, twiml.connect_stream(stream_url, token, action_url=action_url, name=f"call-{call_sid[-8:]}")

    # --- The media socket --------------------------------------------------------------------

    async def admit(
        self, first_frames: list[str | bytes], *, signature_ok: bool
    ) -> tuple[media.StreamStart, OwnerCall]:
        start: media.StreamStart | None = None
        for raw in first_frames:
            try:
                frame = media.parse(raw)
                if frame["event"] == "start":
                    start = media.parse_start(frame)
            except media.MalformedFrame:
                continue
        if start is None or not signature_ok:
            return await super().admit(first_frames, signature_ok=signature_ok)
        route = await self.deps.db.fetchval("SELECT route FROM calls WHERE call_sid = $1", start.call_sid)
        if route != "answering":
            return await super().admit(first_frames, signature_ok=signature_ok)
        check = await consume_token(self.deps.db, start.parameters.get("call_token"), start.call_sid)
        if not check.ok:
            await self._refuse(f"media-token-{check.problem}", start)
        row = await self.deps.db.fetchrow(
            "SELECT c.account_id, c.line_number, c.status, c.ended_at, a.caller, a.vip FROM calls c"
            " JOIN answering_calls a ON a.call_sid = c.call_sid WHERE c.call_sid = $1",
            start.call_sid,
        )
        if row is None:
            await self._refuse("media-not-an-answering-call", start)
        await self.refuse_call_over(row, start)
        rules = await load_rules(self.deps.db, row["account_id"])
        call = AnsweringCall(start.call_sid, row["account_id"], None, row["caller"], row["line_number"], rules=rules,
                             vip=row["vip"], text_regions=text_countries(rules, self.default_region))  # fmt: skip
        return start, call

    def open_session(self, link: TwilioLink, start: media.StreamStart, call: OwnerCall) -> CallSession:
        if not isinstance(call, AnsweringCall):
            return super().open_session(link, start, call)
        assert call.rules is not None
        greeting = call.rules.greeting.strip()
        config = dataclasses.replace(self.deps.config, notice=f"{greeting} {TRANSCRIBED}".strip())
        deps = dataclasses.replace(self.deps, gate=self.answering_gate, config=config)
        session = AnsweringSession(deps, link, start, call, notifier=self.notifier, connectors=self.connectors,
                                   silence_seconds=self.silence_seconds)  # fmt: skip
        self.sessions[call.call_sid] = session
        return session


def _e164(raw: str, region: str) -> str | None:
    if not raw or not raw.strip() or raw.strip() in TWILIO_WITHHELD:
        return None
    try:
        return identity.normalize_phone(raw, region)
    except InvalidInput:
        return None  # anonymous or malformed caller ID


def answering_call_service_from_settings(
    settings: Any,
    db: Any,
    *,
    registry: Any,
    gate: Any,
    send_sms: Any,
    send_email: SendEmail | None = None,
    connectors: Connectors | None = None,
    models: Any = None,
) -> AnsweringCallService:
    """The voice call service (see ``voice.service.call_service_from_settings``) with the answering
    service for forwarded calls and answering lines."""
    base = call_service_from_settings(
        settings, db, registry=registry, gate=gate, send_sms=send_sms, models=models, connectors=connectors
    )
    notifier = OwnerNotifier(db, send_sms=send_sms, send_email=send_email, public_url=settings.public_url)
    return AnsweringCallService(
        base.deps,
        unknown_caller=base.unknown_caller,
        default_region=base.default_region,
        token_ttl=base.token_ttl,
        notifier=notifier,
        connectors=connectors,
    )
