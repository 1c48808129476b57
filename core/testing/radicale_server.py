"""A real CalDAV server for tests: Radicale, started on 127.0.0.1 in a child process.

``with RadicaleServer(folder) as server:`` then ``server.make_calendar("ada", "work")`` returns
the collection URL. Authentication is off (any user name and password are accepted) unless
``users`` maps user names to passwords: then Radicale checks them (htpasswd) and refuses others.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from core.testing.processes import free_port


class RadicaleServer:
    def __init__(self, folder: Path, users: dict[str, str] | None = None):
        self.folder = folder
        self.users = users
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "radicale.log").open("wb") as log:
            self._spawn(log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError("radicale exited; see " + str(self.folder / "radicale.log"))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("radicale did not start")

    def _spawn(self, log: object) -> None:
        auth = ["--auth-type", "none"]
        if self.users is not None:
            htpasswd = self.folder / "users"
            htpasswd.write_text("".join(f"{user}:{password}\n" for user, password in self.users.items()))
            auth = [
                "--auth-type", "htpasswd", "--auth-htpasswd-filename", str(htpasswd),
                "--auth-htpasswd-encryption", "plain",
            ]  # fmt: skip
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "radicale", "--server-hosts", f"127.0.0.1:{self.port}", *auth,
                "--storage-filesystem-folder", str(self.folder / "collections"), "--logging-level", "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def make_calendar(self, user: str, name: str) -> str:
        url = f"{self.url}/{user}/{name}/"
        response = httpx.request("MKCALENDAR", url, auth=(user, (self.users or {}).get(user, "x")))
        if response.status_code not in (201, 405):
            raise RuntimeError(f"MKCALENDAR answered {response.status_code}")
        return url

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def __enter__(self) -> RadicaleServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
