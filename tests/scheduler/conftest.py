"""Fixtures for scheduler tests: an account, a clock the test moves, the harness on the scripted
model, and a scheduler delivering through the gateway's deliverer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.identity import Account, create_account
from core.settings import Settings
from core.store import Database
from core.testing.scripted import ScriptedModels
from gateway.scheduled import GatewayDeliverer
from text_loop import HarnessDeps
from text_loop.scheduler import Scheduler, SchedulerConfig


class Clock:
    """A wall clock the test sets and moves; aware UTC."""

    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2025, 6, 2, 5, 0, tzinfo=UTC))  # Monday 07:00 in Paris


@pytest.fixture
async def account(db: Database) -> Account:
    return await create_account(db, "Ada", timezone="Europe/Paris")


@pytest.fixture
def deps(db: Database, models: ScriptedModels, clock: Clock) -> HarnessDeps:
    return HarnessDeps(db=db, models=models, clock=clock)


@pytest.fixture
def config() -> SchedulerConfig:
    return SchedulerConfig(lease=timedelta(seconds=60), heartbeat=timedelta(seconds=5))


@pytest.fixture
def scheduler(deps: HarnessDeps, config: SchedulerConfig, clock: Clock) -> Scheduler:
    return Scheduler(deps, GatewayDeliverer(Settings(), deps.db), config, owner="test-1", clock=clock)
