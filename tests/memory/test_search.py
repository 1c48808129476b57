"""Search on request with the real local ONNX embedder: meaning, quoted phrases, documents, scheduled
runs left out, isolation between people, the tool behind the gate, and re-indexing to a new model."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

import pytest
from memory_kit import NOW, say, turn

from core.memory.index import EMBEDDERS, Embedders, add_document, index_pending, index_state, progress, set_target
from core.memory.search import BuiltinMemorySearch, MemorySearchSlot, quoted_phrases
from core.models.adapters.openai_embeddings import OpenAIEmbedder
from core.models.embeddings import LocalEmbedder
from core.slots import SlotRegistry
from core.slots.plugins import Plugin
from core.slots.settings import set_slot
from core.testing.peers import OpenAIPeer
from core.testing.scripted import calls, reply
from text_loop import HarnessDeps, run_turn

T0 = datetime(2025, 5, 12, 8, 0, tzinfo=UTC)
ADA_MESSAGES = [
    ("sms", "My dentist appointment is on Thursday at 3pm with Dr Moreau"),
    ("email", "Please book a table for four at the Italian place on Saturday"),
    ("whatsapp", "The wifi password for the cabin is written on the blue umbrella stand"),
    ("sms", "I lost my passport, what should I do?"),
]


async def seed(db, account_id, messages=ADA_MESSAGES) -> list[int]:
    return [
        await say(db, account_id, T0 + timedelta(hours=n), body, channel=channel)
        for n, (channel, body) in enumerate(messages)
    ]


@pytest.fixture
def search() -> BuiltinMemorySearch:
    return BuiltinMemorySearch(EMBEDDERS)


def test_quoted_phrases_are_found() -> None:
    assert quoted_phrases('when "blue umbrella" and “Dr Moreau” ""') == ["blue umbrella", "Dr Moreau"]


async def test_meaning_search_finds_by_meaning_with_date_and_channel(db, ada, search) -> None:
    ids = await seed(db, ada.id)
    progress_seen = []
    result = await index_pending(db, now=NOW, on_progress=progress_seen.append)
    assert result.finished and result.indexed == result.total == 4 and progress_seen
    hits = await search.search(db, ada.id, "when do I see the teeth doctor", limit=3)
    assert hits[0].source_id == ids[0] and hits[0].match == "meaning"
    assert hits[0].channel == "sms" and hits[0].created_at == T0 and hits[0].direction == "inbound"
    hits = await search.search(db, ada.id, "restaurant reservation", limit=1)
    assert hits[0].source_id == ids[1] and hits[0].channel == "email"


async def test_a_quoted_phrase_also_runs_a_keyword_search(db, ada, search) -> None:
    ids = await seed(db, ada.id)
    await say(db, ada.id, T0 + timedelta(days=1), "an umbrella that is blue")  # not the phrase as written
    await index_pending(db, now=NOW)
    hits = await search.search(db, ada.id, 'the "blue umbrella"', limit=5)
    words = [h for h in hits if h.match == "words"]
    assert [h.source_id for h in words] == [ids[2]]
    assert "blue umbrella" in words[0].snippet
    # Keyword search works without the index too, and 100% literal: % and _ are not wildcards.
    assert await search.keyword(db, ada.id, "100%", limit=5) == []


async def test_one_persons_search_never_returns_anothers(db, ada, bob, search) -> None:
    ada_ids = set(await seed(db, ada.id))
    bob_ids = set(await seed(db, bob.id, [(c, b.replace("Dr Moreau", "Dr Chen")) for c, b in ADA_MESSAGES]))
    await add_document(db, bob.id, "brief", "Bob's dentist brief", "Dentist with Dr Chen on Thursday")
    await index_pending(db, now=NOW)
    for query in ("dentist appointment", '"blue umbrella"', "Dr Chen", "passport"):
        for hit in await search.search(db, ada.id, query, limit=20):
            assert hit.source == "message" and hit.source_id in ada_ids
        bob_hits = await search.search(db, bob.id, query, limit=20)
        assert all(h.source_id in bob_ids for h in bob_hits if h.source == "message")


async def test_scheduled_runs_are_left_out_and_documents_are_in(db, ada, search) -> None:
    run = await turn(db, ada.id, T0, kind="scheduled", reply="Weather brief")
    await say(db, ada.id, T0, "Weather brief: heavy rain expected in Lyon", inbound=False, turn_id=run)
    doc = await add_document(db, ada.id, "report", "Trip plan", "Train to Lyon on the 14th, hotel near the station")
    await index_pending(db, now=NOW)
    hits = await search.search(db, ada.id, "rain in Lyon", limit=5)
    assert [(h.source, h.source_id) for h in hits] == [("document", doc)]
    assert hits[0].title == "Trip plan" and hits[0].kind == "report"
    assert await search.keyword(db, ada.id, "heavy rain", limit=5) == []


async def test_the_model_searches_through_the_tool(db, ada, models) -> None:
    await seed(db, ada.id)
    await index_pending(db, now=NOW)
    deps = HarnessDeps(db=db, models=models, clock=lambda: NOW)
    models.script(calls(("search_memory", {"query": "wifi password"})), reply("It's on the umbrella stand."))
    await run_turn(deps, ada.id, "web", "where was the cabin wifi password?")
    tool_result = models.prompts[1].messages[-1].tool_result
    assert tool_result is not None
    assert "2025-05-12 12:00, whatsapp, the person wrote: The wifi password" in tool_result.content
    # An empty index says "Found nothing", never a failure.
    await db.execute("DELETE FROM memory_index")
    models.script(calls(("search_memory", {"query": "wifi"})), reply("Nothing."))
    await run_turn(deps, ada.id, "web", "wifi?")
    assert models.prompts[-1].messages[-1].tool_result.content.startswith("Found nothing")


async def test_a_failing_plugin_falls_back_to_the_builtin(db, ada, search) -> None:
    class Broken:
        async def search(self, *args, **kw):
            raise RuntimeError("plugin down")

    Broken.slot = "memory"
    ids = await seed(db, ada.id)
    await index_pending(db, now=NOW)
    registry = SlotRegistry(plugins=lambda: {"broken": Plugin("broken", "tests:Broken", None, Broken())})
    slot = MemorySearchSlot(search, registry)
    await set_slot(db, "memory", "broken", registry=registry)
    hits = await slot.search(db, ada.id, "passport", limit=1)
    assert hits[0].source_id == ids[3]


async def test_reindexing_to_a_new_model_switches_when_done(db, ada) -> None:
    embedders = Embedders()
    embedders.use(LocalEmbedder())
    ids = await seed(db, ada.id)
    await index_pending(db, embedders=embedders, now=NOW)
    assert (await index_state(db)).active_model == LocalEmbedder.model_id
    async with OpenAIPeer(embedding_dims=16) as peer:
        remote = OpenAIEmbedder(api_key="k", base_url=peer.base_url, model="text-embedding-3-small", dimensions=16)
        embedders.use(remote)
        state = await set_target(db, remote, now=NOW)
        assert state.reindexing and state.active_model == LocalEmbedder.model_id
        # Part way: searches still answer from the old model.
        await index_pending(db, embedders=embedders, now=NOW, max_batches=0)
        search = BuiltinMemorySearch(embedders)
        assert (await search.search(db, ada.id, "teeth doctor", limit=1))[0].source_id == ids[0]
        assert not peer.requests
        seen = []
        done = await index_pending(db, embedders=embedders, now=NOW, on_progress=seen.append)
        assert done.finished and seen[-1].model_id == remote.model_id
        state = await index_state(db)
        assert state.active_model == state.target_model == remote.model_id and not state.reindexing
        models = {r["model_id"] for r in await db.fetch("SELECT DISTINCT model_id FROM memory_index")}
        assert models == {remote.model_id}
        hits = await search.search(db, ada.id, ADA_MESSAGES[3][1], limit=1)  # the fake model matches exact text
        assert hits[0].source_id == ids[3]
        await remote.aclose()
    assert (await progress(db)).finished


async def test_an_index_this_process_cannot_query_is_a_failure_not_nothing(db, ada, models) -> None:
    await db.execute("UPDATE memory_index_state SET active_model = 'openai:text-embedding-3-large'")
    deps = HarnessDeps(db=db, models=models, clock=lambda: NOW)
    models.script(calls(("search_memory", {"query": "wifi"})), reply("I could not check."))
    await run_turn(deps, ada.id, "web", "wifi?")
    assert models.prompts[-1].messages[-1].tool_result.content.startswith("Failed")


def test_long_texts_are_cut_into_overlapping_chunks_at_spaces() -> None:
    from core.memory.index import chunks

    text = " ".join(f"word{n}" for n in range(600))  # about 4,300 characters
    spans = chunks(text, 1000, 150)
    assert spans[0][0] == 0 and spans[-1][1] == len(text) and all(b - a <= 1000 for a, b in spans)
    assert all(nxt[0] < prev[1] for prev, nxt in itertools.pairwise(spans))  # they overlap
    assert all(text[a - 1] == " " for a, _ in spans[1:]) and all(text[b : b + 1] in (" ", "") for _, b in spans)
    assert chunks("   ", 1000, 150) == [] and chunks("short", 1000, 150) == [(0, 5)]


async def test_the_end_of_a_long_email_is_found(db, ada, search) -> None:
    filler = " ".join(["The quarterly newsletter covers gardening, recipes and local events."] * 40)
    body = filler + " P.S. The boat rental for the lake trip is booked for the 14th of August."
    email = await say(db, ada.id, T0, body, channel="email")
    await seed(db, ada.id)
    await index_pending(db, now=NOW)
    assert await db.fetchval("SELECT count(*) FROM memory_index WHERE message_id = $1", email) >= 3
    hits = await search.search(db, ada.id, "when is the boat rental for the lake", limit=1)
    assert hits[0].source_id == email and "boat rental" in hits[0].snippet


async def test_blank_messages_never_stall_the_indexer(db, ada) -> None:
    for _ in range(70):  # more than one batch of nothing to embed
        await say(db, ada.id, T0, " \n\t ")
    real = await say(db, ada.id, T0, "The gate code is 1234")
    result = await asyncio.wait_for(index_pending(db, now=NOW), timeout=60)
    assert result.finished and result.indexed == result.total == 1
    assert await db.fetchval("SELECT message_id FROM memory_index") == real
