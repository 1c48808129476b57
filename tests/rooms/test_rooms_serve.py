"""``pepper serve`` as a user runs it, with the embedded Synapse: the homeserver and the rooms
process come up as children, a linked member invites Pepper to a room made in their own client,
Pepper joins and answers a mention, and a SIGTERM stops it all cleanly."""

from __future__ import annotations

import asyncio
import secrets
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from core import identity
from core.adapters.matrix import MatrixClient
from core.adapters.matrix import synapse as synapse_process
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.processes import children_of, free_port, until, until_healthy
from gateway.rooms.homeserver import embedded_config

pytestmark = pytest.mark.slow

SECRET_KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3ODk="


async def _synapse_up(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/_matrix/client/versions") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_pepper_serve_starts_synapse_joins_a_members_room_and_answers_there(
    db: Database, db_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    ada = await identity.create_account(db, "Ada", timezone="UTC")
    await identity.add_handle(db, ada.id, "matrix", "@ada:localhost", verified=True)
    port, matrix_port = free_port(), free_port()
    settings = Settings(data_dir=tmp_path, matrix_port=matrix_port)
    async with OpenAIPeer() as model:
        env = {
            **subprocess_env, "DATABASE_URL": db_url, "PEPPER_SECRET_KEY": SECRET_KEY, "PEPPER_PORT": str(port),
            "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url, "PEPPER_GRACEFUL_TIMEOUT": "5",
            "PEPPER_TURN_WORKERS": "0", "PEPPER_MEDIA_PROCESSES": "1", "PEPPER_SCHEDULER_ENABLED": "false",
            "PEPPER_MEMORY_JOBS_INTERVAL": "0", "PEPPER_DATA_DIR": str(tmp_path),
            "PEPPER_ROOMS_ENABLED": "true", "PEPPER_MATRIX_PORT": str(matrix_port),
            "PEPPER_MATRIX_SERVER_NAME": "localhost",
        }  # fmt: skip
        with (tmp_path / "serve.log").open("w") as log_file:
            server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=log_file
            )
        client = None
        try:
            await until_healthy(f"http://127.0.0.1:{port}")
            url = f"http://127.0.0.1:{matrix_port}"

            async def synapse_ready() -> bool:
                return await _synapse_up(url)

            await until(synapse_ready, 30, "the embedded Synapse")
            assert children_of(server.pid, b"synapse.app.homeserver")
            password = secrets.token_urlsafe(12)
            await synapse_process.register_user(embedded_config(settings), "ada", password)
            client = MatrixClient(url, "@ada:localhost")
            await client.login(password)
            room = await client.create_room("Made in Element", ["@pepper:localhost"])

            async def joined() -> bool:
                return await client.membership(room, "@pepper:localhost") == "join"

            await until(joined, 30, "Pepper joining the room")
            model.script(reply_text("Hello from the embedded homeserver."))
            await client.send_text(room, "hi Pepper", "m1", mention="@pepper:localhost")

            async def answered() -> list[str]:
                return [e.body for e in await client.history(room) if e.sender == "@pepper:localhost"]

            assert await until(answered, 30, "Pepper's answer") == ["Hello from the embedded homeserver."]
        finally:
            if client is not None:
                await client.close()
            server.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(server.wait(), 30)
        assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
        assert not await _synapse_up(f"http://127.0.0.1:{matrix_port}")
