"""Secrets at rest: what Pepper stores for a person's connected accounts (OAuth tokens, a CalDAV
password) is sealed with Fernet (AES-128-CBC plus HMAC-SHA256, from ``cryptography``).

The key comes from ``PEPPER_SECRET_KEY`` (one or more Fernet keys, comma-separated: the first
seals, every one opens, so a key can be rotated), or else from ``<data dir>/secret.key``, created
with mode 0600 the first time a secret is sealed. Losing the key loses the connections: back the
file up with the database.

A key that does not open a stored secret is an operator problem, never a disconnected account:
:class:`SecretKeyError` names the key and what to do.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from core.errors import ConfigError, PepperError

KEY_FILE_NAME = "secret.key"


class SecretKeyError(PepperError):
    """A stored secret does not open with the configured key (the key changed or was lost)."""

    code = "secret-key-mismatch"


def generate_key() -> str:
    """A new random Fernet key (url-safe base64 of 32 bytes), as ``PEPPER_SECRET_KEY`` takes it."""
    return Fernet.generate_key().decode()


def check_keys(text: str, where: str) -> int:
    """How many Fernet keys ``text`` holds; raises ``ConfigError`` naming ``where`` when it holds
    none or one is malformed (what ``pepper doctor`` checks before anything is sealed)."""
    return len(_parse_keys(text, where))


def _parse_keys(text: str, where: str) -> list[Fernet]:
    keys = [k.strip() for k in text.replace("\n", ",").split(",") if k.strip()]
    if not keys:
        raise ConfigError(f"{where} holds no key")
    try:
        return [Fernet(k) for k in keys]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where} is not a Fernet key (32 url-safe base64-encoded bytes)") from exc


class Vault:
    """Seals and opens small JSON secrets. Thread- and task-safe; the key file is read once."""

    def __init__(self, keys: str | None = None, *, key_file: Path | None = None):
        if keys is None and key_file is None:
            raise ConfigError("a vault needs PEPPER_SECRET_KEY or a data dir for its key file")
        self._keys_text = keys
        self.key_file = key_file
        self._fernet: MultiFernet | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> Vault:
        key = settings.secret_key
        if key is not None and key.get_secret_value().strip():
            return cls(key.get_secret_value())
        return cls(key_file=Path(settings.data_dir) / KEY_FILE_NAME)

    @property
    def where(self) -> str:
        """Where the key comes from, for messages."""
        return "PEPPER_SECRET_KEY" if self._keys_text is not None else f"the key file {self.key_file}"

    def _multi(self, *, create: bool = False) -> MultiFernet:
        with self._lock:
            if self._fernet is None:
                text = self._keys_text if self._keys_text is not None else self._read_key_file(create)
                self._fernet = MultiFernet(_parse_keys(text, self.where))
            return self._fernet

    def _read_key_file(self, create: bool) -> str:
        path = self.key_file
        assert path is not None
        try:
            return path.read_text(encoding="ascii")
        except FileNotFoundError:
            if not create:
                # Opening needs the key that sealed; a fresh one would open nothing.
                raise SecretKeyError(
                    f"{self.where} is missing, so stored connection secrets cannot be opened: restore it "
                    "from a backup (or set PEPPER_SECRET_KEY), or connect the accounts again"
                ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.where}: {exc.strerror or exc}") from exc
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_EXCL: two processes starting at once must not each write a different key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text(encoding="ascii")
        except OSError as exc:
            raise ConfigError(f"cannot create {self.where}: {exc.strerror or exc}") from exc
        key = generate_key()
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key + "\n")
        return key

    def seal(self, secret: dict[str, Any]) -> bytes:
        """The Fernet token of ``secret`` as JSON (bytes to store; never contains the plaintext)."""
        return self._multi(create=True).encrypt(json.dumps(secret, separators=(",", ":")).encode())

    def unseal(self, token: bytes) -> dict[str, Any]:
        """The secret sealed in ``token``; raises ``SecretKeyError`` when no configured key opens it."""
        try:
            plain = self._multi().decrypt(bytes(token))
        except InvalidToken:
            raise SecretKeyError(self.mismatch_message()) from None
        return json.loads(plain)

    def rotate(self, token: bytes) -> bytes:
        """``token`` sealed again under the first (newest) key."""
        try:
            return self._multi().rotate(bytes(token))
        except InvalidToken:
            raise SecretKeyError(self.mismatch_message()) from None

    def mismatch_message(self) -> str:
        return (
            f"a stored connection secret does not open with {self.where}: the key was changed or lost. "
            "Restore the old key (or list it after the new one in PEPPER_SECRET_KEY), or connect the account again"
        )
