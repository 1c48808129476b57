"""The realtime engine per line: the setting, the ``phone_lines.voice_engine`` override set with
``pepper line engine``, engines built on first use, and an engine this build lacks refused clearly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from core import identity
from core.errors import InvalidInput, NotFound
from core.settings import Settings
from gateway.cli import main
from voice import engines
from voice.engines import EngineUnavailable, RealtimeEngines


def run_cli(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    lines: list[str] = []
    code = main(list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


def test_the_engine_setting_names_one_of_the_engines():
    for name in ("openai-realtime", "gemini-live", "gpt-live", "cascade"):
        assert Settings(voice_engine=name).voice_engine == name
    with pytest.raises(ValidationError):
        Settings(voice_engine="gemini")


def test_engines_are_built_on_first_use_once_and_only_with_a_key():
    unset = RealtimeEngines(Settings(gemini_api_key=None, openai_api_key=None))
    assert unset.get("gemini-live") is None and unset.get("openai-realtime") is None
    keyed = RealtimeEngines(Settings(gemini_api_key="g-key", gemini_live_model="gemini-x", gemini_live_voice="Puck"))
    gemini = keyed.get("gemini-live")
    assert gemini is keyed.get("gemini-live")
    assert gemini.name == "gemini-live" and gemini.model == "gemini-x" and gemini.voice == "Puck"
    with pytest.raises(EngineUnavailable, match="unknown voice engine 'gemini'"):
        keyed.get("gemini")
    assert unset.get("gpt-live") is None
    live = RealtimeEngines(Settings(openai_api_key="sk-x", gpt_live_model="gpt-live-1.1")).get("gpt-live")
    assert live.name == "gpt-live" and live.model == "gpt-live-1.1" and live.full_duplex


def test_sdks_load_only_when_an_engine_is_first_needed():
    probe = (
        "import sys\n"
        "from core.settings import Settings\n"
        "from voice.engines import RealtimeEngines\n"
        "import voice.service, voice.engine, gateway.cli\n"
        "engines = RealtimeEngines(Settings(gemini_api_key='k', openai_api_key=None))\n"
        "before = 'google.genai' in sys.modules\n"
        "engines.get('openai-realtime')\n"
        "engines.get('gemini-live')\n"
        "print(before, 'google.genai' in sys.modules, 'openai' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ.get("PATH", "")})  # fmt: skip
    assert done.stdout.split() == ["False", "True", "False"]


def test_an_engine_missing_from_the_build_fails_clearly(monkeypatch):
    monkeypatch.setattr(engines, "CASCADE_MODULE", "voice.adapters.not_in_this_build")
    with pytest.raises(EngineUnavailable, match=r"not part of this build \(voice.adapters.not_in_this_build"):
        RealtimeEngines(Settings()).get("cascade")
    assert not engines.engine_available("cascade") and engines.engine_available("gemini-live")


async def test_a_line_engine_is_validated_and_stored(db):
    ada = await identity.create_account(db, "Ada")
    await identity.assign_line(db, "+14155550100", "personal", ada.id)
    line = await identity.set_line_engine(db, "(415) 555-0100", "gemini-live")
    assert line.voice_engine == "gemini-live"
    assert (await identity.find_line(db, "+14155550100")).voice_engine == "gemini-live"
    with pytest.raises(InvalidInput):
        await identity.set_line_engine(db, "+14155550100", "gemini")
    with pytest.raises(NotFound):
        await identity.set_line_engine(db, "+14155550199", "gemini-live")
    assert (await identity.set_line_engine(db, "+14155550100", "gpt-live")).voice_engine == "gpt-live"
    assert (await identity.set_line_engine(db, "+14155550100", None)).voice_engine is None


def test_pepper_line_engine_sets_shows_and_clears_the_override(db_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada")[0] == 0
    assert run_cli(monkeypatch, capsys, "line", "assign", "+14155550100", "personal", "Ada")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "line", "engine", "+14155550100", "gemini-live")
    assert code == 0 and out == "calls on +14155550100 now run on gemini-live"
    code, out, _ = run_cli(monkeypatch, capsys, "line", "list")
    assert out.endswith("Ada  gemini-live  media-streams (default)")
    code, out, _ = run_cli(monkeypatch, capsys, "line", "engine", "+14155550100", "default")
    assert code == 0 and out.endswith("cascade (the default)")  # auto, with no OpenAI key
    assert run_cli(monkeypatch, capsys, "line", "list")[1].endswith("cascade (default)  media-streams (default)")
    code, _, err = run_cli(monkeypatch, capsys, "line", "engine", "+14155550199", "gemini-live")
    assert code == 1 and err.strip() == "pepper: error: no line +14155550199"
    monkeypatch.setattr(engines, "CASCADE_MODULE", "voice.adapters.not_in_this_build")
    code, _, err = run_cli(monkeypatch, capsys, "line", "engine", "+14155550100", "cascade")
    assert code == 1 and "not part of this build; nothing changed" in err
    assert run_cli(monkeypatch, capsys, "line", "list")[1].endswith("cascade (default)  media-streams (default)")
    with pytest.raises(SystemExit):
        main(["line", "engine", "+14155550100", "gemini"], out=print)


def test_doctor_says_which_engine_calls_use_and_what_it_needs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PEPPER_VOICE_ENGINE", "gemini-live")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "gemini-live needs GEMINI_API_KEY" in out
    monkeypatch.setenv("GEMINI_API_KEY", "g-key")
    assert "gemini-live by default" in run_cli(monkeypatch, capsys, "doctor")[1]
    monkeypatch.setenv("PEPPER_VOICE_ENGINE", "cascade")
    monkeypatch.setattr(engines, "CASCADE_MODULE", "voice.adapters.not_in_this_build")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and "PEPPER_VOICE_ENGINE=cascade is not part of this build" in out


async def test_a_line_transport_is_validated_and_stored(db):
    ada = await identity.create_account(db, "Ada")
    await identity.assign_line(db, "+14155550100", "personal", ada.id)
    assert (await identity.find_line(db, "+14155550100")).voice_transport is None
    assert (await identity.set_line_transport(db, "(415) 555-0100", "sip")).voice_transport == "sip"
    for garbage in ("SIP", "media_streams", "sip\x00", ""):
        with pytest.raises(InvalidInput):
            await identity.set_line_transport(db, "+14155550100", garbage)
    with pytest.raises(NotFound):
        await identity.set_line_transport(db, "+14155550199", "sip")
    assert (await identity.find_line(db, "+14155550100")).voice_transport == "sip"  # garbage changed nothing
    # The column refuses what the function would (a write that went around it).
    with pytest.raises(Exception, match="voice_transport_check"):
        await db.execute("UPDATE phone_lines SET voice_transport = 'webrtc'")
    assert (await identity.set_line_transport(db, "+14155550100", None)).voice_transport is None


def test_pepper_line_transport_sets_shows_repeats_and_refuses_garbage(db_url, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada")[0] == 0
    for number in ("+14155550100", "+14155550101"):
        assert run_cli(monkeypatch, capsys, "line", "assign", number, "personal", "Ada")[0] == 0
    # No gpt-live engine, no webhook secret: set anyway, with what stops its calls said.
    code, out, _ = run_cli(monkeypatch, capsys, "line", "transport", "+14155550101", "sip")
    assert code == 0 and out.splitlines() == [
        "calls to +14155550101 now come over sip",
        "note: SIP direct runs calls on gpt-live only, and this line's engine is cascade"
        " (pepper line engine NUMBER gpt-live)",
        "note: SIP direct needs OPENAI_API_KEY and OPENAI_WEBHOOK_SECRET: until then its SIP calls are refused",
    ]
    listed = run_cli(monkeypatch, capsys, "line", "list")[1].splitlines()
    assert listed[0].endswith("Ada  cascade (default)  media-streams (default)")
    assert listed[1].endswith("Ada  cascade (default)  sip")
    doctor = run_cli(monkeypatch, capsys, "doctor")[1]
    assert "SIP direct needs the gpt-live engine, OPENAI_API_KEY and OPENAI_WEBHOOK_SECRET" in doctor
    flagged = [ln for ln in doctor.splitlines() if "line +14155550101" in ln]
    assert len(flagged) == 1 and flagged[0].startswith("  --") and "OPENAI_WEBHOOK_SECRET" in flagged[0]
    assert "line +14155550100" not in doctor  # a media-streams line needs nothing more

    # The same again: nothing changed, said so.
    code, out, _ = run_cli(monkeypatch, capsys, "line", "transport", "+14155550101", "sip")
    assert code == 0 and out == "calls to +14155550101 already come over sip; nothing changed"
    # Garbage: a transport that is not one, a line that is not Pepper's; neither changes anything.
    with pytest.raises(SystemExit):
        main(["line", "transport", "+14155550101", "webrtc"], out=print)
    assert "invalid choice 'webrtc'" in capsys.readouterr().err
    code, _, err = run_cli(monkeypatch, capsys, "line", "transport", "+14155550199", "sip")
    assert code == 1 and err.strip() == "pepper: error: no line +14155550199"
    assert run_cli(monkeypatch, capsys, "line", "list")[1].splitlines()[1].endswith("  sip")

    # With the engine and keys in place, the doctor's line check is clean; back to the default.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", "whsec_" + "A" * 32)
    assert run_cli(monkeypatch, capsys, "line", "engine", "+14155550101", "gpt-live")[0] == 0
    flagged = [ln for ln in run_cli(monkeypatch, capsys, "doctor")[1].splitlines() if "line +14155550101" in ln]
    assert len(flagged) == 1 and flagged[0].startswith("  ok") and "over SIP direct on gpt-live" in flagged[0]
    code, out, _ = run_cli(monkeypatch, capsys, "line", "transport", "+14155550101", "default")
    assert code == 0 and out == "calls to +14155550101 now come over media-streams (the default)"
    # An answering line on SIP takes no calls: the answering service runs on Media Streams only.
    assert run_cli(monkeypatch, capsys, "line", "assign", "+14155550101", "answering", "Ada")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "line", "transport", "+14155550101", "sip")
    assert code == 0 and out.splitlines()[1:] == [
        "note: the answering service runs on Media Streams only: on SIP direct its calls are rejected (480)"
    ]
