"""Fixtures for the feature areas: an owner with an email handle, connectors, a tool caller."""

from __future__ import annotations

import pytest

from core.identity import Account, add_handle, create_account
from core.store import Database
from core.tools.connectors import Connectors
from core.vault import Vault, generate_key

from .support import NOW, OWNER_EMAIL, Caller, serving  # noqa: F401 (fixtures below use them)


@pytest.fixture
async def owner(db: Database) -> Account:
    account = await create_account(db, "Ada", timezone="Europe/Paris")
    await add_handle(db, account.id, "email", OWNER_EMAIL, verified=True)
    return account


@pytest.fixture
def connectors() -> Connectors:
    return Connectors(allow_private_hosts=True, http_timeout=5.0, vault=Vault(generate_key()))


@pytest.fixture
def call(db: Database, owner: Account, connectors: Connectors) -> Caller:
    return Caller(db, owner, connectors)
