"""`pepper` as an operator runs it: admin commands, doctor, and serve's start, refusals and shutdown."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from cli_support import PEPPER, run_cli, run_serve_expecting_failure, start_serve, stop, wait_healthy

from core.settings import Settings
from core.store.migrations import load_migrations
from core.testing.processes import free_port
from gateway.budget import connections_needed


def test_admin_commands_set_up_an_owner_end_to_end(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, _ = run_cli(monkeypatch, capsys, "account", "create", "Ada Lovelace", "--timezone", "Europe/London")
    assert code == 0 and "created account" in out
    assert run_cli(monkeypatch, capsys, "handle", "add", "Ada Lovelace", "phone", "+1 415 555 2671")[0] == 0
    assert run_cli(monkeypatch, capsys, "handle", "verify", "phone", "(415) 555-2671")[0] == 0
    assert (
        run_cli(monkeypatch, capsys, "handle", "add", "Ada Lovelace", "email", "ada@example.org", "--verified")[0] == 0
    )
    assert run_cli(monkeypatch, capsys, "pin", "set", "Ada Lovelace", stdin="482916\n")[0] == 0
    assert run_cli(monkeypatch, capsys, "line", "assign", "+14155550100", "personal", "Ada Lovelace")[0] == 0
    assert run_cli(monkeypatch, capsys, "line", "assign", "+14155550101", "answering", "Ada Lovelace")[0] == 0

    code, out, _ = run_cli(monkeypatch, capsys, "account", "show", "Ada Lovelace")
    assert code == 0
    assert "PIN set" in out
    assert "phone  +14155552671  verified" in out
    assert "email  ada@example.org  verified" in out
    assert "line   +14155550100  personal" in out and "line   +14155550101  answering" in out

    code, out, _ = run_cli(monkeypatch, capsys, "line", "list")
    assert "+14155550101  answering  Ada Lovelace" in out


def test_admin_mistakes_are_one_line_errors(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    code, _, err = run_cli(monkeypatch, capsys, "handle", "add", "Nobody", "phone", "+14155552671")
    assert code == 1 and err.strip() == "pepper: error: no account Nobody"
    run_cli(monkeypatch, capsys, "account", "create", "Ada")
    code, _, err = run_cli(monkeypatch, capsys, "handle", "add", "Ada", "phone", "not-a-number")
    assert code == 1 and err.startswith("pepper: error: not a phone number") and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "pin", "set", "Ada", stdin="12\n")
    assert code == 1 and "4 to 12 digits" in err


def test_admin_commands_use_the_embedded_postgres_when_no_server_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "account", "list")
    assert code == 0 and "Ada" in out
    # It stopped the Postgres it started.
    assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()


def test_doctor_on_a_bare_setup_lists_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0
    assert "OPENAI_API_KEY is not set" in out and "ANTHROPIC_API_KEY is not set" in out
    assert "GEMINI_API_KEY is not set" in out
    assert "set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, PEPPER_PUBLIC_URL" in out
    assert "not created yet" in out
    assert "set PEPPER_PUBLIC_URL" in out
    assert out.rstrip().endswith("ready to serve")
    assert not (tmp_path / "data" / "postgres").exists()  # doctor changes nothing


def test_doctor_parses_the_secret_key_and_fails_on_a_malformed_one(tmp_path, monkeypatch, capsys):
    from core.vault import generate_key

    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    for bad, problem in (
        ("not-a-fernet-key-at-all", "PEPPER_SECRET_KEY is not a Fernet key"),
        (f"{generate_key()},short", "PEPPER_SECRET_KEY is not a Fernet key"),
        (" , ", "PEPPER_SECRET_KEY holds no key"),
    ):
        monkeypatch.setenv("PEPPER_SECRET_KEY", bad)
        code, out, _ = run_cli(monkeypatch, capsys, "doctor")
        line = next(ln for ln in out.splitlines() if "connection secrets" in ln)
        assert code == 1 and "FAIL" in line and problem in line, out
        assert "not-a-fernet-key" not in out and "short" not in line
    monkeypatch.setenv("PEPPER_SECRET_KEY", "  ")  # blank: the key file, as the vault does
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "when the first secret is sealed" in out
    new, old = generate_key(), generate_key()
    monkeypatch.setenv("PEPPER_SECRET_KEY", f"{new},{old}")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "sealed with the key in PEPPER_SECRET_KEY (and 1 older key that still open)" in out
    assert new not in out and old not in out
    # A damaged key file is found too.
    monkeypatch.delenv("PEPPER_SECRET_KEY")
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "secret.key").write_text("garbage\n")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and "secret.key is not a Fernet key" in out


def test_doctor_on_a_configured_setup_gives_the_webhook_urls(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("PEPPER_PUBLIC_URL", "https://pepper.example.org/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-value")
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC" + "0" * 32)
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "twilio-secret-token")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0
    assert "sk-test-secret-value" not in out and "twilio-secret-token" not in out
    assert "OPENAI_API_KEY is set" in out
    assert "account AC000" in out
    assert "https://pepper.example.org/twilio/voice" in out
    assert "https://pepper.example.org/twilio/sms" in out
    assert "wss://pepper.example.org/twilio/media" in out
    assert f"schema version {load_migrations()[-1].version}" in out
    assert "0 migration(s) to apply" in out
    allowed = re.search(rf"Pepper may open {connections_needed(Settings())} of the (\d+) the server allows", out)
    assert allowed, out
    # Settings whose pools could outgrow the server: the check that makes `pepper serve` refuse.
    monkeypatch.setenv("PEPPER_TURN_WORKERS", "16")
    if connections_needed(Settings()) > int(allowed[1]):  # the embedded test server's 197
        code, out, _ = run_cli(monkeypatch, capsys, "doctor")
        assert code == 1 and f"of the {allowed[1]} the server allows; raise its max_connections" in out


def test_doctor_fails_when_the_database_cannot_be_reached(monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:pw@127.0.0.1:9/pepper")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1
    assert "FAIL" in out and "cannot reach the database" in out
    assert out.rstrip().endswith("cannot serve: fix the FAIL lines above")


def test_doctor_reads_a_toml_config_file(tmp_path, monkeypatch, capsys):
    config = tmp_path / "pepper.toml"
    config.write_text(f'data_dir = "{tmp_path / "d"}"\npublic_url = "https://from-toml.example.org"\n')
    monkeypatch.setenv("PEPPER_CONFIG", str(config))
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "https://from-toml.example.org/twilio/voice" in out
    monkeypatch.setenv("PEPPER_CONFIG", str(tmp_path / "missing.toml"))
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and "missing.toml" in err


def test_a_bad_setting_is_named(monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_PORT", "eighty")
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and err.startswith("pepper: error: bad setting PEPPER_PORT")


# --- pepper serve, as a child process -------------------------------------------------------


def test_serve_starts_healthy_refuses_a_second_server_and_stops_cleanly(subprocess_env, tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    proc = start_serve(subprocess_env, data_dir, port)
    try:
        health = wait_healthy(port, proc)
        latest = load_migrations()[-1].version
        assert health == {"status": "ok", "database": "ok", "schema_version": latest, "pending_migrations": 0}

        # A second server on the same data dir refuses instead of sharing it.
        code, err = run_serve_expecting_failure(subprocess_env, data_dir, free_port())
        assert code == 1
        assert "already using the data dir" in err and "Traceback" not in err

        # Admin commands work beside the running server, through its Postgres.
        env = {**subprocess_env, "PEPPER_DATA_DIR": str(data_dir)}
        made = subprocess.run([*PEPPER, "account", "create", "Ada"], env=env, capture_output=True, text=True)
        assert made.returncode == 0, made.stderr

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        log = stop(proc)
    assert "stopped accepting requests" in log
    assert not (data_dir / "postgres" / "postmaster.pid").exists()  # Postgres was stopped
    # And the next start finds the account.
    listed = subprocess.run([*PEPPER, "account", "list"], env=env, capture_output=True, text=True)
    assert "Ada" in listed.stdout


def test_serve_raises_its_open_files_limit_for_its_calls_and_children_inherit_it(subprocess_env, tmp_path):
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(256, hard)
    env = {**subprocess_env, "PEPPER_DATA_DIR": str(tmp_path / "data"), "PEPPER_PORT": str(port := free_port()),
           "PEPPER_MEDIA_PORT": str(free_port())}  # fmt: skip
    proc = subprocess.Popen([*PEPPER, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))  # fmt: skip
    try:
        wait_healthy(port, proc, 60)
        limits = [Path(f"/proc/{pid}/limits").read_text() for pid in [proc.pid, *_children(proc.pid)]]
        assert len(limits) >= 3  # the server, its turn workers and media processes
        for text in limits:
            line = next(ln for ln in text.splitlines() if ln.startswith("Max open files"))
            assert line.split()[3] == str(hard), line
    finally:
        proc.terminate()
        proc.wait(30)


def _children(pid: int) -> list[int]:
    """The Python processes ``pid`` started (not Postgres)."""
    found = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in found if b"python" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_serve_on_a_busy_port_is_one_clear_line(subprocess_env, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_serve_expecting_failure(subprocess_env, tmp_path / "data", port)
    assert code == 1
    assert (
        err.strip().splitlines()[-1]
        == f"pepper: error: port {port} on 127.0.0.1 is already in use; set PEPPER_PORT to another"
    )
    assert "Traceback" not in err


def test_serve_on_a_busy_media_port_is_one_clear_line(subprocess_env, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_serve_expecting_failure(
            subprocess_env, tmp_path / "data", free_port(), ("PEPPER_MEDIA_PORT", str(port))
        )
    assert code == 1
    assert (
        err.strip().splitlines()[-1]
        == f"pepper: error: port {port} on 127.0.0.1 is already in use; set PEPPER_MEDIA_PORT to another"
    )
    assert "Traceback" not in err


def test_serve_with_an_unusable_data_dir_is_one_clear_line(subprocess_env, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    code, err = run_serve_expecting_failure(subprocess_env, not_a_dir / "data", free_port())
    assert code == 1
    assert f"pepper: error: data dir {not_a_dir / 'data'} is not usable" in err and "Traceback" not in err


def test_serve_with_a_bad_database_url_is_one_clear_line(subprocess_env, tmp_path):
    code, err = run_serve_expecting_failure(
        subprocess_env, tmp_path / "data", free_port(), ("DATABASE_URL", "postgresql://u:hunter2@127.0.0.1:9/x")
    )
    assert code == 1
    assert "pepper: error: cannot reach the database at postgresql://u:***@127.0.0.1:9/x" in err
    assert "hunter2" not in err and "Traceback" not in err
    code, err = run_serve_expecting_failure(
        subprocess_env, tmp_path / "data", free_port(), ("DATABASE_URL", "mysql://nope")
    )
    assert code == 1 and "pepper: error:" in err and "Traceback" not in err


def test_serve_on_a_server_without_pgvector_is_one_clear_line(subprocess_env, tmp_path, postgres_without_pgvector):
    dsn = postgres_without_pgvector
    code, err = run_serve_expecting_failure(subprocess_env, tmp_path / "data", free_port(), ("DATABASE_URL", dsn))
    assert code == 1
    assert "has no pgvector extension" in err and "Traceback" not in err


def test_serve_refuses_settings_whose_pools_could_outgrow_the_connection_limit(subprocess_env, tmp_path):
    # 16 turn workers of 12 connections each need more than the embedded server's 200; found under
    # load it would be calls and messages failing with "too many clients", so it is found at start.
    code, err = run_serve_expecting_failure(
        subprocess_env, tmp_path / "data", free_port(), ("PEPPER_TURN_WORKERS", "16")
    )
    assert code == 1 and "Traceback" not in err
    assert re.search(
        r"pepper: error: Pepper may open 2\d\d connections to Postgres with these settings but the"
        r" server allows 197; raise its max_connections or lower PEPPER_TURN_WORKERS",
        err,
    ), err
    # The defaults fit a stock server's 100 (97 for ordinary roles), with room for admin commands.
    assert connections_needed(Settings()) <= 85


def test_pepper_console_script_is_installed():
    assert shutil.which("pepper", path=os.path.dirname(sys.executable)) is not None
