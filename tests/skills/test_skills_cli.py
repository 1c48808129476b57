"""``pepper skills`` as the owner runs it."""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from gateway.cli import main

STANDUP = "---\nname: my-standup\ndescription: Prepare my standup from todos.\n---\n1. List todos.\n2. Write it.\n"


def sql(dsn: str, query: str, *args):
    async def go():
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def run(monkeypatch, capsys, *argv, stdin=None):
    if stdin is not None:
        import io

        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


def test_an_owner_adds_lists_shows_and_removes_their_own_skills(db_url, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run(monkeypatch, capsys, "account", "create", "Ada")[0] == 0
    path = tmp_path / "standup.md"
    path.write_text(STANDUP)

    code, out, _ = run(monkeypatch, capsys, "skills", "add", "Ada", str(path))
    assert (code, out) == (0, "skill my-standup added for Ada")
    code, out, _ = run(monkeypatch, capsys, "skills", "add", "Ada", str(path))
    assert (code, out) == (0, "skill my-standup already there, unchanged, for Ada")
    changed = STANDUP.replace("Write it.", "Send it.")
    code, _, err = run(monkeypatch, capsys, "skills", "add", "Ada", "-", stdin=changed)
    assert code == 1 and "already have a skill named 'my-standup'; use --replace" in err
    code, out, _ = run(monkeypatch, capsys, "skills", "add", "Ada", "-", "--replace", stdin=changed)
    assert (code, out) == (0, "skill my-standup replaced for Ada")
    assert sql(db_url, "SELECT count(*) FROM user_skills") == 1

    code, out, _ = run(monkeypatch, capsys, "skills", "show", "my-standup", "--account", "Ada")
    assert code == 0 and out.endswith("2. Send it.")
    code, out, _ = run(monkeypatch, capsys, "skills", "list", "Ada")
    assert code == 0
    assert "my-standup             own      inline" in out and "ready" in out
    [brief] = [line for line in out.splitlines() if line.startswith("morning-brief ")]
    assert "shipped  worker calendar,mail,todos,reminders" in brief and brief.endswith("needs Gmail or IMAP"), brief
    code, out, _ = run(monkeypatch, capsys, "skills", "show", "weekly-review")
    assert code == 0 and out.startswith("---\nname: weekly-review")

    assert run(monkeypatch, capsys, "skills", "remove", "Ada", "my-standup")[0] == 0
    code, _, err = run(monkeypatch, capsys, "skills", "remove", "Ada", "my-standup")
    assert code == 1 and "no skill named 'my-standup'" in err


def test_bad_skills_are_refused_with_one_line_and_nothing_is_stored(db_url, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DATABASE_URL", db_url)
    run(monkeypatch, capsys, "account", "create", "Ada")
    cases = [
        ("---\nname: x y\n---\n1.\n", "pepper: error: skill from stdin: name: String should match"),
        (STANDUP.replace("my-standup", "morning-brief"), "'morning-brief' is the name of a shipped skill"),
        (
            "---\nname: my-many\ndescription: Too many tool sets.\ntoolsets: [todos, notes, calendar]\n---\n1. x\n",
            "a skill you write may use at most 2",
        ),
    ]
    for text, message in cases:
        code, _, err = run(monkeypatch, capsys, "skills", "add", "Ada", "-", stdin=text)
        assert code == 1 and message in err and "Traceback" not in err
    code, _, err = run(monkeypatch, capsys, "skills", "add", "Ada", str(tmp_path / "missing.md"))
    assert code == 1 and "cannot read" in err
    assert sql(db_url, "SELECT count(*) FROM user_skills") == 0

    sql(
        db_url,
        "INSERT INTO user_skills (account_id, name, source) SELECT id, 'old', $1 FROM accounts",
        "---\nname: old\n---\n1.",
    )
    code, out, _ = run(monkeypatch, capsys, "skills", "list", "Ada")
    assert "old                    own      BROKEN: skill 'old': description: Field required" in out


def test_mail_skills_say_what_they_need_until_a_mailbox_is_connected(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run(monkeypatch, capsys, "account", "create", "Ada")[0] == 0

    def states(*argv: str) -> dict[str, str]:
        code, out, _ = run(monkeypatch, capsys, "skills", "list", *argv)
        assert code == 0
        return {line.split()[0]: line for line in out.splitlines()}

    mail_skills = ("inbox-triage", "anything-from", "email-digest", "follow-up-unanswered", "meeting-prep")
    unconnected = states()
    for name in mail_skills:
        assert "needs Gmail or IMAP (give an account" in unconnected[name] and "ready" not in unconnected[name]
    assert unconnected["plan-my-day"].endswith("ready")
    for name in (*mail_skills, "morning-brief", "draft-reply"):
        assert states("Ada")[name].endswith("needs Gmail or IMAP")
    # Gmail connected with the read-only scope: ready. (Compose alone reads nothing.)
    sql(
        db_url,
        "INSERT INTO connections (account_id, provider, scopes) SELECT id, 'google', $1 FROM accounts",
        ["https://www.googleapis.com/auth/gmail.compose"],
    )
    assert states("Ada")["inbox-triage"].endswith("needs Gmail or IMAP")
    sql(db_url, "UPDATE connections SET scopes = scopes || $1::text", "https://www.googleapis.com/auth/gmail.readonly")
    connected = states("Ada")
    for name in (*mail_skills, "draft-reply"):
        assert connected[name].endswith("ready"), connected[name]
