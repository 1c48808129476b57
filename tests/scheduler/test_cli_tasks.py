"""`pepper tasks`: add, list with receipts, remove, place; mistakes are one-line errors."""

from __future__ import annotations

from gateway.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


def test_tasks_are_added_listed_and_removed(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run_cli(capsys, "account", "create", "Ada", "--timezone", "Europe/Paris")[0] == 0
    code, out, _ = run_cli(capsys, "tasks", "add", "Ada", "Brief", "--schedule", "weekdays at 7:30",
                           "--prompt", "Brief me.", "--to", "chat,sms")  # fmt: skip
    assert code == 0 and "scheduled #1 Brief (weekdays at 07:30; to chat, sms); first run" in out
    code, out, err = run_cli(capsys, "tasks", "add", "Ada", "Sun", "--schedule", "sunset", "--prompt", "x")
    assert code == 1 and "does not know where you are" in err and err.count("\n") == 1
    assert run_cli(capsys, "tasks", "place", "Ada", "48.85", "2.35")[0] == 0
    assert run_cli(capsys, "tasks", "add", "Ada", "Sun", "--schedule", "sunset", "--prompt", "x")[0] == 0
    code, out, _ = run_cli(capsys, "tasks")
    assert code == 0 and "#1 Brief" in out and "#2 Sun (every day at sunset" in out and "[Ada; task; next" in out
    assert run_cli(capsys, "tasks", "remove", "1")[1] == "cancelled task #1"
    code, _, err = run_cli(capsys, "tasks", "remove", "1")
    assert code == 1 and err.strip() == "pepper: error: no active task #1"
    code, out, _ = run_cli(capsys, "tasks", "list", "--all")
    assert "#1 Brief" in out and "cancelled" in out
    code, _, err = run_cli(capsys, "tasks", "add", "Ada", "X", "--schedule", "whenever", "--prompt", "x")
    assert code == 1 and err.startswith("pepper: error: not a day")


def test_tasks_lists_recent_receipts(db_url, monkeypatch, capsys):
    import asyncio

    from core.store import Database

    monkeypatch.setenv("DATABASE_URL", db_url)
    run_cli(capsys, "account", "create", "Ada", "--timezone", "UTC")
    run_cli(capsys, "tasks", "add", "Ada", "Brief", "--schedule", "mornings", "--prompt", "p")

    async def receipts() -> None:
        db = await Database.open(db_url, max_size=1)
        try:
            await db.execute(
                "INSERT INTO task_runs (task_id, occurrence_at, due_at, ready_at, status, reason) VALUES"
                " (1, '2025-06-01 08:00Z', '2025-06-01 08:00Z', '2025-06-01 08:00Z', 'missed',"
                " 'Pepper was not running'),"
                " (1, '2025-06-02 08:00Z', '2025-06-02 08:00Z', '2025-06-02 08:00Z', 'silent', NULL)"
            )
        finally:
            await db.close()

    asyncio.run(receipts())
    _, out, _ = run_cli(capsys, "tasks")
    assert "2025-06-02 08:00  silent" in out
    assert "2025-06-01 08:00  missed   (Pepper was not running)" in out
