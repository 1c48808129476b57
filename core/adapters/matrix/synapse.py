"""An embedded Synapse homeserver: its config, generated once in a directory, and its process.

``pepper serve`` runs one when ``PEPPER_MATRIX_HOMESERVER`` is not set (``gateway.rooms.homeserver``
supervises it); tests and benchmarks run one per session (``core.testing.matrix``). The config is
Synapse's own YAML, written by Pepper on first start: SQLite, one client listener on 127.0.0.1, no
federation, no open registration (Pepper registers its own user with the shared secret, through
Synapse's ``register_new_matrix_user``; people get accounts the same way or on a homeserver of
their own). Rate limits are raised: Pepper and its members are the only users.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import signedjson.key
import yaml

from core.errors import StartupError

log = logging.getLogger(__name__)

CONFIG_NAME = "homeserver.yaml"
_GENEROUS = {"per_second": 1000, "burst_count": 1000}


@dataclass(frozen=True)
class SynapseConfig:
    directory: Path
    server_name: str
    port: int
    shared_secret: str

    @property
    def path(self) -> Path:
        return self.directory / CONFIG_NAME

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"


def write_config(
    directory: Path, *, server_name: str, port: int, in_memory: bool = False, open_registration: bool = False
) -> SynapseConfig:
    """Synapse's config in ``directory``, written on the first call and read back after (the port
    is rewritten when it changed). ``in_memory``: an SQLite database that lives as long as the
    process (tests); ``open_registration``: anyone may register (tests, benchmarks)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / CONFIG_NAME
    if path.exists():
        config = yaml.safe_load(path.read_text())
        if config["listeners"][0]["port"] != port:
            config["listeners"][0]["port"] = port
            path.write_text(yaml.safe_dump(config))
        return SynapseConfig(directory, config["server_name"], port, config["registration_shared_secret"])
    key_path = directory / "signing.key"
    if not key_path.exists():
        key = signedjson.key.generate_signing_key("a_" + secrets.token_hex(2))
        with key_path.open("w") as out:
            signedjson.key.write_signing_keys(out, [key])
        key_path.chmod(0o600)
    shared = secrets.token_urlsafe(32)
    config = {
        "server_name": server_name,
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}],
        "database": {"name": "sqlite3",
                     "args": {"database": ":memory:" if in_memory else str(directory / "homeserver.db")}},
        "log_config": None,
        "media_store_path": str(directory / "media"),
        "signing_key_path": str(key_path),
        "registration_shared_secret": shared,
        "macaroon_secret_key": secrets.token_urlsafe(32),
        "form_secret": secrets.token_urlsafe(32),
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "enable_registration": open_registration,
        "enable_registration_without_verification": open_registration,
        "presence": {"enabled": False},
        "rc_message": _GENEROUS,
        "rc_login": {"address": _GENEROUS, "account": _GENEROUS, "failed_attempts": _GENEROUS},
        "rc_registration": _GENEROUS,
        "rc_joins": {"local": _GENEROUS, "remote": _GENEROUS},
        "rc_joins_per_room": _GENEROUS,
        "rc_room_creation": _GENEROUS,
        "rc_profile": _GENEROUS,
        "rc_invites": {"per_room": _GENEROUS, "per_user": _GENEROUS, "per_issuer": _GENEROUS},
    }  # fmt: skip
    if in_memory:
        config["bcrypt_rounds"] = 4  # throwaway users: registering one is then milliseconds, not a third of a second
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return SynapseConfig(directory, server_name, port, shared)


async def start(config: SynapseConfig, log_path: Path | None = None) -> asyncio.subprocess.Process:
    """Start Synapse on ``config`` (its output to ``log_path``, or discarded)."""
    sink = log_path.open("ab") if log_path is not None else None
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synapse.app.homeserver", "-c", str(config.path),
            stdout=sink or asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.STDOUT, cwd=config.directory,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
    finally:
        if sink is not None:
            sink.close()


async def until_ready(config: SynapseConfig, process: asyncio.subprocess.Process, within: float = 60.0) -> None:
    """Wait until Synapse answers ``/health``; ``StartupError`` if it exits or takes too long."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                raise StartupError(f"Synapse exited with {process.returncode}; see {config.directory}")
            try:
                async with session.get(config.url + "/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if loop.time() > deadline:
                raise StartupError(f"Synapse did not answer within {within:.0f} s")
            await asyncio.sleep(0.05)


async def register_user(config: SynapseConfig, localpart: str, password: str, *, admin: bool = False) -> None:
    """Register a user with the shared secret (Synapse's own ``register_new_matrix_user``).
    A user that already exists is not an error."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synapse._scripts.register_new_matrix_user", "-c", str(config.path),
        "-u", localpart, "-p", password, "--admin" if admin else "--no-admin", "--exists-ok", config.url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise StartupError(f"registering {localpart} on Synapse failed: {out.decode(errors='replace')[-300:]}")


async def stop(process: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        log.warning("Synapse %s did not stop in time; killing it", process.pid)
        process.kill()
        await process.wait()
