"""``pepper doctor`` says whether web research is set up, and refuses the test-only loopback ports."""

from __future__ import annotations

from cli_support import run_cli


def test_doctor_reports_the_search_service(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "set BRAVE_API_KEY, TAVILY_API_KEY or PEPPER_SEARXNG_URL" in out
    monkeypatch.setenv("PEPPER_SEARXNG_URL", "https://searx.example.org")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code == 0 and "searxng; the research helper runs on the small tier" in out


def test_doctor_refuses_a_provider_without_its_key_and_the_test_ports(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PEPPER_WEB_SEARCH_PROVIDER", "brave")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code != 0 and "PEPPER_WEB_SEARCH_PROVIDER is brave but BRAVE_API_KEY is not set" in out
    monkeypatch.delenv("PEPPER_WEB_SEARCH_PROVIDER")
    monkeypatch.setenv("PEPPER_WEB_TEST_LOOPBACK_PORTS", "[8080]")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code != 0 and "PEPPER_WEB_TEST_LOOPBACK_PORTS is set: it is for tests only" in out


def test_doctor_reports_the_hosted_search_and_a_model_that_has_none(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PEPPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PEPPER_WEB_SEARCH_PROVIDER", "hosted")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert code != 0 and "hosted but the small tier's model (none set up) has no hosted web search" in out
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor")
    assert "hosted; the research helper runs on the small tier" in out
