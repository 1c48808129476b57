"""The travel-day, home-status and shopping-list-run skills in real turns: the real router and
OpenAI adapter against a loopback OpenAI, and the real areas against loopback Open-Meteo and Home
Assistant peers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from skill_support import NOW, outputs, tool_names, turn_record

from core.testing.home_assistant_peer import HomeAssistantPeer
from core.testing.open_meteo_peer import OpenMeteoPeer
from core.testing.peers import ScriptedCall, reply_text, reply_tools
from core.tools.areas.calendar.store import ensure_pepper_calendar, insert_event
from core.tools.areas.home import connect_home_assistant
from core.tools.connectors import Connectors
from core.tools.starter import starter_registry
from core.vault import Vault, generate_key
from text_loop import HarnessConfig, HarnessDeps, run_turn
from text_loop.skills import SkillCatalog


def skill_names(request) -> set[str]:
    (spec,) = [t for t in request.body["tools"] if t["name"] == "use_skill"]
    return set(spec["parameters"]["properties"]["name"]["enum"])


def use(name: str, **args) -> ScriptedCall:
    return ScriptedCall("use_skill", {"name": name, **args})


@pytest.fixture
async def meteo() -> AsyncIterator[OpenMeteoPeer]:
    async with OpenMeteoPeer(start_day=NOW.date()) as peer:
        yield peer


@pytest.fixture
async def home() -> AsyncIterator[HomeAssistantPeer]:
    async with HomeAssistantPeer() as peer:
        yield peer


@pytest.fixture
def connectors(meteo: OpenMeteoPeer) -> Connectors:
    return Connectors(
        allow_private_hosts=True, vault=Vault(generate_key()), open_meteo_url=meteo.url,
        open_meteo_geocoding_url=meteo.url,
    )  # fmt: skip


@pytest.fixture
def area_deps(db, router, connectors) -> HarnessDeps:
    return HarnessDeps(
        db=db, models=router, registry=starter_registry(connectors), config=HarnessConfig(), clock=lambda: NOW,
        skills=SkillCatalog.load_builtin(), connectors=connectors,
    )  # fmt: skip


async def test_travel_day_reads_the_calendar_and_the_destinations_weather(db, area_deps, peer, account, meteo):
    calendar = await ensure_pepper_calendar(db, account.id)
    start = NOW + timedelta(hours=3)
    await insert_event(
        db, account.id, calendar, title="Client visit", start=start, end=start + timedelta(hours=1),
        tzid="Europe/Paris", location="Lyon",
    )  # fmt: skip
    peer.script(
        reply_tools(use("travel-day", request="I'm off to Lyon today")),
        reply_tools(("list_events", {"days": 1}), ("weather_forecast", {"place": "Lyon", "days": 1})),
        reply_text("Client visit at 11:30 in Lyon. Partly cloudy, 19 to 29°C. No umbrella needed."),
    )
    outcome = await run_turn(area_deps, account.id, "web", "I'm off to Lyon today, what's the plan?")
    orchestrator, worker, results = peer.requests[:3]
    assert "travel-day" in skill_names(orchestrator)
    assert {"list_events", "weather_forecast"} <= set(tool_names(worker))
    assert "travel_time" in tool_names(worker)  # the places area is built in: the travel set has it
    events, weather = outputs(results)
    assert "Client visit" in events and weather.startswith("Lyon, Auvergne")
    assert [r["path"] for r in meteo.requests] == ["search", "forecast"]
    assert outcome.reply.startswith("Client visit at 11:30")
    record = await turn_record(db, outcome.turn_id)
    assert record["skills"]["flags"] == []


async def test_home_status_reads_home_assistant_and_changes_nothing(db, area_deps, peer, account, home):
    await connect_home_assistant(db, area_deps.connectors, account.id, home.url, home.token)
    peer.script(
        reply_tools(use("home-status")),
        reply_tools(("home_states", {})),
        reply_text("Kitchen light is on; front door locked; living room heating set to 20°C (19.5°C now)."),
    )
    outcome = await run_turn(area_deps, account.id, "web", "how's the house?")
    orchestrator, worker, results = peer.requests[:3]
    assert "home_states" not in tool_names(orchestrator)  # behind the worker
    assert {"home_states", "home_action"} <= set(tool_names(worker))
    assert "light.kitchen (Kitchen light): on" in outputs(results)[0]
    assert outcome.reply.startswith("Kitchen light is on") and home.calls == []
    assert (await turn_record(db, outcome.turn_id))["skills"]["flags"] == []


async def test_home_status_without_home_assistant_is_refused_with_the_reason(db, area_deps, peer, account, home):
    peer.script(reply_tools(use("home-status")), reply_text("Home Assistant is not connected."))
    await run_turn(area_deps, account.id, "web", "how's the house?")
    refusal = outputs(peer.requests[1])[0]
    assert "Home Assistant" in refusal and home.calls == []


async def test_shopping_list_run_ticks_off_and_adds_in_the_shop(db, area_deps, peer, account):
    peer.script(reply_tools(("add_to_list", {"items": ["milk", "eggs", "coffee"]})), reply_text("Added."))
    first = await run_turn(area_deps, account.id, "web", "put milk, eggs and coffee on the shopping list")
    assert first.status == "replied"
    items = await db.fetch("SELECT id, text FROM list_items ORDER BY id")
    assert [r["text"] for r in items] == ["milk", "eggs", "coffee"]
    milk = items[0]["id"]
    peer.script(
        reply_tools(use("shopping-list-run", request="got the milk, we're out of butter")),
        reply_tools(("show_list", {}), ("add_to_list", {"items": ["butter"]})),
        reply_tools(("tick_off_list", {"ids": [milk]})),
        reply_text("Still to get: eggs, coffee, butter."),
    )
    outcome = await run_turn(area_deps, account.id, "web", "in the shop: got the milk, we're out of butter")
    assert outcome.reply == "Still to get: eggs, coffee, butter."
    assert "milk" in outputs(peer.requests[-2])[0] and "#" in outputs(peer.requests[-2])[0]  # shown with ids
    record = await turn_record(db, outcome.turn_id)
    assert record["skills"]["flags"] == []
    from core.tools import commit_turn_writes

    await commit_turn_writes(db, area_deps.registry, outcome.turn_id)  # the reply was delivered
    left = await db.fetch("SELECT text FROM list_items WHERE done_at IS NULL ORDER BY id")
    assert [r["text"] for r in left] == ["eggs", "coffee", "butter"]


async def test_travel_day_adds_the_travel_time_from_the_places_area(db, connectors, router, peer, account):
    deps = HarnessDeps(
        db=db, models=router, registry=starter_registry(connectors),
        config=HarnessConfig(), clock=lambda: NOW, skills=SkillCatalog.load_builtin(), connectors=connectors,
    )  # fmt: skip
    # Paris to Lyon by coordinates: no routing service here, so the offline estimate, said as one.
    trip = {"origin": "48.8566,2.3522", "destination": "45.7640,4.8357"}
    peer.script(
        reply_tools(use("travel-day", request="off to Lyon")),
        reply_tools(("weather_forecast", {"place": "Lyon", "days": 1}), ("list_events", {"days": 1})),
        reply_tools(("travel_time", trip)),
        reply_text("Leave by 11:05: about 13 hours by car, an estimate. Partly cloudy."),
    )
    outcome = await run_turn(deps, account.id, "web", "off to Lyon today")
    worker = peer.requests[1]
    assert "travel_time" in tool_names(worker)
    assert "an estimate from straight-line distance" in outputs(peer.requests[3])[-1]
    assert outcome.reply.startswith("Leave by 11:05")
