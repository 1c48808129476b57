"""A real Synapse for tests and benchmarks: the embedded homeserver's own config and start-up
(``core.adapters.matrix.synapse``), with an in-memory SQLite database and open registration, so
each test can make users of its own. Start one per test session and share it: a start is a few
seconds, a new user a few milliseconds."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.adapters.matrix import MatrixClient
from core.adapters.matrix import synapse as synapse_process
from core.testing.processes import free_port

_names = itertools.count(1)


@dataclass
class TestHomeserver:
    config: synapse_process.SynapseConfig
    pepper_password: str
    clients: list[MatrixClient] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def pepper_id(self) -> str:
        return self.config.user_id("pepper")

    async def user(self, name: str) -> MatrixClient:
        """A new user (``name`` plus a number unique in the session), registered and logged in."""
        client = MatrixClient(self.url)
        await client.register(f"{name}{next(_names)}", secrets.token_urlsafe(12))
        self.clients.append(client)
        return client

    async def pepper(self) -> MatrixClient:
        """A new session (device) of Pepper's own user."""
        client = MatrixClient(self.url, self.pepper_id)
        await client.login(self.pepper_password)
        self.clients.append(client)
        return client

    async def close_clients(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients.clear()


@asynccontextmanager
async def running_homeserver(directory: Path) -> AsyncIterator[TestHomeserver]:
    config = synapse_process.write_config(
        directory, server_name="rooms.test", port=free_port(), in_memory=True, open_registration=True
    )
    process = await synapse_process.start(config, directory / "synapse.log")
    try:
        await synapse_process.until_ready(config, process)
        password = secrets.token_urlsafe(12)
        await synapse_process.register_user(config, "pepper", password)
        server = TestHomeserver(config, password)
        try:
            yield server
        finally:
            await server.close_clients()
    finally:
        await synapse_process.stop(process, grace=2.0)  # nothing of an in-memory server is worth a slow stop
