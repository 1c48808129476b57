"""A real IMAP server for tests: Debian's Dovecot (``dovecot-imapd``), started on 127.0.0.1 as a
test instance of its own: its config, run and state folders, a passwd-file of users with plain
passwords and each user's maildir all live under the test's folder, every service runs as the
user running the test (or, when the test runs as root, which Dovecot's login processes refuse,
as ``nobody`` in a folder of its own under the system's temporary folder, which a root-only test
folder would not let it into), and it stops with the test.

``with DovecotServer(folder, {"ada": "pw"}) as imap:`` then ``imap.deliver("ada", raw_bytes)``
puts a message in ada's INBOX (``seen=True`` as already read); ``imap.port`` is the IMAP port
(plain IMAP on loopback: the test instance has no certificate).
"""

from __future__ import annotations

import email
import grp
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

from core.testing.processes import free_port

DOVECOT = "/usr/sbin/dovecot"


def available() -> bool:
    return Path(DOVECOT).exists()


class DovecotServer:
    def __init__(self, folder: Path, users: dict[str, str]):
        self.as_root = os.getuid() == 0
        self.uid, self.gid = os.getuid(), os.getgid()
        if self.as_root:
            nobody = pwd.getpwnam("nobody")
            self.uid, self.gid = nobody.pw_uid, nobody.pw_gid
            folder = Path(tempfile.mkdtemp(prefix="pepper-dovecot-"))
            folder.chmod(0o755)
        self.folder = folder
        self.users = users
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._n = itertools.count(1)

    def maildir(self, user: str) -> Path:
        return self.folder / "home" / user / "Maildir"

    def deliver(self, user: str, raw: bytes, *, seen: bool = False) -> None:
        """Put one message in the user's INBOX, as a delivery agent does (maildir: tmp, then new or cur)."""
        box = self.maildir(user)
        name = f"{time.time_ns()}.P{os.getpid()}Q{next(self._n)}.pepper-test"
        (box / "tmp" / name).write_bytes(raw)
        final = box / "cur" / f"{name}:2,S" if seen else box / "new" / name
        os.rename(box / "tmp" / name, final)
        self._own(final)
        # Dovecot takes a maildir file's time as the message's arrival (INTERNALDATE, what SEARCH
        # SINCE compares): the Date header's, as if it arrived when sent.
        date = email.message_from_bytes(raw).get("Date")
        if date:
            stamp = parsedate_to_datetime(date).timestamp()
            os.utime(final, (stamp, stamp))

    def _own(self, path: Path) -> None:
        if self.as_root:
            os.chown(path, self.uid, self.gid)

    def _config(self) -> Path:
        user = pwd.getpwuid(self.uid).pw_name
        group = grp.getgrgid(self.gid).gr_name
        for sub in ("run", "state", "home"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for name in self.users:
            for sub in ("tmp", "new", "cur"):
                (self.maildir(name) / sub).mkdir(parents=True, exist_ok=True)
        (self.folder / "passwd").write_text("".join(f"{u}:{{PLAIN}}{p}::::::\n" for u, p in self.users.items()))
        for path in [self.folder, *self.folder.rglob("*")]:
            self._own(path)
        home = self.folder / "home"
        conf = self.folder / "dovecot.conf"
        conf.write_text(
            f"""
base_dir = {self.folder / "run"}
state_dir = {self.folder / "state"}
log_path = {self.folder / "dovecot.log"}
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = {self.uid}
first_valid_gid = {self.gid}
mail_location = maildir:~/Maildir
passdb {{
  driver = passwd-file
  args = {self.folder / "passwd"}
}}
userdb {{
  driver = static
  args = uid={self.uid} gid={self.gid} home={home}/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    port = 0
  }}
  chroot =
  user = {user}
}}
service anvil {{
  chroot =
}}
service stats {{
  unix_listener stats-reader {{
    user = {user}
  }}
  unix_listener stats-writer {{
    user = {user}
  }}
}}
"""
        )
        return conf

    def start(self) -> None:
        conf = self._config()
        log = (self.folder / "stderr.log").open("wb")
        self._own(conf)
        who = {"user": self.uid, "group": self.gid, "extra_groups": []} if self.as_root else {}
        self.process = subprocess.Popen([DOVECOT, "-F", "-c", str(conf)], stdout=log, stderr=log, **who)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("dovecot exited: " + self._logs())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    if sock.recv(64).startswith(b"* OK"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("dovecot did not start: " + self._logs())

    def _logs(self) -> str:
        parts = []
        for name in ("stderr.log", "dovecot.log"):
            path = self.folder / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.folder if self.as_root else self.folder / "run", ignore_errors=True)

    def __enter__(self) -> DovecotServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
