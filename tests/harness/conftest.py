"""Fixtures for the text harness: an account, and the harness wired to the scripted model."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.identity import Account, create_account
from core.store import Database
from core.testing.scripted import ScriptedModels
from text_loop import HarnessConfig, HarnessDeps

NOW = datetime(2025, 6, 2, 12, 30, tzinfo=UTC)


@pytest.fixture
async def account(db: Database) -> Account:
    return await create_account(db, "Ada", timezone="Europe/Paris")


@pytest.fixture
def config() -> HarnessConfig:
    return HarnessConfig()


@pytest.fixture
def deps(db: Database, models: ScriptedModels, config: HarnessConfig) -> HarnessDeps:
    return HarnessDeps(db=db, models=models, config=config, clock=lambda: NOW)
