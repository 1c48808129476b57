"""``pepper backup`` and ``pepper restore``: against real Postgres (embedded in a data dir, and the
test server as an external one), with the real code paths writing while the dump runs."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
from pathlib import Path
from uuid import UUID

import pytest
from cli_support import PEPPER, run_cli, start_serve, stop, wait_healthy

from core import identity
from core.conversation import conversation_for, record_inbound, record_outbound, start_turn
from core.settings import Settings, load_settings
from core.store import Database, open_store
from core.store.backup import MAGIC, BackupError, decrypt, encrypt
from core.store.migrations import load_migrations
from core.testing.processes import free_port
from core.tools.connectors import Connectors, connection_secret
from core.vault import Vault

PASSPHRASE = "correct horse battery staple"


async def _seal_connection(db: Database, vault: Vault, account_id: UUID) -> UUID:
    return await db.fetchval(
        "INSERT INTO connections (account_id, provider, label, config, sealed) VALUES ($1, 'caldav', 'cal', '{}', $2)"
        " RETURNING id",
        account_id,
        vault.seal({"password": "caldav-s3cret"}),
    )


async def _back_up_under_load(settings: Settings, path: Path, env: dict[str, str]) -> tuple[list, int, UUID]:
    """Write messages and turns through the real code paths while ``pepper backup`` runs; returns
    the writes in commit order (one writer, each awaited), how many came before the backup began,
    and the sealed connection's id."""
    written: list[tuple[str, object]] = []
    history, stop_writing = asyncio.Event(), asyncio.Event()
    async with open_store(settings, serving=True) as db:
        account = await identity.create_account(db, "Ada")
        conversation = await conversation_for(db, account.id)
        connection_id = await _seal_connection(db, Vault.from_settings(settings), account.id)

        async def write() -> None:
            i = 0
            while not stop_writing.is_set():
                message, _ = await record_inbound(db, account.id, "sms", f"message {i}", provider_message_id=f"SM{i}")
                written.append(("message", message.id))
                turn_id = await start_turn(db, conversation, channel="sms")
                written.append(("turn", turn_id))
                reply = await record_outbound(db, conversation, "sms", f"reply {i}", turn_id=turn_id)
                written.append(("message", reply.id))
                i += 1
                if i == 100:
                    history.set()

        writer = asyncio.create_task(write())
        await history.wait()
        before = len(written)
        dump = await asyncio.create_subprocess_exec(*PEPPER, "backup", str(path), env=env, stderr=subprocess.PIPE)
        _, err = await dump.communicate()
        after = len(written)
        await asyncio.sleep(0.2)  # and more after it
        stop_writing.set()
        await writer
    assert dump.returncode == 0, err.decode()
    assert after > before, "nothing was written while the backup ran"
    return written, before, connection_id


async def _restored(settings: Settings, connection_id: UUID) -> tuple[set, set, set, dict | None]:
    async with open_store(settings, serving=False) as db:
        messages = {r["id"] for r in await db.fetch("SELECT id FROM messages")}
        turns = {r["id"] for r in await db.fetch("SELECT id FROM turns")}
        replied = {r["turn_id"] for r in await db.fetch("SELECT turn_id FROM messages WHERE turn_id IS NOT NULL")}
        secret = await connection_secret(db, Connectors(vault=Vault.from_settings(settings)), connection_id)
    return messages, turns, replied, secret


def test_a_backup_taken_under_load_restores_every_message_turn_and_secret(tmp_path, subprocess_env):
    source, target, path = tmp_path / "source", tmp_path / "restored", tmp_path / "pepper.backup"
    env = {**subprocess_env, "PEPPER_BACKUP_PASSPHRASE": PASSPHRASE}
    written, before, connection_id = asyncio.run(
        _back_up_under_load(load_settings(data_dir=source), path, {**env, "PEPPER_DATA_DIR": str(source)})
    )

    restored = subprocess.run(
        [*PEPPER, "restore", str(path)], env={**env, "PEPPER_DATA_DIR": str(target)}, capture_output=True, text=True
    )
    assert restored.returncode == 0, restored.stderr
    assert (target / "secret.key").read_text() == (source / "secret.key").read_text()
    assert (target / "secret.key").stat().st_mode & 0o777 == 0o600

    # The restored data dir serves, on the schema it was backed up with.
    port = free_port()
    proc = start_serve(subprocess_env, target, port)
    try:
        health = wait_healthy(port, proc)
        assert health["schema_version"] == load_migrations()[-1].version and health["pending_migrations"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)

    messages, turns, replied, secret = asyncio.run(_restored(load_settings(data_dir=target), connection_id))
    found = {("message", m) for m in messages} | {("turn", t) for t in turns}
    present = [write in found for write in written]
    kept = present.index(False) if False in present else len(present)
    # One snapshot: everything written before the backup began, then an unbroken run of what came
    # during it, and nothing written after a write that is missing.
    assert kept >= before
    assert not any(present[kept:]), "the backup holds a later write without an earlier one"
    assert len(messages) == sum(1 for kind, _ in written[:kept] if kind == "message")
    assert len(turns) == sum(1 for kind, _ in written[:kept] if kind == "turn")
    assert replied <= turns
    assert secret == {"password": "caldav-s3cret"}


@pytest.fixture
def backup_file(db_url, monkeypatch, capsys, tmp_path) -> Path:
    """A backup of a test database (as an external store) holding a message and a sealed secret."""

    async def fill() -> None:
        db = await Database.open(db_url, max_size=2)
        try:
            account = await identity.create_account(db, "Ada")
            await record_inbound(db, account.id, "sms", "the door code is 4411")
            vault = Vault(key_file=tmp_path / "source" / "secret.key")
            await _seal_connection(db, vault, account.id)
        finally:
            await db.close()

    asyncio.run(fill())
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "source"))
    monkeypatch.setenv("PEPPER_BACKUP_PASSPHRASE", PASSPHRASE)
    path = tmp_path / "pepper.backup"
    code, out, err = run_cli(monkeypatch, capsys, "backup", str(path))
    assert code == 0, err
    assert "the store at postgresql://" in out and "and secret.key" in out
    monkeypatch.delenv("DATABASE_URL")
    return path


def test_a_backup_file_reveals_nothing_without_the_passphrase(backup_file, tmp_path):
    data = backup_file.read_bytes()
    key = (tmp_path / "source" / "secret.key").read_text().strip().encode()
    for plain in (b"4411", b"door code", b"Ada", b"PGDMP", b"CREATE TABLE", b"messages", key):
        assert plain not in data
    assert backup_file.stat().st_mode & 0o777 == 0o600
    # And with it, the payload is there.
    with backup_file.open("rb") as inp:
        assert b"PGDMP" in b"".join(decrypt(inp, PASSPHRASE))


def _restore(monkeypatch, capsys, path: Path, data_dir: Path) -> tuple[int, str]:
    monkeypatch.setenv("PEPPER_DATA_DIR", str(data_dir))
    code, _, err = run_cli(monkeypatch, capsys, "restore", str(path))
    return code, err


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pepper: error: "), err
    return lines[0]


def test_a_wrong_passphrase_a_truncated_or_a_garbage_file_restores_nothing(backup_file, monkeypatch, capsys, tmp_path):
    target = tmp_path / "target"
    monkeypatch.setenv("PEPPER_BACKUP_PASSPHRASE", "not the passphrase")
    code, err = _restore(monkeypatch, capsys, backup_file, target)
    assert code == 1 and "wrong passphrase" in _one_error(err)
    assert not target.exists()

    monkeypatch.setenv("PEPPER_BACKUP_PASSPHRASE", PASSPHRASE)
    data = backup_file.read_bytes()
    cases = [("truncated", data[: len(data) // 2]), ("truncated", data[:-1]), ("truncated", data[:20]),
             ("not a Pepper backup file", os.urandom(len(data))), ("not a Pepper backup file", b""),
             ("damaged", data[:-100] + bytes([data[-100] ^ 1]) + data[-99:]),
             ("after its end", data + b"\0")]  # fmt: skip
    for expected, content in cases:
        broken = tmp_path / "broken.backup"
        broken.write_bytes(content)
        code, err = _restore(monkeypatch, capsys, broken, target)
        assert code == 1 and expected in _one_error(err), (expected, err)
        assert not target.exists()


def test_restore_refuses_a_data_dir_that_is_not_empty(backup_file, monkeypatch, capsys, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    code, err = _restore(monkeypatch, capsys, backup_file, target)
    assert code == 1 and "is not empty" in _one_error(err)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_restore_into_an_empty_external_database_and_refuse_a_used_one(
    backup_file, db_url, db_factory, monkeypatch, capsys, tmp_path
):
    monkeypatch.setenv("DATABASE_URL", db_url)  # the source itself: in use
    code, err = _restore(monkeypatch, capsys, backup_file, tmp_path / "target")
    assert code == 1 and "is not empty" in _one_error(err)

    empty = asyncio.run(db_factory.create_empty())
    try:
        monkeypatch.setenv("DATABASE_URL", empty)
        code, err = _restore(monkeypatch, capsys, backup_file, tmp_path / "target")
        assert code == 0, err
        monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "target"))
        code, out, _ = run_cli(monkeypatch, capsys, "account", "list")
        assert code == 0 and "Ada" in out
        assert (tmp_path / "target" / "secret.key").read_text() == (tmp_path / "source" / "secret.key").read_text()
    finally:
        asyncio.run(db_factory.drop(empty))


def test_the_passphrase_comes_from_a_file_and_never_from_nowhere(backup_file, monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("PEPPER_BACKUP_PASSPHRASE")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: no prompt
    code, err = _restore(monkeypatch, capsys, backup_file, tmp_path / "target")
    assert code == 1 and "no passphrase" in _one_error(err)

    wrong = tmp_path / "wrong.txt"
    wrong.write_text("nope\n")
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "target"))
    code, _, err = run_cli(monkeypatch, capsys, "restore", str(backup_file), "--passphrase-file", str(wrong))
    assert code == 1 and "wrong passphrase" in _one_error(err)


def test_chunks_cannot_be_dropped_reordered_or_cut_at_a_chunk_boundary():
    out = io.BytesIO()
    encrypt([b"a" * 10, b"b" * 10, b"c" * 5], out, PASSPHRASE, chunk_size=8)
    data = out.getvalue()
    assert b"".join(decrypt(io.BytesIO(data), PASSPHRASE)) == b"a" * 10 + b"b" * 10 + b"c" * 5

    header_end = len(MAGIC) + 2 + int.from_bytes(data[len(MAGIC) : len(MAGIC) + 2], "big")
    frames, rest = [], data[header_end:]
    while rest:
        size = 5 + int.from_bytes(rest[1:5], "big")
        frames.append(rest[:size])
        rest = rest[size:]
    assert len(frames) == 4  # 8 + 8 + 8 + 1 bytes, the last flagged final
    header = data[:header_end]
    for broken, expected in (
        (header + b"".join(frames[:-1]), "truncated"),  # the final chunk dropped whole
        (header + frames[1] + frames[0] + b"".join(frames[2:]), "damaged"),
        (header + frames[0] + b"".join(frames[2:]), "damaged"),
    ):
        with pytest.raises(BackupError, match=expected):
            b"".join(decrypt(io.BytesIO(broken), PASSPHRASE))


def test_a_restore_that_fails_half_way_leaves_the_data_dir_as_empty_as_it_was(monkeypatch, capsys, tmp_path):
    # Sealed with the right passphrase, but what it holds is no dump: pg_restore refuses it after the
    # new cluster is made.
    manifest = json.dumps({"pepper_backup": 1, "created_at": "2026-01-01T00:00:00+00:00", "secret_key": "k"}).encode()
    path = tmp_path / "bad-dump.backup"
    with path.open("wb") as out:
        encrypt([len(manifest).to_bytes(4, "big") + manifest, b"not a dump at all"], out, PASSPHRASE)
    monkeypatch.setenv("PEPPER_BACKUP_PASSPHRASE", PASSPHRASE)
    target = tmp_path / "target"
    target.mkdir()
    code, err = _restore(monkeypatch, capsys, path, target)
    assert code == 1 and "pg_restore failed" in _one_error(err)
    assert list(target.iterdir()) == []
