"""`pepper dossier` and `pepper memory` as an operator runs them."""

from __future__ import annotations

import io
import sys
from datetime import UTC, datetime

from gateway import cli
from gateway.cli import main


def run_cli(monkeypatch, capsys, *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


def test_dossier_show_edit_and_history(db_url, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada", "--timezone", "Europe/Paris")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "dossier", "edit", "Ada", stdin="I am vegetarian.\n")
    assert code == 0 and "saved" in out
    text = tmp_path / "dossier.md"
    text.write_text("I am vegetarian. I live in Lyon.\n")
    assert "saved" in run_cli(monkeypatch, capsys, "dossier", "edit", "Ada", "--file", str(text))[1]
    assert "no change" in run_cli(monkeypatch, capsys, "dossier", "edit", "Ada", "--file", str(text))[1]
    code, out, _ = run_cli(monkeypatch, capsys, "dossier", "show", "Ada")
    assert code == 0 and "I live in Lyon." in out and "Written by Pepper:\n(empty)" in out
    code, out, _ = run_cli(monkeypatch, capsys, "dossier", "history", "Ada")
    assert out.count("owner  cli      accepted") == 2
    code, _, err = run_cli(monkeypatch, capsys, "dossier", "edit", "Ada", stdin="x" * 9000)
    assert code == 1 and err.startswith("pepper: error: the dossier text is 9000 characters")
    code, _, err = run_cli(monkeypatch, capsys, "dossier", "show", "Nobody")
    assert code == 1 and "pepper: error:" in err


def test_reindex_shows_progress_and_search_finds(db_url, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    code, out, _ = run_cli(monkeypatch, capsys, "memory", "search", "Ada", "anything")
    assert code == 0 and out == "nothing found"  # an empty index answers plainly
    code, out, _ = run_cli(monkeypatch, capsys, "memory", "reindex", "--status")
    assert code == 0 and "indexed 0/0" in out
    # Messages arrive through the one conversation.
    import asyncio

    from core.conversation import record_inbound
    from core.identity import get_account
    from core.store import Database

    async def seed() -> None:
        db = await Database.open(db_url, max_size=2)
        account = await get_account(db, "Ada")
        await record_inbound(db, account.id, "sms", "The spare key is under the blue flowerpot")
        await record_inbound(db, account.id, "email", "Dinner with Bea on Friday at eight")
        await db.close()

    asyncio.run(seed())
    code, out, _ = run_cli(monkeypatch, capsys, "memory", "reindex")
    assert code == 0 and "indexed 2/2 messages and documents (100%)" in out and "done: searches now use" in out
    code, out, _ = run_cli(monkeypatch, capsys, "memory", "search", "Ada", "where is the key?", "--limit", "1")
    assert code == 0 and "sms  [meaning]  The spare key is under the blue flowerpot" in out


def test_nightly_by_hand(db_url, monkeypatch, capsys) -> None:
    from core.testing.scripted import ScriptedModels, reply

    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    models = ScriptedModels([reply("Ada talked about the key.")])
    monkeypatch.setattr(cli, "model_service_factory", lambda settings: models)
    import asyncio

    from core.identity import get_account
    from core.store import Database

    async def seed() -> None:
        db = await Database.open(db_url, max_size=2)
        account = await get_account(db, "Ada")
        conv = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
        await db.execute(
            "INSERT INTO messages (conversation_id, channel, direction, body, created_at)"
            " VALUES ($1, 'sms', 'inbound', 'where is the key', $2)",
            conv,
            datetime(2025, 6, 3, 9, tzinfo=UTC),
        )
        await db.close()

    asyncio.run(seed())
    code, out, _ = run_cli(monkeypatch, capsys, "memory", "nightly", "--now", "2025-06-04T01:00:00+00:00")
    assert code == 0 and "1 run for 1 people (written 1)" in out
    assert models.received[0].background
    code, out, err = run_cli(monkeypatch, capsys, "memory", "nightly", "--now", "yesterday")
    assert code == 1 and "not an ISO time" in err
