"""Skills tests run the real router and OpenAI adapter against a loopback OpenAI peer.

Tiers map to distinct model names (gpt-small, gpt-medium, gpt-large) so a test can read from the
wire which tier a request ran on. The registry is the starter areas plus a small calendar area
(read-only, test-made) that sits behind a worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from skill_support import CALENDAR_TOOLS, NOW, make_catalog

from core.identity import Account, create_account
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.tools import ToolRegistry
from core.tools.starter import starter_registry
from text_loop import HarnessConfig, HarnessDeps


@pytest.fixture
async def peer() -> AsyncIterator[OpenAIPeer]:
    async with OpenAIPeer() as p:
        yield p


@pytest.fixture
async def router(peer: OpenAIPeer) -> AsyncIterator[ModelRouter]:
    adapter = OpenAIResponsesAdapter(api_key="sk-test", base_url=peer.base_url, timeout=5.0)
    tiers = {name: Tier(name, (ModelChoice(f"gpt-{name}"),)) for name in ("small", "medium", "large")}
    r = ModelRouter({OPENAI: adapter}, tiers)
    yield r
    await r.aclose()


@pytest.fixture
async def account(db: Database) -> Account:
    return await create_account(db, "Ada", timezone="Europe/Paris")


@pytest.fixture
def registry() -> ToolRegistry:
    # The real calendar area gives way to the small test-made one.
    return ToolRegistry([*(t for t in starter_registry().all() if t.area != "calendar"), *CALENDAR_TOOLS])


@pytest.fixture
def deps(db: Database, router: ModelRouter, registry: ToolRegistry) -> HarnessDeps:
    return HarnessDeps(
        db=db, models=router, registry=registry, config=HarnessConfig(), clock=lambda: NOW, skills=make_catalog()
    )
