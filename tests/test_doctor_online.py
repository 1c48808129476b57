"""`pepper doctor` says what the server would do (same flags, same engine decision), and
`pepper doctor --online` tries every configured credential against a loopback provider."""

from __future__ import annotations

import asyncio

from cli_support import run_cli

from core import identity
from core.models.voice_models import default_voice_model
from core.store import Database
from core.testing.google_api_peer import GoogleApiPeer
from core.testing.peers import AnthropicPeer, GooglePeer, OpenAIPeer
from core.testing.smtp_capture import SmtpCapture
from core.testing.twilio_peer import TwilioPeer
from core.tools.connectors import Connectors, seal
from core.vault import Vault, generate_key

TOKEN = "twilio-auth-token"


def line_of(out: str, area: str) -> str:
    return next(ln for ln in out.splitlines() if area in ln)


def test_doctor_takes_serves_flags_and_shows_the_port_the_server_would_use(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "env-data"))
    code, out, _ = run_cli(
        monkeypatch, capsys, "doctor", "--host", "0.0.0.0", "--port", "9123", "--data-dir", str(tmp_path / "flag")
    )
    assert code == 0, out
    assert "http://0.0.0.0:9123" in line_of(out, "listen") and "8080" not in line_of(out, "listen")
    assert str(tmp_path / "flag" / "secret.key") in line_of(out, "connection secrets")
    assert "a key is made in" in line_of(out, "connection secrets")  # it does not exist yet
    assert not (tmp_path / "flag" / "secret.key").exists()
    assert "sendgrid" not in out.lower()


def test_doctor_says_calls_apologise_when_the_server_would(tmp_path, monkeypatch, capsys):
    """The cascade answers with a text model: without any, the server logs that calls apologise."""
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PEPPER_VOICE_ENGINE", "cascade")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    line = line_of(out, "voice engine")
    assert code == 0 and line.lstrip().startswith("--") and "every call on it hears an apology" in line, line
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    line = line_of(run_cli(monkeypatch, capsys, "doctor")[1], "voice engine")
    assert line.lstrip().startswith("ok") and "cascade by default" in line


async def _doctor_online(monkeypatch, capsys) -> tuple[int, str]:
    code, out, _ = await asyncio.to_thread(run_cli, monkeypatch, capsys, "doctor", "--online")
    return code, out


async def test_doctor_online_passes_good_credentials_and_names_each_bad_one(
    db: Database, db_url, tmp_path, monkeypatch, capsys
):
    key = generate_key()
    ada = await identity.create_account(db, "Ada")
    async with (
        TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as openai, AnthropicPeer() as anthropic,
        GooglePeer() as gemini, SmtpCapture(login=("pepper", "mail-pw")) as smtp, GoogleApiPeer() as google,
    ):  # fmt: skip
        for peer, good in ((openai, "sk-good"), (anthropic, "sk-ant-good"), (gemini, "g-good")):
            peer.api_key = good
        sealed = seal(Connectors(vault=Vault(key)), {"access_token": "t", "refresh_token": "refresh-1",
                                                      "expires_at": "2000-01-01T00:00:00+00:00"})  # fmt: skip
        await db.execute(
            "INSERT INTO connections (account_id, provider, label, sealed, scopes) VALUES ($1, 'google', '', $2, $3)",
            ada.id, sealed, ["https://www.googleapis.com/auth/calendar.events"],
        )  # fmt: skip
        env = {
            "DATABASE_URL": db_url, "PEPPER_DATA_DIR": str(tmp_path / "data"), "PEPPER_SECRET_KEY": key,
            "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
            "PEPPER_TWILIO_API_URL": twilio.api_url,
            "OPENAI_API_KEY": "sk-good", "OPENAI_BASE_URL": openai.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-good", "ANTHROPIC_BASE_URL": anthropic.base_url,
            "GEMINI_API_KEY": "g-good", "GOOGLE_GEMINI_BASE_URL": gemini.base_url,
            "PEPPER_SMTP_HOST": "127.0.0.1", "PEPPER_SMTP_PORT": str(smtp.port), "PEPPER_SMTP_SECURITY": "none",
            "PEPPER_SMTP_FROM": "Pepper <pepper@example.org>", "PEPPER_SMTP_USERNAME": "pepper",
            "PEPPER_SMTP_PASSWORD": "mail-pw", "PEPPER_PUBLIC_URL": "https://pepper.example.org",
            "PEPPER_GOOGLE_CLIENT_ID": google.client_id, "PEPPER_GOOGLE_CLIENT_SECRET": google.client_secret,
            "PEPPER_GOOGLE_TOKEN_URL": google.token_url, "PEPPER_GOOGLE_API_URL": google.url,
        }  # fmt: skip
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code, out = await _doctor_online(monkeypatch, capsys)
        assert code == 0, out
        for area in ("online: Twilio", "online: model openai", "online: model anthropic", "online: model google",
                     "online: SMTP", "online: Google connection 1"):  # fmt: skip
            assert line_of(out, area).lstrip().startswith("ok"), out
        assert smtp.received == []  # a login, no mail
        refreshes = len(google.token_requests)
        assert refreshes == 1

        # Every credential wrong: each check fails with its reason, one line each, and exit 1.
        wrong = {"TWILIO_AUTH_TOKEN": "not-the-token", "OPENAI_API_KEY": "sk-wrong", "ANTHROPIC_API_KEY": "sk-ant-x",
                 "GEMINI_API_KEY": "g-wrong", "PEPPER_SMTP_PASSWORD": "wrong-pw",
                 "PEPPER_GOOGLE_CLIENT_SECRET": "stolen-guess"}  # fmt: skip
        for name, value in wrong.items():
            monkeypatch.setenv(name, value)
        code, out = await _doctor_online(monkeypatch, capsys)
        assert code == 1, out
        assert "FAIL" in line_of(out, "online: Twilio") and "401" in line_of(out, "online: Twilio")
        for area in ("online: model openai", "online: model anthropic", "online: model google", "online: SMTP",
                     "online: Google connection 1"):  # fmt: skip
            assert "FAIL" in line_of(out, area), out
        assert "refused the login (535)" in line_of(out, "online: SMTP")
        assert "the API key was refused (HTTP 401)" in line_of(out, "online: model openai")
        assert "online checks failed: Twilio, model openai" in out
        for secret in (*wrong.values(), "sk-good", "mail-pw", TOKEN):
            assert secret not in out

        # The doctor stored nothing: the connection's sealed secret is as it was.
        assert await db.fetchval("SELECT sealed FROM connections") == sealed


def test_doctor_online_with_nothing_configured_checks_nothing_and_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--online")
    assert code == 0 and "online:" not in out


async def test_doctor_online_checks_the_voice_models_against_the_providers_model_list(tmp_path, monkeypatch, capsys):
    """The voice model names (one table, core.models.voice_models) are looked up in the model list
    of the provider whose key runs them: the defaults are offered; a name the provider does not
    offer fails with the variable to set and the current names."""
    async with OpenAIPeer() as openai:
        for name, value in {"PEPPER_DATA_DIR": str(tmp_path / "data"), "OPENAI_API_KEY": "sk-good",
                            "OPENAI_BASE_URL": openai.base_url}.items():  # fmt: skip
            monkeypatch.setenv(name, value)
        code, out = await _doctor_online(monkeypatch, capsys)
        assert code == 0, out
        assert f"{default_voice_model('openai-realtime')} is offered" in line_of(
            out, "online: voice model openai-realtime"
        )
        assert "gpt-live-1 is offered" in line_of(out, "online: voice model gpt-live")
        monkeypatch.setenv("PEPPER_GPT_LIVE_MODEL", "gpt-live-0")
        code, out = await _doctor_online(monkeypatch, capsys)
        line = line_of(out, "online: voice model gpt-live")
        assert code == 1 and "FAIL" in line and "PEPPER_GPT_LIVE_MODEL" in line and "gpt-live-1.1" in line, out
