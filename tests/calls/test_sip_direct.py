"""SIP direct (``PEPPER_VOICE_TRANSPORT=sip``): OpenAI's signed webhook for a call its SIP endpoint
took, accepted or rejected through the Live sessions API, the call driven over the sideband socket
(media never passes through Pepper). Loopback peers: the SIP side (REST + signed webhooks), the
GPT-Live server (the sideband), OpenAI's text API behind Pepper's own turns."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from phone_support import (
    LINE,
    NOTICE,
    OWNER,
    PIN,
    PUBLIC,
    STRANGER,
    TOKEN,
    _set_pin,
    call_settings,
    caller_for,
    normalised,
    transcribed,
    until,
)

from answering_service.rules import load_rules, save_rules
from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.twilio_peer import TwilioPeer
from core.usage.ledger import add_usage, set_limits
from gateway.server import running_app
from gateway.webhooks import SIP_INCOMING
from voice.live_call import FRONT
from voice.routing import WRONG_TRANSPORT_TEXT
from voice.testing.gpt_live_peer import GptLivePeer, LiveSession
from voice.testing.gpt_live_sip_peer import GptLiveSipPeer, new_secret, sign_webhook

pytestmark = pytest.mark.slow


@dataclass
class SipLine:
    db: Database
    live: GptLivePeer
    sip: GptLiveSipPeer
    text: OpenAIPeer
    url: str
    http: aiohttp.ClientSession
    services: Any
    twilio: Any = None  # a loopback Twilio caller (voice webhook and media stream)

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        async with self.http.post(self.url, data=body, headers=headers) as response:
            return response.status, (await response.text()).strip()

    async def delegated(self, session: LiveSession, words: str) -> str:
        await session.caller_says(words)
        ident = await session.delegate()
        await self.live.wait_for(lambda: session.results(ident), within=15, what="the delegation's result")
        return session.result_text(ident)


@asynccontextmanager
async def sip_line(db: Database, db_url: str, **extra: Any) -> AsyncIterator[SipLine]:
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await _set_pin(db, ada.id)
    await identity.assign_line(db, LINE, "personal", ada.id)
    secret = new_secret()
    async with (TwilioPeer(auth_token=TOKEN) as twilio, GptLivePeer() as live, GptLiveSipPeer(live, secret) as sip,
                OpenAIPeer() as text):  # fmt: skip
        settings = call_settings(
            db_url, twilio, openai_webhook_secret=secret, openai_live_api_url=sip.base_url,
            gpt_live_url=live.websocket_url, openai_base_url=text.base_url, memory_jobs_interval=0,
            **{"voice_transport": "sip", "voice_notice_audio": "local", **extra},
        )  # fmt: skip
        async with running_app(settings, db) as (app, port), aiohttp.ClientSession() as http:
            line = SipLine(db, live, sip, text, f"http://127.0.0.1:{port}{SIP_INCOMING.path}", http,
                           app.extensions["pepper"])  # fmt: skip
            line.twilio = caller_for(app, port, twilio)
            yield line


def skills_offered(request: Any) -> set[str]:
    for tool in request.body.get("tools") or ():
        if tool.get("name") == "use_skill":
            return set(tool["parameters"]["properties"]["name"]["enum"])
    return set()


async def test_a_sip_call_from_the_owner_s_number_is_accepted_restricted_and_a_spoken_pin_unlocks_it(db, db_url):
    async with sip_line(db, db_url) as line:
        session_id, body, headers = line.sip.incoming(caller=OWNER, line=LINE)
        assert await line.post(body, headers) == (200, "accepted")
        session = await line.sip.accepted(session_id)
        accepted = line.sip.accepts[0]
        # The session config: the live model, Pepper's front instructions, client delegation; no
        # tools and no audio format (SIP negotiates it).
        assert accepted["instructions"] == FRONT and accepted["delegation"] == {"type": "client"}
        assert "tools" not in accepted and "format" not in accepted["audio"]
        await line.live.wait_for(lambda: line.live.sidebands == [session_id], what="the sideband attached")
        # The notice is Pepper's recording played as a fixture; it went to the SIP leg, not to Pepper.
        await line.live.wait_for(lambda: session.fixtures, what="the notice fixture played")
        assert not any(e.get("type") == "session.start" for e in session.events)
        assert len(session.sip_out) > 8000 and not session.appends
        assert normalised(await transcribed(bytes(session.sip_out))) == normalised(NOTICE)

        # Restricted until proven: the agenda asked before the PIN runs without the calendar.
        engine = line.services.calls.sessions[session_id]
        await line.live.wait_for(lambda: engine.listening, what="Pepper taking the caller's words")
        assert engine.trust == "owner_unverified"
        line.text.script(reply_text("I can't see the calendar until you verify."))
        result = await line.delegated(session, "what's on my calendar tomorrow")
        assert result == "I can't see the calendar until you verify."
        assert "calendar" not in skills_offered(line.text.requests[-1])

        # The PIN, spoken: checked by Pepper; the model hears only the verdict.
        assert await line.delegated(session, f"my pin is {' '.join(PIN)}") == "verified"
        line.text.script(reply_tools(("use_skill", {"name": "calendar", "request": "tomorrow"})),
                         reply_text("Tomorrow is clear."))  # fmt: skip
        assert await line.delegated(session, "so what's on tomorrow") == "Tomorrow is clear."
        assert "calendar" in skills_offered(line.text.requests[-2])  # the owner session, same SIP call

        await session.send({"type": "session.closed", "reason": "remote_hangup", "usage": {"seconds": 30}})
        row = await until(lambda: db.fetchrow("SELECT * FROM calls WHERE call_sid = $1 AND summary IS NOT NULL",
                                              session_id), 15, "the call recorded")  # fmt: skip
        assert "caller verified (pin-spoken)" in row["summary"] and row["end_reason"] == "hangup"
        assert PIN not in json.dumps([dict(r) for r in await db.fetch("SELECT body FROM messages")])
        assert "hangup" not in {a for _, a in line.sip.requests}  # the caller hung up: nothing to end


async def test_someone_at_the_owner_s_other_phone_is_referred_to_the_owner_on_sip(db, db_url):
    other = "+14155553333"
    async with sip_line(db, db_url) as line:
        handle = await identity.find_handle(db, "phone", OWNER)
        await identity.add_handle(db, handle.account_id, "phone", other, verified=True)
        rules = await load_rules(db, handle.account_id)
        await save_rules(db, dataclasses.replace(rules, transfer_enabled=True))
        deps = line.services.calls.deps
        deps.config = dataclasses.replace(deps.config, closing_grace=2.0)  # the goodbye's grace, shortened
        session_id, body, headers = line.sip.incoming(caller=other, line=LINE)
        assert await line.post(body, headers) == (200, "accepted")
        session = await line.sip.accepted(session_id)
        engine = line.services.calls.sessions[session_id]
        await line.live.wait_for(lambda: engine.listening, what="Pepper taking the caller's words")
        result = await line.delegated(session, "Hi, it's Charles, could you put me through to Ada please")
        assert "Putting the caller through" in result
        # The call ends once Pepper said so: a REFER to the owner's other verified number, not a hang-up.
        await line.live.wait_for(lambda: line.sip.refers, within=20, what="the REFER")
        assert line.sip.refers == [(session_id, f"tel:{OWNER}")]
        row = await until(lambda: db.fetchrow("SELECT * FROM call_transfers WHERE call_sid = $1", session_id))
        assert row["status"] == "referred" and row["to_number"] == OWNER and "Charles" in row["reason"]
        await until(lambda: db.fetchrow("SELECT 1 FROM calls WHERE call_sid = $1 AND summary IS NOT NULL",
                                        session_id), 15, "the call recorded")  # fmt: skip
        assert [a for s, a in line.sip.requests if s == session_id] == ["accept", "refer"]
        # The verified owner is never offered it: the same words, after the PIN, are a Pepper turn.
        session_id, body, headers = line.sip.incoming(caller=OWNER, line=LINE)
        assert await line.post(body, headers) == (200, "accepted")
        session = await line.sip.accepted(session_id)
        engine = line.services.calls.sessions[session_id]
        await line.live.wait_for(lambda: engine.listening, what="Pepper taking the caller's words")
        assert await line.delegated(session, f"my pin is {' '.join(PIN)}") == "verified"
        line.text.script(reply_text("I can't put you through to yourself."))
        assert await line.delegated(session, "put me through to Ada") == "I can't put you through to yourself."
        await session.send({"type": "session.closed", "reason": "remote_hangup", "usage": {"seconds": 3}})
        await until(lambda: db.fetchrow("SELECT 1 FROM calls WHERE call_sid = $1 AND summary IS NOT NULL",
                                        session_id), 15, "the call recorded")  # fmt: skip
        assert len(line.sip.refers) == 1


async def test_forged_garbage_duplicate_and_unknown_sip_webhooks(db, db_url):
    async with sip_line(db, db_url) as line:
        # Forged: signed with another secret. Refused, and nothing recorded or asked of OpenAI.
        _, body, headers = line.sip.incoming(caller=OWNER, line=LINE, secret=new_secret())
        assert (await line.post(body, headers))[0] == 401
        # Stale: a real signature ten minutes old (a replay).
        _, body, headers = line.sip.incoming(caller=OWNER, line=LINE, timestamp=0)
        assert (await line.post(body, headers))[0] == 401
        # Garbage: unsigned, signed but not JSON, signed but not an incoming call.
        assert (await line.post(b"\xff\x00garbage", {"content-type": "application/json"}))[0] == 401
        wid, ts = "wh_garbage", int(time.time())
        nul = json.dumps({"type": "live.transport.incoming", "data": {"session_id": "live_\u0000x", "sip_headers": []}})
        for text in ("not json", json.dumps({"type": "batch.completed", "data": {}}), json.dumps([1, 2]), nul):
            signed = {"webhook-id": wid, "webhook-timestamp": str(ts),
                      "webhook-signature": sign_webhook(line.sip.secret, wid, ts, text)}  # fmt: skip
            assert (await line.post(text.encode(), signed))[0] == 400
        assert await db.fetchval("SELECT count(*) FROM calls") == 0
        assert await db.fetchval("SELECT count(*) FROM sip_webhooks") == 0
        assert line.sip.requests == []

        # The Realtime API's event for a pending call is acknowledged and not acted on.
        _, body, headers = line.sip.incoming(caller=OWNER, line=LINE, event_type="realtime.call.incoming")
        assert await line.post(body, headers) == (200, "ignored")
        assert line.sip.requests == []

        # A redelivered webhook (same webhook-id) starts one call.
        session_id, body, headers = line.sip.incoming(caller=OWNER, line=LINE)
        assert await line.post(body, headers) == (200, "accepted")
        assert await line.post(body, headers) == (200, "duplicate")
        assert [a for s, a in line.sip.requests if s == session_id] == ["accept"]
        assert await db.fetchval("SELECT count(*) FROM calls") == 1

        # An unknown caller (untrusted SIP From) is rejected; a forged From cannot name the owner's
        # line as the caller's own: the number is only looked up.
        stranger, body, headers = line.sip.incoming(caller=STRANGER, line=LINE)
        assert await line.post(body, headers) == (200, "rejected")
        assert line.sip.answered[stranger] == "rejected:403"
        row = await db.fetchrow("SELECT route, status FROM calls WHERE call_sid = $1", stranger)
        assert row["route"] == "refused" and stranger not in line.live.sidebands

        # The owner at the day's usage cap: rejected (486), no session started.
        account = await db.fetchval("SELECT account_id FROM calls WHERE call_sid = $1", session_id)
        await set_limits(db, account, tokens=100, cost=None, minutes=None)
        await add_usage(db, account, datetime.now(UTC), tokens=100)
        capped, body, headers = line.sip.incoming(caller=OWNER, line=LINE)
        assert await line.post(body, headers) == (200, "rejected")
        assert line.sip.answered[capped] == "rejected:486" and capped not in line.live.sidebands


SIP_LINE = "+14155550102"


async def test_two_lines_on_one_server_each_reached_over_its_own_transport_and_refused_over_the_other(db, db_url):
    """The server's default is Media Streams; one line says ``sip``. Each line answers its own way,
    a call over the other transport is refused (404 on SIP, a spoken refusal on Twilio), and a
    line's setting changed while the server runs takes effect on the next call."""
    async with sip_line(db, db_url, voice_transport="media-streams", voice_engine="gpt-live",
                        voice_notice_audio="model") as line:  # fmt: skip
        account = await db.fetchval("SELECT account_id FROM phone_lines WHERE number = $1", LINE)
        await identity.assign_line(db, SIP_LINE, "personal", account)
        await identity.set_line_transport(db, SIP_LINE, "sip")

        # The SIP line over SIP: accepted, driven over the sideband.
        over_sip, body, headers = line.sip.incoming(caller=OWNER, line=SIP_LINE)
        assert await line.post(body, headers) == (200, "accepted")
        await line.live.wait_for(lambda: over_sip in line.live.sidebands, what="the sideband attached")
        # The Media Streams line over Twilio: a stream to Pepper, a GPT-Live session Pepper starts.
        answer = await line.twilio.dial(from_=OWNER, to=LINE)
        assert answer.connected, answer.twiml
        async with line.twilio.media(answer):
            session = await line.live.next_session(1)
            assert any(e.get("type") == "session.start" for e in session.events)
        assert over_sip in line.live.sip_sessions and line.live.sidebands == [over_sip]

        # The Media Streams line over SIP: rejected with 404, recorded refused, nothing started.
        wrong, body, headers = line.sip.incoming(caller=OWNER, line=LINE)
        assert await line.post(body, headers) == (200, "rejected")
        assert line.sip.answered[wrong] == "rejected:404" and wrong not in line.live.sidebands
        row = await db.fetchrow("SELECT route, status, end_reason FROM calls WHERE call_sid = $1", wrong)
        assert dict(row) == {"route": "refused", "status": "refused", "end_reason": "sip-wrong-transport"}
        # The SIP line over Twilio: told so and hung up, no stream; a retried webhook the same, once recorded.
        refused = await line.twilio.dial(from_=OWNER, to=SIP_LINE)
        assert not refused.connected and refused.says == [WRONG_TRANSPORT_TEXT]
        again = await line.twilio.dial(from_=OWNER, to=SIP_LINE, call_sid=refused.call_sid)
        assert not again.connected and again.says == [WRONG_TRANSPORT_TEXT]
        rows = await db.fetch("SELECT route, end_reason FROM calls WHERE call_sid = $1", refused.call_sid)
        assert [dict(r) for r in rows] == [{"route": "refused", "end_reason": "wrong-transport"}]
        assert len(line.live.sessions) == 2  # neither refusal reached the model

        # Back to the default (Media Streams) while the server runs: SIP calls to it are refused now.
        await identity.set_line_transport(db, SIP_LINE, None)
        late, body, headers = line.sip.incoming(caller=OWNER, line=SIP_LINE)
        assert await line.post(body, headers) == (200, "rejected")
        assert line.sip.answered[late] == "rejected:404"


async def test_the_sip_webhook_is_served_whenever_its_keys_are_set_and_only_then():
    from voice.sip import sip_calls_from_settings

    service = object()
    assert sip_calls_from_settings(Settings(openai_api_key="sk-x", openai_webhook_secret=None), service) is None
    both = sip_calls_from_settings(Settings(openai_api_key="sk-x", openai_webhook_secret=new_secret()), service)
    assert both is not None and both.service is service  # on a media-streams server too: a line may say sip
    await both.aclose()


async def test_a_refer_reaches_openai_once_with_its_target_and_one_refused_hangs_the_call_up(db):
    from voice.adapters.gpt_live_sip import GptLiveSip, SipControlError
    from voice.realtime import SessionConfig
    from voice.sip import SipLink
    from voice.transfer import Transfers

    secret = new_secret()
    async with GptLivePeer() as live, GptLiveSipPeer(live, secret) as sip:
        control = GptLiveSip(api_key="sk-test", webhook_secret=secret, base_url=sip.base_url,
                             websocket_base_url=live.websocket_url)  # fmt: skip
        try:
            session_id, _, _ = sip.incoming(caller=OWNER, line=LINE)
            await control.accept(session_id, SessionConfig(FRONT, (), voice="marin"))
            for bad_session, target in ((session_id, ""), (session_id, "   "), ("live_nobody", f"tel:{OWNER}")):
                with pytest.raises(SipControlError):
                    await control.refer(bad_session, target)
            assert sip.refers == []
            await control.refer(session_id, f"tel:{OWNER}")
            assert sip.refers == [(session_id, f"tel:{OWNER}")]
            with pytest.raises(SipControlError):  # a second REFER of the same call: it has left
                await control.refer(session_id, f"tel:{OWNER}")
            assert len(sip.refers) == 1

            # A call closed to be put through whose REFER OpenAI refuses (never accepted here) is hung
            # up instead, once, and its transfer says so.
            ada = await identity.create_account(db, "Ada")
            refused, _, _ = sip.incoming(caller=OWNER, line=LINE)
            await db.execute(
                "INSERT INTO call_transfers (call_sid, account_id, to_number, caller_id, caller_name, reason)"
                " VALUES ($1, $2, $3, $4, 'Charles', 'dinner')", refused, ada.id, OWNER, LINE,
            )  # fmt: skip
            transfers = Transfers(db, whisper_url=f"{PUBLIC}/w", after_url=f"{PUBLIC}/a")
            link = SipLink(control, refused, transfers)
            await link.close()
            await link.close()
            assert [a for s, a in sip.requests if s == refused] == ["refer", "hangup"]
            row = await db.fetchrow("SELECT status, dial_status FROM call_transfers WHERE call_sid = $1", refused)
            assert (row["status"], row["dial_status"]) == ("referred", "refer-failed")
        finally:
            await control.aclose()
