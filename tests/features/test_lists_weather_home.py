"""Lists (own and shared with a room), weather through a loopback Open-Meteo, and Home Assistant
through a loopback server speaking its REST API."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput
from core.identity import create_account
from core.records import rooms
from core.testing.home_assistant_peer import HomeAssistantPeer
from core.testing.open_meteo_peer import OpenMeteoPeer
from core.tools import SessionContext, commit_turn_writes
from core.tools.areas.home import connect_home_assistant
from core.tools.areas.home.client import HomeUnavailable
from core.tools.starter import starter_registry

from .support import Caller


async def test_lists_add_show_tick_and_duplicates(call: Caller) -> None:
    added = await call("add_to_list", {"items": ["milk", " Milk ", "coffee filters"]}, delivered=True)
    assert added.status == "ok", added.content
    again = await call("add_to_list", {"items": ["milk"]}, delivered=True)  # a duplicate item: kept once
    assert again.status == "ok"
    shown = await call("show_list", {})
    assert shown.content.count("milk") == 1 and "coffee filters" in shown.content
    milk = int(shown.content.split("#")[1].split()[0])
    ticked = await call("tick_off_list", {"ids": [milk]})  # staged: not ticked until the reply is delivered
    assert "ticked off milk" in ticked.content
    assert "milk" in (await call("show_list", {})).content
    session = await call.session()
    outcome = await call("tick_off_list", {"ids": [milk]}, session=session)
    assert outcome.status == "ok"
    registry = starter_registry(call.connectors)
    await commit_turn_writes(call.db, registry, session.turn_id)
    await commit_turn_writes(call.db, registry, session.turn_id)  # a repeated report does nothing more
    assert "milk" not in (await call("show_list", {})).content
    await call("add_to_list", {"list": "packing", "items": ["socks"]}, delivered=True)
    packing = await call("show_list", {"list": "packing"})
    assert packing.content.endswith("Other lists: shopping (1 open)")


async def test_lists_refuse_garbage_and_other_peoples_items(call: Caller) -> None:
    assert (await call("add_to_list", {"items": []})).status == "failed"  # schema: at least one
    assert (await call("add_to_list", {"items": ["x"], "colour": "red"})).status == "failed"
    assert (await call("show_list", {"list": "packing"})).status == "empty"
    other = await create_account(call.db, "Eve", timezone="UTC")
    eve = Caller(call.db, other, call.connectors)
    await eve("add_to_list", {"items": ["secret thing"]}, delivered=True)
    eves = await eve("show_list", {})
    item = int(eves.content.split("#")[1].split()[0])
    await call("add_to_list", {"items": ["bread"]}, delivered=True)
    forged = await call("tick_off_list", {"ids": [item]}, delivered=True)  # Eve's item id, from Ada's turn
    assert forged.status == "failed" and "no open item" in forged.content
    assert "secret thing" in (await eve("show_list", {})).content
    assert "secret" not in (await call("show_list", {})).content


async def test_a_list_shared_with_a_room_is_what_the_room_sees(call: Caller) -> None:
    room = await rooms.create_room(call.db, "!abc:pepper.test", "Flat")
    await rooms.add_member(call.db, room.id, call.account.id)
    await call("add_to_list", {"list": "groceries", "items": ["eggs"]}, delivered=True)
    stranger_room = await rooms.create_room(call.db, "!xyz:pepper.test", "Not mine")
    refused = await call("share_list", {"list": "groceries", "room": str(stranger_room.id)})
    assert refused.status == "failed" and "not a member" in refused.content
    shared = await call("share_list", {"list": "groceries", "room": "Flat"}, delivered=True)
    assert shared.status == "ok", shared.content
    base = await call.session()
    in_room = SessionContext("room", "owner_verified", "matrix", call.account.id, base.conversation_id,
                             base.turn_id, "Europe/Paris", frozenset(), room_id=room.id)  # fmt: skip
    seen = await call("show_list", {"list": "groceries"}, session=in_room)
    assert "eggs" in seen.content
    await call("add_to_list", {"list": "groceries", "items": ["flour"]}, session=in_room)
    await commit_turn_writes(call.db, starter_registry(call.connectors), base.turn_id)
    assert "flour" in (await call("show_list", {"list": "groceries"})).content
    other_room = SessionContext("room", "owner_verified", "matrix", call.account.id, base.conversation_id,
                                base.turn_id, "Europe/Paris", frozenset(), room_id=stranger_room.id)  # fmt: skip
    assert (await call("show_list", {"list": "groceries"}, session=other_room)).status == "empty"
    assert (await call("weather_forecast", {}, session=in_room)).status == "denied"  # rooms: room data only


@pytest.fixture
async def meteo():
    async with OpenMeteoPeer() as peer:
        yield peer


async def test_weather_for_the_saved_place_and_a_named_one(call: Caller, meteo: OpenMeteoPeer) -> None:
    c = call.using(open_meteo_url=meteo.url, open_meteo_geocoding_url=meteo.url)
    unset = await c("weather_forecast", {})  # nothing saved: the city of the person's time zone
    assert unset.status == "ok" and unset.content.startswith("Paris, Île-de-France, France (from the person's time")
    assert meteo.requests[0] == {"path": "search", "name": "Paris", "count": "1", "language": "en", "format": "json"}
    assert (await c("set_weather_place", {"place": "Lyon"})).status == "ok"
    here = await c("weather_forecast", {"days": 2})
    assert here.status == "ok" and here.content.startswith("Lyon, Auvergne")
    assert here.content.count("\n- ") == 2 and "rain 80%" in here.content
    asked = meteo.requests[-1]
    assert asked["latitude"] == "45.74846" and asked["timezone"] == "Europe/Paris"
    assert (await c("set_weather_place", {"place": "Paris"})).status == "ok"  # again: replaces, one place
    places = await c.db.fetch("SELECT name FROM weather_places")
    assert [r["name"] for r in places] == ["Paris, Île-de-France, France"]
    assert (await c("set_weather_place", {"place": "x"})).status == "failed"  # Open-Meteo's 400: said plainly
    oslo = await c("weather_forecast", {"place": "oslo", "days": 1})
    assert "Oslo" in oslo.content and oslo.content != here.content
    missing = await c("weather_forecast", {"place": "Atlantis"})
    assert missing.status == "failed" and "no place called" in missing.content
    assert (await c("weather_forecast", {"days": 30})).status == "failed"  # garbage: out of range
    meteo.broken = True
    broke = await c("weather_forecast", {})
    assert broke.status == "failed" and "not JSON" in broke.content


@pytest.fixture
async def home():
    async with HomeAssistantPeer() as peer:
        yield peer


async def test_home_assistant_connect_read_and_act(call: Caller, home: HomeAssistantPeer) -> None:
    with pytest.raises(HomeUnavailable, match="refused the token"):  # a forged token stores nothing
        await connect_home_assistant(call.db, call.connectors, call.account.id, home.url, "wrong-token")
    with pytest.raises(InvalidInput):
        await connect_home_assistant(call.db, call.connectors, call.account.id, "ftp://x", home.token)
    assert (await call.session()).connections == frozenset()
    await connect_home_assistant(call.db, call.connectors, call.account.id, home.url + "/api/", home.token)
    assert "home_assistant" in (await call.session()).connections
    lights = await call("home_states", {"domain": "light"})
    assert "light.kitchen (Kitchen light): on" in lights.content and "lock." not in lights.content
    session = await call.session()
    planned = await call("home_action", {"entity_id": "light.kitchen", "service": "turn_off"}, session=session)
    assert planned.status == "ok" and home.calls == []  # staged: nothing until the reply is delivered
    registry = starter_registry(call.connectors)
    await commit_turn_writes(call.db, registry, session.turn_id)
    await commit_turn_writes(call.db, registry, session.turn_id)  # a duplicate report acts once
    assert home.calls == [("light", "turn_off", {"entity_id": "light.kitchen"})]
    assert home.states["light.kitchen"][0] == "off"
    bogus = await call("home_action", {"entity_id": "light.garage", "service": "turn_on"})
    assert bogus.status == "failed" and "no entity" in bogus.content
    wrong = await call("home_action", {"entity_id": "light.hall", "service": "unlock"})
    assert wrong.status == "failed" and "services only" in wrong.content
    scheduled = await call("home_action", {"entity_id": "light.hall", "service": "turn_on"}, kind="scheduled")
    assert scheduled.status == "denied"  # no one present: refused by the gate


async def test_a_lock_needs_a_yes_in_a_later_message(call: Caller, home: HomeAssistantPeer) -> None:
    await connect_home_assistant(call.db, call.connectors, call.account.id, home.url, home.token)
    args = {"entity_id": "lock.front_door", "service": "unlock"}
    asked = await call("home_action", args, delivered=True)
    assert asked.status == "failed" and "needs the person's yes" in asked.content
    token = asked.content.split("confirm_token '")[1].split("'")[0]
    made_up = await call("home_action", {**args, "confirm_token": token[:12] + "00000000"}, delivered=True)
    assert made_up.status == "failed" and home.calls == []
    same_turn = await call.session()
    again = await call("home_action", args, session=same_turn)
    own = again.content.split("confirm_token '")[1].split("'")[0]
    in_same = await call("home_action", {**args, "confirm_token": own}, session=same_turn)
    assert in_same.status == "failed"  # the yes must come in a later message
    done = await call("home_action", {**args, "confirm_token": token}, delivered=True)
    assert done.status == "ok" and home.calls == [("lock", "unlock", {"entity_id": "lock.front_door"})]


def test_the_time_zone_names_a_city_only_when_it_is_one():
    from core.tools.areas.weather import zone_city

    assert zone_city("America/New_York") == "New York" and zone_city("Europe/Paris") == "Paris"
    assert zone_city("UTC") is None and zone_city("Etc/GMT+2") is None and zone_city("US/Pacific") is None
