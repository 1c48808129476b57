"""The first hour with `pepper`: the README's first setup runs as written (twice), accounts can be
renamed and deleted, and a weak PIN is refused."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli

from core import identity
from core.errors import InvalidInput

README = Path(__file__).resolve().parent.parent / "README.md"


def first_setup_block() -> str:
    text = README.read_text()
    found = re.search(r"## First setup\b.*?```sh\n(.*?)```", text, re.S)
    assert found, "the README has no first-setup block"
    return found[1]


def test_the_readme_first_setup_runs_as_written_twice(db_url, subprocess_env, tmp_path):
    # The block as a newcomer runs it from the clone: `.venv/bin/pepper` is the installed command.
    installed = shutil.which("pepper", path=os.path.dirname(sys.executable))
    assert installed is not None
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "pepper").symlink_to(installed)
    env = {**subprocess_env, "DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}  # no pepper on the PATH before
    script = "set -eu\n" + first_setup_block()
    for run in range(2):
        done = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, input="739154\n", capture_output=True, text=True
        )
        assert done.returncode == 0, f"run {run + 1}: {done.stderr}"
        assert "pepper: error" not in done.stderr and "Traceback" not in done.stderr
    assert "already exists; nothing changed" in done.stdout
    assert "is already on Ada Lovelace; nothing changed" in done.stdout
    listed = subprocess.run(
        [installed, "account", "list"], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len([line for line in listed if "Ada Lovelace" in line]) == 1
    shown = subprocess.run([installed, "account", "show", "Ada Lovelace"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "phone  +442079460123  verified" in shown.stdout and "PIN set" in shown.stdout


def test_a_handle_on_another_account_stays_an_error(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    run_cli(monkeypatch, capsys, "account", "create", "Bob")
    assert run_cli(monkeypatch, capsys, "handle", "add", "Ada", "phone", "+14155552671")[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, "handle", "add", "Bob", "phone", "(415) 555-2671", "--verified")
    assert (
        code == 1
        and err.strip() == "pepper: error: that phone handle already belongs to another account; nothing changed"
    )
    # Adding it again to Ada with --verified verifies it and adds nothing.
    code, out, _ = run_cli(monkeypatch, capsys, "handle", "add", "Ada", "phone", "+1 415 555 2671", "--verified")
    assert code == 0 and "already on Ada; now verified" in out
    code, out, _ = run_cli(monkeypatch, capsys, "account", "show", "Ada")
    assert out.count("+14155552671") == 1 and "verified" in out


def test_rename_an_account(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    run_cli(monkeypatch, capsys, "account", "create", "Bob")
    code, out, _ = run_cli(monkeypatch, capsys, "account", "rename", "Ada", "Ada Lovelace")
    assert code == 0 and "to 'Ada Lovelace'" in out
    assert run_cli(monkeypatch, capsys, "account", "show", "Ada Lovelace")[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, "account", "rename", "Bob", "Ada Lovelace")
    assert code == 1 and "another account is already named 'Ada Lovelace'" in err
    assert run_cli(monkeypatch, capsys, "account", "show", "Bob")[0] == 0


async def _people(db) -> tuple[identity.Account, identity.Account]:
    ada = await identity.create_account(db, "Ada")
    bob = await identity.create_account(db, "Bob")
    for person, number, sid in ((ada, "+14155552671", "CAada"), (bob, "+14155552672", "CAbob")):
        phone = await identity.add_handle(db, person.id, "phone", number, verified=True)
        await identity.set_consent(db, phone.id, ["sms"], opted_out=True, source="test")
        await identity.assign_line(db, "+1415555010" + number[-1], "personal", person.id)
        conversation = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", person.id)
        await db.execute(
            "INSERT INTO messages (conversation_id, handle_id, channel, direction, body)"
            " VALUES ($1, $2, 'sms', 'inbound', 'my secret plans')",
            conversation,
            phone.id,
        )
        await db.execute(
            "INSERT INTO calls (call_sid, account_id, caller, handle_id, route) VALUES ($1, $2, $3, $4, 'owner')",
            sid,
            person.id,
            number,
            phone.id,
        )
        await db.execute(
            "INSERT INTO call_stream_tokens (token_hash, call_sid, expires_at) VALUES ($1, $2, now())",
            sid.encode(),
            sid,
        )
        await db.execute(
            "INSERT INTO security_events (kind, detail) VALUES ('call-verification-failed', $1::jsonb)",
            f'{{"call_sid": "{sid}"}}',
        )
    return ada, bob


async def _holdings(db, account_id) -> dict[str, int]:
    """Rows that point at the account, table by table (every table with an account_id column)."""
    tables = await db.fetch(
        "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t"
        " USING (table_schema, table_name)"
        " WHERE c.table_schema = 'public' AND c.column_name = 'account_id' AND t.table_type = 'BASE TABLE'"
        "   AND NOT (SELECT relispartition FROM pg_class"
        "            WHERE oid = ('public.' || quote_ident(c.table_name))::regclass)"
    )
    counts = {}
    for row in tables:
        name = row["table_name"]
        counts[name] = await db.fetchval(f'SELECT count(*) FROM "{name}" WHERE account_id = $1', account_id)
    counts["messages"] = await db.fetchval(
        "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.account_id = $1",
        account_id,
    )
    return counts


async def test_delete_removes_the_person_and_everything_held_about_them(db, db_url, monkeypatch, capsys):
    ada, bob = await _people(db)
    bob_before = await _holdings(db, bob.id)
    assert bob_before["messages"] == 1 and bob_before["calls"] == 1

    monkeypatch.setenv("DATABASE_URL", db_url)
    # Asked to confirm: the wrong name deletes nothing.
    code, _, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "account", "delete", "Ada", stdin="Bob\n")
    assert code == 1 and "nothing deleted" in err
    assert (await _holdings(db, ada.id))["messages"] == 1
    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "account", "delete", "Ada", stdin="Ada\n")
    assert code == 0 and "deleted account" in out

    assert not any((await _holdings(db, ada.id)).values())
    assert await db.fetchval("SELECT count(*) FROM accounts WHERE id = $1", ada.id) == 0
    assert await db.fetchval("SELECT count(*) FROM handles WHERE value = '+14155552671'") == 0
    assert await db.fetchval("SELECT count(*) FROM call_stream_tokens WHERE call_sid = 'CAada'") == 0
    assert await db.fetchval("SELECT count(*) FROM security_events WHERE detail->>'call_sid' = 'CAada'") == 0
    assert await db.fetchval("SELECT count(*) FROM messages WHERE body = 'my secret plans'") == 1  # Bob's
    # Bob keeps all of his.
    assert await _holdings(db, bob.id) == bob_before
    assert await db.fetchval("SELECT count(*) FROM call_stream_tokens WHERE call_sid = 'CAbob'") == 1
    assert await db.fetchval("SELECT count(*) FROM security_events WHERE detail->>'call_sid' = 'CAbob'") == 1

    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "account", "delete", "Bob", "--yes")
    assert code == 0 and not any((await _holdings(db, bob.id)).values())
    code, _, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "account", "delete", "Bob", "--yes")
    assert code == 1 and err.strip() == "pepper: error: no account Bob"


async def test_every_reference_to_a_person_goes_with_their_account(db):
    """Deletion relies on cascades: a new table that points at a person without one would keep
    their data after `pepper account delete`."""
    rows = await db.fetch(
        """
        SELECT c.table_name, c.column_name, coalesce(bool_or(rc.delete_rule = 'CASCADE'), false) AS cascades
        FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_schema, table_name)
        LEFT JOIN information_schema.key_column_usage k
            ON k.table_name = c.table_name AND k.column_name = c.column_name AND k.table_schema = c.table_schema
        LEFT JOIN information_schema.referential_constraints rc ON rc.constraint_name = k.constraint_name
        WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
          AND c.column_name IN ('account_id', 'conversation_id')
          AND NOT (SELECT relispartition FROM pg_class WHERE oid = ('public.' || quote_ident(c.table_name))::regclass)
        GROUP BY 1, 2
        """
    )
    loose = [(r["table_name"], r["column_name"]) for r in rows if not r["cascades"]]
    assert not loose, f"no ON DELETE CASCADE: {loose}"


@pytest.mark.parametrize("pin", ["1234", "0000", "9876", "7890", "1212", "2580", "123456", "2671", "52671"])
async def test_a_weak_pin_is_refused(db, pin):
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", "+1 415 555 2671")
    with pytest.raises(InvalidInput):
        await identity.set_pin(db, ada.id, pin)
    assert not (await identity.get_account(db, ada.id)).has_pin


def test_pin_set_refuses_a_weak_pin_in_one_line(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    code, _, err = run_cli(monkeypatch, capsys, "pin", "set", "Ada", stdin="1234\n")
    assert code == 1
    assert err.strip() == "pepper: error: a PIN of ascending or descending digits is too easy to guess; nothing changed"
    assert run_cli(monkeypatch, capsys, "pin", "set", "Ada", stdin="739154\n")[0] == 0
