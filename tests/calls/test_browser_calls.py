"""Browser calls over WebRTC: a loopback browser (aiortc, Opus) calls Pepper on a real socket,
through the one call engine, against the loopback OpenAI Realtime server."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from phone_support import NOTICE, speech, until

from core import access, identity
from core.adapters.twilio import media_streams as media
from core.settings import Settings
from core.store import Database
from gateway.server import running_app
from voice.adapters.webrtc import BrowserLink
from voice.codec import audioop
from voice.testing.browser_peer import BrowserPeer
from voice.testing.realtime_peer import RealtimePeer, call_tool, speak


@dataclass
class Web:
    db: Database
    model: RealtimePeer
    http: httpx.AsyncClient
    services: Any
    account_id: Any
    csrf: str
    token: str

    async def offer(self, body: Any, **headers: str) -> httpx.Response:
        return await self.http.post("/api/calls", json=body, headers={"X-CSRF-Token": self.csrf, **headers})

    async def hang_up(self, call_id: str) -> httpx.Response:
        return await self.http.post(f"/api/calls/{call_id}/hangup", headers={"X-CSRF-Token": self.csrf})

    async def ended_row(self, call_id: str) -> Any:
        async def row() -> Any:
            found = await self.db.fetchrow("SELECT * FROM calls WHERE call_sid = $1", call_id)
            return found if found is not None and found["summary"] is not None else None

        return await until(row, 15, "the call recorded as ended")


@pytest.fixture
async def web(db: Database, db_url: str) -> AsyncIterator[Web]:
    ada = await identity.create_account(db, "Ada")
    token, session = await access.create_session(db, ada.id)
    async with RealtimePeer() as model:
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_realtime_url=model.websocket_url,
                            voice_notice=NOTICE, port=0, media_port=0, graceful_timeout=2,
                            voice_notice_audio="model")  # fmt: skip
        async with running_app(settings, db) as (app, port):
            services = app.extensions["pepper"]
            deps = services.calls.deps
            deps.config = dataclasses.replace(deps.config, notice_timeout=5.0, closing_grace=3.0)
            model.script(speak(NOTICE, ms=300))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", cookies={"pepper_session": token},
                                         timeout=15) as http:  # fmt: skip
                yield Web(db, model, http, services, ada.id, session.csrf_token, token)


def _ulaw_pcm(name: str) -> bytes:
    return audioop.ulaw2lin(speech(name), 2)


@pytest.mark.slow
async def test_a_browser_call_is_the_owners_verified_call_through_the_one_engine(web: Web):
    todo = await web.db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'feed the cat') RETURNING id",
                                 web.account_id)  # fmt: skip
    web.model.script(call_tool("complete_todo", {"id": todo}), speak("Done, the cat is fed.", ms=600))
    web.model.hear("I fed the cat")
    async with BrowserPeer() as browser:
        response = await web.offer(await browser.offer())
        assert response.status_code == 201, response.text
        answer = response.json()
        assert answer["call_id"].startswith("WB") and answer["type"] == "answer"
        assert "a=candidate" in answer["sdp"] and "opus/48000" in answer["sdp"].lower()
        await browser.accept(answer["sdp"])

        # Verified from the first word: the memory and the full tool set, no PIN tools.
        await web.model.wait_for(lambda: web.model.sessions and web.model.sessions[0].config.get("tools"))
        session = web.model.sessions[0]
        names = session.tool_names()
        assert "complete_todo" in names and "verify_pin" not in names
        assert "not yet proved" not in session.config["instructions"]

        # The notice reaches the browser as Opus, and its mark comes back: the caller's turn.
        await browser.wait_for(lambda: browser.heard() >= 5, what="the notice's audio")
        await web.model.wait_for(lambda: session.first_audio_at is not None)
        browser.say(_ulaw_pcm("todo"))
        # The speech reached the model (resampled to 8 kHz mu-law): loud frames, then the tool ran.
        await web.model.wait_for(lambda: session.tool_outputs, within=15)
        loud = audioop.rms(audioop.ulaw2lin(bytes(session.audio_in), 2), 2)
        assert loud > 100
        # The confirmation played out: the staged write is committed on its mark.
        await until(lambda: web.db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo), 15, "the todo done")
        await browser.wait_for(lambda: ("pepper", "Done, the cat is fed.") in browser.lines(), what="the line")
        assert ("you", "I fed the cat") in browser.lines()

        hung = await web.hang_up(answer["call_id"])
        assert hung.status_code == 200 and hung.json() == {"ok": True}
        row = await web.ended_row(answer["call_id"])
        assert row["route"] == "owner" and row["verified_by"] == "web-session" and row["end_reason"] == "hangup"
        assert row["summary"].startswith("Browser call") and "complete_todo" in row["summary"]
        turn = await web.db.fetchrow("SELECT * FROM turns WHERE id = $1", row["turn_id"])
        assert turn["trust"] == "owner_verified" and turn["status"] == "delivered"
        # The caller's words are the person's own (not an unverified caller's), in the one conversation.
        said = await web.db.fetchrow("SELECT author FROM messages WHERE channel = 'voice' AND body = 'I fed the cat'")
        assert said is not None and said["author"] is None
        # Hung up twice: the same answer, nothing new.
        again = await web.hang_up(answer["call_id"])
        assert again.status_code == 200 and again.json()["duplicate"] is True


@pytest.mark.slow
async def test_signalling_refuses_garbage_forgery_and_a_second_call(web: Web):
    async with BrowserPeer() as browser:
        offer = await browser.offer()
        # No session, a forged or missing CSRF token, an API token instead of the web session.
        bare = httpx.AsyncClient(base_url=str(web.http.base_url), timeout=10)
        async with bare:
            assert (await bare.post("/api/calls", json=offer)).status_code == 401
            api = await access.create_api_token(web.db, web.account_id, "cli")
            assert (
                await bare.post("/api/calls", json=offer, headers={"Authorization": f"Bearer {api}"})
            ).status_code == 401
        assert (await web.offer(offer, **{"X-CSRF-Token": "forged"})).status_code == 403
        assert (await web.http.post("/api/calls", json=offer)).status_code == 403
        assert await web.db.fetchval("SELECT count(*) FROM security_events WHERE kind = 'browser-call-csrf'") == 2
        # Garbage: not JSON, not an offer, SDP that is not SDP, SDP with no audio.
        garbage = await web.http.post("/api/calls", content=b"\xff{", headers={"X-CSRF-Token": web.csrf})
        assert garbage.status_code == 400
        assert (await web.offer({"type": "answer", "sdp": offer["sdp"]})).status_code == 400
        assert (await web.offer({"type": "offer", "sdp": "v=0\r\nnonsense"})).json()["error"] == "bad-offer"
        no_audio = "\r\n".join(line for line in offer["sdp"].split("\r\n") if "audio" not in line)
        assert (await web.offer({"type": "offer", "sdp": no_audio})).status_code == 400
        assert (await web.offer({"type": "offer", "sdp": "v=0\r\n" + "m=audio " * 5000})).status_code == 400
        assert await web.db.fetchval("SELECT count(*) FROM calls") == 0
        assert web.services.calls.sessions == {}

        first = await web.offer(offer)
        assert first.status_code == 201
        # The same offer again, or a new one, while the call runs: one call per session.
        assert (await web.offer(offer)).status_code == 409
        async with BrowserPeer() as other:
            assert (await web.offer(await other.offer())).json()["error"] == "call-in-progress"
        call_id = first.json()["call_id"]
        assert (await web.hang_up("WB" + "0" * 32)).status_code == 404
        forged = await web.http.post(f"/api/calls/{call_id}/hangup", headers={"X-CSRF-Token": "forged"})
        assert forged.status_code == 403 and call_id in web.services.calls.sessions  # still running
        assert (await web.hang_up(call_id)).status_code == 200
        await web.ended_row(call_id)
        # Once it is over, the session may call again.
        async with BrowserPeer() as later:
            again = await web.offer(await later.offer())
            assert again.status_code == 201
            assert (await web.hang_up(again.json()["call_id"])).status_code == 200
            await web.ended_row(again.json()["call_id"])


@pytest.mark.slow
async def test_signing_out_hangs_up_the_session_s_browser_call_and_only_its_own(web: Web):
    other_token, other = await access.create_session(web.db, web.account_id)  # the owner's second browser
    async with BrowserPeer() as browser, BrowserPeer() as second:
        mine = (await web.offer(await browser.offer())).json()["call_id"]
        async with httpx.AsyncClient(base_url=str(web.http.base_url), cookies={"pepper_session": other_token},
                                     timeout=15) as http:  # fmt: skip
            csrf = {"X-CSRF-Token": other.csrf_token}
            theirs = await http.post("/api/calls", json=await second.offer(), headers=csrf)
            assert theirs.status_code == 201
            # A forged sign-out ends nothing.
            assert (await web.http.post("/chat/logout", headers={"X-CSRF-Token": "forged"})).status_code == 403
            assert mine in web.services.calls.sessions
            out = await web.http.post("/chat/logout", headers={"X-CSRF-Token": web.csrf})
            assert out.status_code == 200
            row = await web.ended_row(mine)
            assert row["end_reason"] == "signed-out"
            # The other browser's sign-in, and its call, go on.
            assert theirs.json()["call_id"] in web.services.calls.sessions
            hung = await http.post(f"/api/calls/{theirs.json()['call_id']}/hangup", headers=csrf)
            assert hung.status_code == 200
            await web.ended_row(theirs.json()["call_id"])


async def test_the_browser_link_plays_in_20ms_frames_echoes_marks_and_a_clear_drops_what_is_queued():
    echoed: list[str] = []
    link = BrowserLink("MZ1", lambda: None)
    link.echo = echoed.append
    tone = b"\x10" * 400  # 50 ms
    link.send_many([media.media_frame("MZ1", base64.b64encode(tone).decode()), media.mark_frame("MZ1", "a1")])
    assert link.next_frame() == b"\x10" * 160 and echoed == []
    assert link.next_frame() == b"\x10" * 160 and echoed == []
    assert link.next_frame() == b"\x10" * 80 + b"\xff" * 80  # the tail, padded with silence; the mark played
    assert echoed == [media.mark_frame("MZ1", "a1")]
    link.send(media.media_frame("MZ1", base64.b64encode(tone * 4).decode()))
    link.send(media.mark_frame("MZ1", "a2"))
    link.send(media.clear_frame("MZ1"))  # barge-in: nothing queued plays, the waiting mark comes back
    assert len(echoed) == 1  # not at once: the engine marks it cancelled after sending the clear
    await asyncio.sleep(0)
    assert echoed[-1] == media.mark_frame("MZ1", "a2") and link.frames_cleared == 10
    assert link.next_frame() == b"\xff" * 160


@pytest.mark.slow
async def test_a_browser_call_is_held_by_the_web_server_when_media_processes_hold_the_phone_calls(
    db: Database, db_url: str
):
    """``pepper serve``'s default: the web server answers the offer and holds the call, so its row
    names the web server's call-control session (a crash of the web server is swept, as a media
    process's calls are)."""
    ada = await identity.create_account(db, "Ada")
    token, session = await access.create_session(db, ada.id)
    async with RealtimePeer() as model:
        model.script(speak(NOTICE, ms=300))
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_realtime_url=model.websocket_url,
                            voice_notice=NOTICE, port=0, media_port=0, graceful_timeout=2,
                            voice_notice_audio="model")  # fmt: skip
        async with running_app(settings, db, media_processes=2) as (_app, port), BrowserPeer() as browser:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", cookies={"pepper_session": token},
                                         timeout=15, headers={"X-CSRF-Token": session.csrf_token}) as http:  # fmt: skip
                answer = (await http.post("/api/calls", json=await browser.offer())).json()
                await browser.accept(answer["sdp"])

                async def holder() -> Any:
                    return await db.fetchval(
                        "SELECT a.application_name FROM calls c JOIN pg_stat_activity a ON a.pid = c.held_by"
                        " WHERE c.call_sid = $1", answer["call_id"],
                    )  # fmt: skip

                assert (await until(holder, 10, "the call held")).startswith("pepper-web ")
                assert (await http.post(f"/api/calls/{answer['call_id']}/hangup")).status_code == 200
