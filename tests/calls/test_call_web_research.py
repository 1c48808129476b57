"""Web research on a phone call: the owner's verified call hands one question to the research
helper process (while the caller hears the filler), when the caller's own words ask for the web or
the conversation's web window is open; a restricted call and an answering call never see it."""

from __future__ import annotations

import asyncio
import json

import pytest
from phone_support import LINE, OWNER, STRANGER, first_tool_output, speech, verify_by_keypad

from core.conversation import conversation_for, record_inbound, record_outbound
from core.settings import Settings
from core.testing.peers import reply_text, reply_tools
from core.untrusted import WEB_RESEARCH_LABEL
from gateway.composition import build_media_services
from voice.testing.realtime_peer import call_tool, speak

# These start the research helper as a process of its own.
pytestmark = pytest.mark.slow

QUESTION = "What does a Framework Laptop 16 cost new today?"
PAGE = """<html><head><title>Framework Laptop 16 prices</title></head><body><article>
<h1>Framework Laptop 16 prices</h1><p>The Framework Laptop 16 starts at $1,399 new this month, before any
graphics module.</p></article></body></html>"""


def _tools(session) -> set[str]:
    return set(session.tool_names())


def _priced_web(web, helper_model) -> str:
    web.page("/fw16", PAGE)
    url = web.url + "/fw16"
    web.results = [{"title": "Framework Laptop 16 prices", "url": url, "snippet": "From $1,399."}]
    helper_model.script(
        reply_tools(("web_search", {"query": "Framework Laptop 16 price"})),
        reply_tools(("read_page", {"url": url})),
        reply_text(f"From $1,399 new. Sources: {url}"),
    )
    return url


async def test_a_verified_call_hands_one_question_to_the_helper_while_the_filler_plays(phone_web):
    phone, web, helper_model = phone_web
    url = _priced_web(web, helper_model)
    conversation = await conversation_for(phone.db, phone.account_id)
    await record_inbound(phone.db, phone.account_id, "sms", "Remind me about the dentist")
    await record_outbound(phone.db, conversation, "sms", "Noted: the dentist on Friday at nine.")
    phone.tune(filler_after=0.05)
    phone.model.script(
        speak("You're verified."),
        call_tool("web_research", {"question": QUESTION}),
        call_tool("web_research", {"question": "What does a Framework Laptop 13 cost new?"}),
        speak("It starts at about $1,399 new."),
    )
    phone.model.hear("search the web for what a Framework Laptop 16 costs")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        assert "web_research" not in _tools(session)
        await verify_by_keypad(phone, call)
        assert "web_research" not in _tools(session)  # verified, but no one asked for the web
        assert "Noted: the dentist" in session.config["instructions"]
        await phone.model.wait_for(lambda: len(session.response_creates) >= 2)
        call.say(speech("hello"))
        await phone.model.wait_for(lambda: len(session.tool_outputs) >= 2, within=30)
        first, second = (o["output"] for o in session.tool_outputs)
        assert first.startswith(f"[{WEB_RESEARCH_LABEL}]")
        assert "$1,399" in first and url in first and QUESTION in first
        assert "already ran once in this turn" in second  # one hand-off per call
        await phone.model.wait_for(lambda: "web_research" in _tools(session))
        # A session that can reach the web sees the person's earlier messages, not Pepper's answers.
        instructions = session.config["instructions"]
        assert "Remind me about the dentist" in instructions and "Noted: the dentist" not in instructions
        assert any("web_research is available now" in n for n in session.notes)
        assert phone.calls.sessions[answer.call_sid].stats.fillers == 1
        filler = phone.calls.deps.filler
        await call.wait(lambda: filler[:800] in bytes(call.heard), what="the filler to play")
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    # The helper got the one question and nothing else of the call; it read the page once.
    [asked, *_] = helper_model.requests
    sent = json.dumps(asked.body)
    assert QUESTION in sent and "dentist" not in sent and "Framework Laptop 13" not in sent
    assert len(helper_model.requests) == 3
    assert [p for _, p, _, _ in web.requests if p == "/fw16"] == ["/fw16"]
    turn = await phone.db.fetchrow("SELECT tool_calls FROM turns WHERE id = $1", row["turn_id"])
    calls = [c for c in json.loads(turn["tool_calls"]) if c["name"] == "web_research"]
    assert calls[0]["status"] == "ok" and calls[1]["status"] == "denied"
    assert calls[0]["content"].startswith(f"[{WEB_RESEARCH_LABEL}]")


async def test_a_verified_call_inside_the_conversations_web_window_sees_the_tool_at_once(phone_web):
    phone = phone_web[0]
    db, ada = phone.db, phone.account_id
    await record_inbound(db, ada, "sms", "Look it up online: is the Louvre open on Tuesdays?")
    await record_outbound(db, await conversation_for(db, ada), "sms", "No, the Louvre closes on Tuesdays.")
    phone.model.script(speak("You're verified."))
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await verify_by_keypad(phone, call)
        config = phone.model.sessions[0].config
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    assert "web_research" in {t["name"] for t in config["tools"]}
    assert "is the Louvre open" in config["instructions"] and "closes on Tuesdays" not in config["instructions"]


async def _asks_the_web_unseen(phone, helper_model, answer, *, then_verify: bool = False) -> None:
    """The caller asks for the web and the model calls the tool anyway: refused as unknown, never
    shown to any session of the call (``then_verify``: not even once the caller proved who they
    are, since they asked before), and the helper never asked."""
    async with phone.caller.media(answer) as call:
        assert (await first_tool_output(phone, call, speech("hello"))).startswith("Unknown tool 'web_research'")
        await asyncio.sleep(0.3)  # a reconfiguration would have come by now
        if then_verify:
            await verify_by_keypad(phone, call)
            assert "add_todo" in _tools(phone.model.sessions[0])
        assert all("web_research" not in _tools(s) for s in phone.model.sessions)
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    assert helper_model.requests == []


def _the_model_tries_the_web(phone) -> None:
    phone.model.script(call_tool("web_research", {"question": QUESTION}), speak("I can't do that on this call."))
    phone.model.hear("search the web for what a Framework Laptop 16 costs")


async def test_a_restricted_call_never_sees_the_tool_and_asking_before_verification_does_not_count(phone_web):
    phone, _, helper_model = phone_web
    _the_model_tries_the_web(phone)
    await _asks_the_web_unseen(phone, helper_model, await phone.dial_owner(), then_verify=True)


async def test_an_answering_call_never_sees_the_tool(phone_web):
    phone, _, helper_model = phone_web
    _the_model_tries_the_web(phone)
    answer = await phone.caller.dial(from_=STRANGER, to=LINE, ForwardedFrom=OWNER)
    assert answer.connected, answer.twiml
    await _asks_the_web_unseen(phone, helper_model, answer)


async def test_a_media_process_gets_the_research_socket_in_its_connectors(db, db_url, tmp_path):
    """``pepper serve`` puts the helper's socket into the settings every child gets; a media
    process builds its calls' tools from them, as a turn worker does."""
    socket = str(tmp_path / "research.sock")
    settings = Settings(database_url=db_url, web_research_socket=socket)
    async with build_media_services(settings, db) as services:
        deps = services.calls.deps
        assert deps.connectors.research_socket == socket
        assert "web_research" in deps.registry
