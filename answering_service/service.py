"""The answering service in the call service: the calls ``voice.routing`` classified for it (forwarded
calls, calls to an answering line) are screened and recorded here, streamed with a one-time token
like the owner's calls, and run by the voice call engine with the
:class:`~answering_service.profile.AnsweringProfile`. The voice package's
:class:`~voice.service.CallService` hands them over (:class:`~voice.service.AnsweringLine`); the
owner's calls never come here.

Screening, in code, before any audio: STOP-blocked callers (voice routing), numbers on the
owner's block list, more than ``max_calls_per_hour`` answering calls from one number in an hour
(every anonymous or withheld caller counts as one number), and more than
``max_line_calls_per_hour`` answering calls on one line in an hour are refused politely. A silent
caller gets one sentence and a hang-up (the profile).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from answering_service.profile import AnsweringProfile
from answering_service.rules import load_rules, text_countries
from answering_service.tools import ANSWERING_POLICY
from core import identity
from core.adapters.twilio import media_streams as media
from core.errors import InvalidInput
from core.records import answering as answering_records
from core.store import Database
from core.store.queries import Queries
from core.tools.connectors import Connectors
from core.tools.gate import Gate
from voice import routing
from voice.deps import VoiceDeps
from voice.live_call import Delegate, Settle
from voice.profile import AdmittedCall, CallProfile
from voice.routing import CallRoute
from voice.service import CallService, voice_deps_from_settings

log = logging.getLogger(__name__)

RATE_LIMITED_TEXT = "Sorry, this number has had too many calls from you today. Please try again later. Goodbye."
LINE_BUSY_TEXT = "Sorry, this line cannot take more calls right now. Please try again later. Goodbye."
# What Twilio puts in From for a withheld number (as well as "Anonymous", "Restricted"...).
TWILIO_WITHHELD = frozenset({"+266696687", "+7378742833", "+2562533", "+8656696", "+86282452253"})


async def _rate_verdict(
    conn: Queries, account_id: Any, line: str | None, caller: str | None, rules: Any
) -> tuple[str, str | None]:
    """The verdict ("answering" or "refused") and what a refused caller hears. Each caller ID has its own hourly
    count; every anonymous or withheld caller shares one (a withheld number is not a way round
    the limit); and each line has a cap over all callers."""
    if await answering_records.recent_answering_calls(conn, account_id, caller=caller) >= rules.max_calls_per_hour:
        return "refused", RATE_LIMITED_TEXT
    if await answering_records.recent_answering_calls(conn, account_id, line=line) >= rules.max_line_calls_per_hour:
        return "refused", LINE_BUSY_TEXT
    return "answering", None


class AnsweringService:
    """The answering route of the call service (a :class:`~voice.service.AnsweringLine`)."""

    def __init__(
        self,
        db: Database,
        gate: Gate,
        *,
        default_region: str = "US",
        connectors: Connectors | None = None,
        silence_seconds: float = 15.0,
    ):
        self.db = db
        self.default_region = default_region
        self.connectors = connectors
        self.silence_seconds = silence_seconds
        self.gate = gate.with_policy(ANSWERING_POLICY)
        self.transfers: Any = None  # voice.transfer.Transfers: callers may be put through to the owner

    async def screen(self, route: CallRoute, form: Mapping[str, str]) -> tuple[CallRoute, str | None, bool]:
        db, account_id = self.db, route.account_id
        assert account_id is not None  # an answering route is always a line's
        call_sid = form.get("CallSid", "")
        caller = _e164(form.get("From", ""), self.default_region)
        rules = await load_rules(db, account_id)
        async with db.transaction() as conn:
            # Screening and recording under one lock per owner: calls ringing at once are counted
            # one after the other, so a burst cannot slip past the limits together.
            await answering_records.lock_answering_screen(conn, account_id)
            text: str | None
            if caller is not None and caller in rules.blocked_numbers:
                verdict, text = "blocked", routing.BLOCKED_TEXT
            else:
                verdict, text = await _rate_verdict(conn, account_id, route.line_number, caller, rules)
            inserted = await answering_records.record_answering_call(
                conn, call_sid, account_id=account_id, line_number=route.line_number, verdict=verdict, caller=caller,
                forwarded_from=_e164(form.get("ForwardedFrom", ""), self.default_region),
                vip=caller is not None and caller in rules.vip_numbers,
            )  # fmt: skip
        log.info("answering call screened: verdict=%s reason=%s", verdict, route.reason)
        # A retried webhook (not inserted) gets a fresh token only while the call still rings (one
        # check with the owner's calls); a replay once it streamed or ended hangs up.
        return dataclasses.replace(route, route=verdict), text, inserted  # type: ignore[arg-type]

    async def admit(self, start: media.StreamStart, row: Any) -> tuple[AdmittedCall, CallProfile] | None:
        caller = await answering_records.answering_caller(self.db, start.call_sid)
        if caller is None:
            return None
        call = AdmittedCall(start.call_sid, row["account_id"], None, caller["caller"], row["line_number"])
        rules = await load_rules(self.db, row["account_id"])
        profile = AnsweringProfile(self.db, call, rules, gate=self.gate, vip=caller["vip"],
                                   text_regions=text_countries(rules, self.default_region),
                                   connectors=self.connectors, silence_seconds=self.silence_seconds,
                                   transfers=self.transfers)  # fmt: skip
        if self.transfers is not None and await self.transfers.returned(start.call_sid):
            profile.came_back()
        return call, profile


def _e164(raw: str, region: str) -> str | None:
    if not raw or not raw.strip() or raw.strip() in TWILIO_WITHHELD:
        return None
    try:
        return identity.normalize_phone(raw, region)
    except InvalidInput:
        return None  # anonymous or malformed caller ID


def call_service_from_settings(
    settings: Any,
    db: Database,
    *,
    registry: Any,
    gate: Any,
    send_sms: Any,
    connectors: Connectors | None = None,
    models: Any = None,
    delegate: Delegate | None = None,
    settle: Settle | None = None,
) -> CallService:
    """The voice call service (its engine: ``voice.service.voice_deps_from_settings``) with the
    answering service for forwarded calls and answering lines; ``delegate`` and ``settle`` run a
    full-duplex model's delegated tasks as Pepper turns (``voice.live_call``)."""
    deps: VoiceDeps = voice_deps_from_settings(
        settings, db, registry=registry, gate=gate, send_sms=send_sms, models=models, connectors=connectors
    )
    deps.delegate, deps.settle = delegate, settle
    answering = AnsweringService(db, gate, default_region=settings.default_region, connectors=connectors)
    return CallService(
        deps,
        answering,
        unknown_caller=settings.voice_unknown_caller,
        default_region=settings.default_region,
        token_ttl=timedelta(seconds=settings.voice_token_ttl_seconds),
    )
