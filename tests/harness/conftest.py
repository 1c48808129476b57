"""Fixtures for the text harness: an account, and the harness wired to a scripted model over the wire."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.identity import Account, create_account
from core.store import Database
from core.testing.wire_models import WireScriptedModels, wire_scripted_models
from text_loop import HarnessConfig, HarnessDeps

NOW = datetime(2025, 6, 2, 12, 30, tzinfo=UTC)


@pytest.fixture
async def account(db: Database) -> Account:
    return await create_account(db, "Ada", timezone="Europe/Paris")


@pytest.fixture
def config() -> HarnessConfig:
    return HarnessConfig()


@pytest.fixture
async def models() -> WireScriptedModels:
    """The harness talks to its model over the wire: router, OpenAI adapter and SDK, loopback peer."""
    async with wire_scripted_models() as wire:
        yield wire


@pytest.fixture
def deps(db: Database, models: WireScriptedModels, config: HarnessConfig) -> HarnessDeps:
    return HarnessDeps(db=db, models=models, config=config, clock=lambda: NOW)
