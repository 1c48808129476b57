"""Fixtures for memory tests: people, and the router over a loopback peer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.identity import Account, create_account
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import ModelChoice, ModelRouter, Tier
from core.store import Database
from core.testing.peers import OpenAIPeer


@pytest.fixture
async def ada(db: Database) -> Account:
    return await create_account(db, "Ada", timezone="Europe/Paris")


@pytest.fixture
async def bob(db: Database) -> Account:
    return await create_account(db, "Bob", timezone="America/New_York")


@pytest.fixture
async def peer_router() -> AsyncIterator[tuple[OpenAIPeer, ModelRouter]]:
    """The real router and OpenAI adapter talking HTTP to a scripted loopback peer."""
    async with OpenAIPeer() as peer:
        adapter = OpenAIResponsesAdapter(api_key="k", base_url=peer.base_url, timeout=5)
        router = ModelRouter({"openai": adapter}, {"small": Tier("small", (ModelChoice("gpt-x-mini"),))})
        yield peer, router
        await router.aclose()
