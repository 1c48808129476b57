"""Every configuration mistake is one line, `pepper: error: ...`, and status 1, naming the variable
or the file and key; a setting Pepper does not know is warned about with the nearest valid name."""

from __future__ import annotations

import subprocess

from cli_support import PEPPER, run_cli


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("pepper: error: "), err
    return lines[0]


def test_invalid_json_in_pepper_models_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("PEPPER_MODELS", '{"tiers": {"small": "openai:gpt-4o-mini", sk-secret}')
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith("pepper: error: PEPPER_MODELS is not valid JSON: ") and "column" in line
    assert "sk-secret" not in line  # the value is never echoed: it may hold a secret


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "pepper.toml"
    config.write_text('public_url = "https://a.example.org"\nport = \n')
    monkeypatch.setenv("PEPPER_CONFIG", str(config))
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1
    assert one_error_line(err) == f"pepper: error: {config} is not valid TOML: Invalid value (at line 2, column 8)"


def test_a_bad_value_in_the_toml_file_names_the_file_and_key(tmp_path, monkeypatch, capsys):
    config = tmp_path / "pepper.toml"
    config.write_text('port = "eighty"\n')
    monkeypatch.setenv("PEPPER_CONFIG", str(config))
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and one_error_line(err).startswith(f"pepper: error: bad setting port in {config}: ")
    config.write_text("[models]\ntiers = 4\n")
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 1 and one_error_line(err).startswith(f"pepper: error: bad setting models.tiers in {config}: ")


def test_misspelled_settings_are_warned_about_with_the_nearest_name(tmp_path, monkeypatch, capsys):
    config = tmp_path / "pepper.toml"
    config.write_text(f'data_dir = "{tmp_path / "d"}"\npublik_url = "https://a.example.org"\n')
    monkeypatch.setenv("PEPPER_CONFIG", str(config))
    monkeypatch.setenv("PEPPER_PROT", "9000")
    monkeypatch.setenv("PEPPER_TOKEN", "not a setting but a known variable")
    code, _, err = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0
    assert err.splitlines() == [
        "pepper: warning: unknown setting PEPPER_PROT in the environment (ignored); did you mean PEPPER_PORT?",
        f"pepper: warning: unknown key 'publik_url' in {config} (ignored); did you mean public_url?",
    ]


def test_usage_mistakes_are_one_line_and_status_1(subprocess_env):
    for argv, says in (
        (["acount", "list"], "pepper: error: argument COMMAND: invalid choice 'acount'; did you mean 'account'?"),
        (["account", "create"], "pepper: error: the following arguments are required: name"),
        (["account", "frob"], "choose from create, list, rename, delete, show"),
    ):
        done = subprocess.run([*PEPPER, *argv], env=subprocess_env, capture_output=True, text=True)
        assert done.returncode == 1, done
        assert says in one_error_line(done.stderr)
        assert "usage:" not in done.stderr
