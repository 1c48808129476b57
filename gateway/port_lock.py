"""The media port belongs to one Pepper: a lock file per port, held with ``flock``.

The media processes of ``pepper serve`` share their port with ``SO_REUSEPORT`` (gateway.media_procs),
so the kernel would let a second Pepper of the same user bind it too, and hand it some of the
first one's calls. Before binding, ``serve`` takes an exclusive ``flock`` on
``<runtime dir>/media-port-<port>.lock`` and keeps it for its life (its media processes, spawned,
stop when it goes); a second server on that port finds it held and refuses, naming the data dir
that holds it. The kernel releases a ``flock`` when its holder exits, so a crash never leaves a
stale lock; the file's contents are only a note of who holds it, and a clean stop removes it.

The runtime dir is ``$XDG_RUNTIME_DIR/pepper``, else ``/tmp/pepper-<uid>``, private to the user
(``SO_REUSEPORT`` only lets sockets of the same user share a port, so other users need no lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from pathlib import Path

from core.errors import StartupError


class MediaPortBusy(StartupError):
    code = "media-port-held"


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "pepper" if base else Path("/tmp") / f"pepper-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise StartupError(f"cannot use the runtime dir {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StartupError(f"the runtime dir {path} is not a private folder of this user; remove it")
    return path


class PortLock:
    """An exclusive hold on one media port, released when this object goes (or the process ends)."""

    def __init__(self, port: int, data_dir: Path, *, folder: Path | None = None):
        self._fd: int | None = None
        self._pid = os.getpid()
        self.port = port
        self.path = (folder or runtime_dir()) / f"media-port-{port}.lock"
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise MediaPortBusy(
                    f"media port {port} is already taken by the Pepper of data dir"
                    f" {holder.get('data_dir', 'unknown')} (pid {holder.get('pid', 'unknown')});"
                    " stop it or set PEPPER_MEDIA_PORT to another"
                ) from None
            # A holder that was releasing removed the file after this process opened it: the lock
            # just taken is on a file no one else will open. Take the one at the path instead.
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"data_dir": str(data_dir), "pid": os.getpid()}).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None and os.getpid() == self._pid:  # not from a forked copy
            # Removed while still held (so no one locks a file about to go), then closed: the last
            # close releases the flock.
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()


def _holder(fd: int) -> dict[str, object]:
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def hold_media_port(port: int, data_dir: Path) -> PortLock | None:
    """Hold ``port`` for this server (``None`` for port 0: the kernel picks a free one)."""
    return PortLock(port, data_dir) if port else None
