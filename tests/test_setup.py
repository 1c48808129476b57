"""`pepper setup`: the first run, asked on stdin or given as flags, writes pepper.toml (0600, no
secret printed), makes or finds the owner's account, ends with doctor; and the setup it writes
for an OpenAI-compatible endpoint is one `pepper chat` can talk through."""

from __future__ import annotations

import argparse
import asyncio
import stat
import tomllib
from pathlib import Path

from cli_support import run_cli

from core import identity
from core.settings import load_settings
from core.testing.peers import OpenAIPeer, reply_text
from gateway.cli_web import chat
from gateway.server import running_app

ANSWERS = "\n".join([
    "Ada Lovelace",
    "Mars/Olympus",         # refused, asked again
    "Europe/London",
    "+44 20 7946 0123",
    "1234",                 # too weak, asked again
    "739154",
    "anthropic",
    "sk-ant-very-secret",   # the API key
    "AC" + "0" * 32,        # Twilio
    "twilio-very-secret",
    "https://pepper.example.org",
]) + "\n"  # fmt: skip


def test_interactive_setup_through_stdin_twice(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, err = run_cli(monkeypatch, capsys, "setup", stdin=ANSWERS)
    assert code == 0, err
    assert "unknown time zone 'Mars/Olympus'" in err and "too easy to guess" in err
    for secret in ("sk-ant-very-secret", "twilio-very-secret", "739154"):
        assert secret not in out and secret not in err
    assert "created the account of Ada Lovelace" in out and "PIN set for Ada Lovelace" in out
    assert out.rstrip().endswith("ready to serve")
    config = Path("pepper.toml")
    assert f"config file                           {config.resolve()}" in out  # doctor finds what setup wrote
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    table = tomllib.loads(config.read_text())
    assert table["anthropic_api_key"] == "sk-ant-very-secret"
    assert table["twilio_auth_token"] == "twilio-very-secret" and table["public_url"] == "https://pepper.example.org"
    settings = load_settings()
    assert settings.anthropic_api_key.get_secret_value() == "sk-ant-very-secret"

    # Again: the account is found, not made twice; the file is updated in place.
    code, out, err = run_cli(monkeypatch, capsys, "setup", stdin=ANSWERS.replace("anthropic", "openai", 1))
    assert code == 0, err
    assert "found the account of Ada Lovelace" in out
    table = tomllib.loads(config.read_text())
    assert table["openai_api_key"] == "sk-ant-very-secret" and table["anthropic_api_key"] == "sk-ant-very-secret"
    code, listed, _ = run_cli(monkeypatch, capsys, "account", "list")
    assert listed.count("Ada Lovelace") == 1 and "PIN set" in listed
    code, shown, _ = run_cli(monkeypatch, capsys, "account", "show", "Ada Lovelace")
    assert "phone  +442079460123  verified" in shown and "Europe/London" in shown


def test_setup_with_flags(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("MY_OPENAI_KEY", "sk-flag-secret")
    flags = ["setup", "--name", "Ada", "--timezone", "Europe/Paris", "--phone", "+1 415 555 2671", "--pin-stdin",
             "--provider", "openai", "--model", "gpt-5-mini", "--api-key-env", "MY_OPENAI_KEY"]  # fmt: skip
    # A wrong answer is one line and writes nothing.
    code, _, err = run_cli(monkeypatch, capsys, *flags, stdin="2671\n")
    assert code == 1 and err.strip() == (
        "pepper: error: a PIN must not be the last digits of the owner's phone number"
    ), err
    assert not Path("pepper.toml").exists()
    code, _, err = run_cli(monkeypatch, capsys, *flags[:-1], "NOT_SET_ANYWHERE", stdin="739154\n")
    assert code == 1 and "NOT_SET_ANYWHERE is not set" in err and not Path("pepper.toml").exists()

    for _ in range(2):
        code, out, err = run_cli(monkeypatch, capsys, *flags, stdin="739154\n")
        assert code == 0, err
        assert "sk-flag-secret" not in out + err
    assert "found the account of Ada" in out
    table = tomllib.loads(Path("pepper.toml").read_text())
    assert table["openai_api_key"] == "sk-flag-secret"
    assert table["models"]["tiers"]["small"] == {"model": "openai:gpt-5-mini"}
    assert stat.S_IMODE(Path("pepper.toml").stat().st_mode) == 0o600
    assert "model tier: small" in out and "openai:gpt-5-mini" in out  # doctor's view of it


async def test_after_setup_for_a_compatible_endpoint_pepper_chat_works(db, db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    async with OpenAIPeer() as model:
        code, out, err = await asyncio.to_thread(
            run_cli, monkeypatch, capsys, "setup", "--name", "Ada", "--provider", "compatible",
            "--base-url", model.base_url, "--model", "llama3.2",
        )  # fmt: skip
        assert code == 0, err
        assert f"calls go to {model.base_url}" in out
        ada = (await identity.accounts_named(db, "Ada"))[0]
        code, token, err = await asyncio.to_thread(run_cli, monkeypatch, capsys, "token", "create", "Ada")
        assert code == 0, err

        settings = load_settings(port=0)  # from the pepper.toml setup wrote
        assert settings.models.compatible_base_url == model.base_url
        model.script(reply_text("Hello Ada, from a local model."))
        async with running_app(settings, db) as (_app, port):
            printed: list[str] = []
            args = argparse.Namespace(url=f"http://127.0.0.1:{port}", timeout=30.0)
            code = await asyncio.to_thread(chat, args, settings, token.strip(), ["hello"], printed.append)
        assert code == 0 and printed == ["Hello Ada, from a local model."]
        chats = [r for r in model.requests if r.path.endswith("/chat/completions")]
        assert chats and chats[0].body["model"] == "llama3.2"
        assert await db.fetchval("SELECT count(*) FROM turns t JOIN conversations c ON c.id = t.conversation_id"
                                 " WHERE c.account_id = $1", ada.id) == 1  # fmt: skip
