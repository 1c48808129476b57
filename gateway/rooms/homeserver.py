"""Where Pepper's Matrix user lives: the embedded Synapse, or the homeserver the settings name.

Without ``PEPPER_MATRIX_HOMESERVER``, ``pepper serve`` runs :class:`EmbeddedHomeserver` (Synapse
on SQLite, 127.0.0.1:``PEPPER_MATRIX_PORT``, its config generated in ``<data dir>/matrix/synapse``
on the first start, Pepper's own user registered with a password kept in ``<data dir>/matrix``).
With it, Pepper logs into that homeserver as ``PEPPER_MATRIX_USER``.

Pepper's session (access token and device) is kept in ``<data dir>/matrix/session.json`` and
reused, so every process (the sync loop, the CLI) posts as the same device: the homeserver
deduplicates transaction ids per device, which is what makes a post retried after a crash the
same post (``gateway.rooms.follow``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
from pathlib import Path
from typing import IO

from core.adapters.matrix import MatrixClient, MatrixError
from core.adapters.matrix import synapse as synapse_process
from core.errors import ConfigError
from core.settings import Settings
from gateway.children import cancelled

log = logging.getLogger(__name__)

RESTART_DELAY = 1.0
LOCK_POLL = 0.05  # seconds between tries for the session lock while another process logs in


def matrix_dir(settings: Settings) -> Path:
    return settings.data_dir / "matrix"


def homeserver_url(settings: Settings) -> str:
    return settings.matrix_homeserver or f"http://127.0.0.1:{settings.matrix_port}"


def embedded_config(settings: Settings) -> synapse_process.SynapseConfig:
    return synapse_process.write_config(
        matrix_dir(settings) / "synapse", server_name=settings.matrix_server_name, port=settings.matrix_port
    )


def _secret_file(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_urlsafe(24)
    path.write_text(value)
    path.chmod(0o600)
    return value


def embedded_password(settings: Settings) -> str:
    return _secret_file(matrix_dir(settings) / "pepper.password")


class EmbeddedHomeserver:
    """Synapse as one more child of ``pepper serve``: started (and Pepper's user registered) before
    the rooms process, restarted when it dies, stopped with SIGTERM."""

    label = "homeserver"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._config = embedded_config(settings)
        self._process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.ready = asyncio.Event()

    @property
    def pids(self) -> list[int]:
        process = self._process
        return [process.pid] if process is not None and process.returncode is None else []

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name="pepper-homeserver")

    async def _supervise(self) -> None:
        log_path = matrix_dir(self._settings) / "synapse.log"
        while not self._stopping:
            process = self._process = await synapse_process.start(self._config, log_path)
            log.info("started the embedded homeserver (Synapse): %s", process.pid)
            try:
                await synapse_process.until_ready(self._config, process)
                await synapse_process.register_user(
                    self._config, self._settings.matrix_user, embedded_password(self._settings)
                )
                self.ready.set()
            except Exception:
                log.exception("the embedded homeserver did not start")
            code = await process.wait()
            self.ready.clear()
            if self._stopping:
                return
            log.error("homeserver %s exited with %s; starting another", process.pid, code)
            await asyncio.sleep(RESTART_DELAY)

    async def stop(self, grace: float) -> None:
        self._stopping = True
        await cancelled(self._watch)
        if self._process is not None:
            await synapse_process.stop(self._process, grace + 5)
        log.info("homeserver stopped")


def _user_id(settings: Settings) -> str:
    user = settings.matrix_user
    if user.startswith("@"):
        return user
    if settings.matrix_homeserver is None:
        return f"@{user}:{settings.matrix_server_name}"
    raise ConfigError("PEPPER_MATRIX_USER must be a full Matrix ID (@name:server) with PEPPER_MATRIX_HOMESERVER")


async def pepper_client(settings: Settings) -> MatrixClient:
    """Pepper's logged-in client: the stored session when it is for this homeserver and user, else
    a fresh login (stored for next time). ``MatrixError`` when the homeserver cannot be reached.

    The rooms process, the scheduler's room poster and the CLI may all ask at a first start: a lock
    file makes the first one log in and the others wait for its stored session, so Pepper stays
    one device (two logins would make two, each with its own keys and its own transaction ids)."""
    url, user_id = homeserver_url(settings), _user_id(settings)
    if settings.matrix_access_token is not None:
        return MatrixClient(url, user_id, access_token=settings.matrix_access_token.get_secret_value())
    directory = matrix_dir(settings)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _lock_file(directory) as lock:
        # Polled, not a blocking flock in a thread: a cancelled wait must not leave a thread that
        # takes the lock later on a file descriptor already closed (or reused).
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(LOCK_POLL)
        try:
            return await _stored_or_new_session(settings, url, user_id, directory / "session.json")
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _lock_file(directory: Path) -> IO[str]:
    return open(directory / "session.lock", "a")  # closed by the caller's with


def _stored(path: Path) -> dict[str, str] | None:
    return json.loads(path.read_text()) if path.exists() else None


async def _stored_or_new_session(settings: Settings, url: str, user_id: str, path: Path) -> MatrixClient:
    stored = _stored(path)
    if stored is not None:
        if stored.get("homeserver") == url and stored.get("user_id") == user_id:
            return MatrixClient(url, user_id, access_token=stored["access_token"], device_id=stored["device_id"])
    if settings.matrix_homeserver is None:
        password = embedded_password(settings)
    elif settings.matrix_password is not None:
        password = settings.matrix_password.get_secret_value()
    else:
        raise ConfigError("set PEPPER_MATRIX_PASSWORD or PEPPER_MATRIX_ACCESS_TOKEN for PEPPER_MATRIX_HOMESERVER")
    client = MatrixClient(url, user_id)
    try:
        await client.login(password)
    except MatrixError:
        await client.close()
        raise
    session = json.dumps({"homeserver": url, "user_id": client.user_id, "access_token": client.access_token,
                          "device_id": client.device_id})  # fmt: skip
    _store(path, session)
    return client


def _store(path: Path, session: str) -> None:
    """Written whole and private from its first byte: a reader never sees half a file, and the
    token is never readable by others (not even between a write and a chmod)."""
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(session)
    os.replace(partial, path)
