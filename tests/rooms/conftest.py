"""One real Synapse for every rooms test (started once per session), Pepper's session on it, and
a follower on each test's database with a scripted model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.adapters.matrix import MatrixClient
from core.store import Database
from core.testing.matrix import TestHomeserver, running_homeserver
from core.testing.scripted import ScriptedModels
from gateway.rooms.follow import RoomFollower
from text_loop import HarnessDeps


@pytest.fixture(scope="session")
async def homeserver(tmp_path_factory: pytest.TempPathFactory) -> TestHomeserver:
    async with running_homeserver(tmp_path_factory.mktemp("synapse")) as server:
        yield server


@pytest.fixture(scope="session")
async def pepper(homeserver: TestHomeserver) -> MatrixClient:
    """Pepper's one device for the session: transaction ids are deduplicated per device."""
    return await homeserver.pepper()


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def models() -> ScriptedModels:
    return ScriptedModels()


@pytest.fixture
def harness(db: Database, models: ScriptedModels) -> HarnessDeps:
    return HarnessDeps(db=db, models=models)


@pytest.fixture
def follower(db: Database, pepper: MatrixClient, harness: HarnessDeps, clock: Clock) -> RoomFollower:
    return RoomFollower(db, pepper, harness, clock=clock, timeout_ms=300)
