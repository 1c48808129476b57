"""``pepper slot``, ``pepper household``, ``pepper plugin list`` and ``pepper doctor``'s slot check,
with the loopback plugin installed."""

from __future__ import annotations

from cli_support import run_cli

from core.store import StoreReport
from gateway.doctor import MISSING, OK, Report, _slots


def test_slots_are_listed_set_scoped_and_cleared(db_url, monkeypatch, capsys, plugin):
    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "list")
    assert code == 0
    for slot in ("memory", "web_search", "sandbox", "model_select", "heartbeat_interval", "compaction", "harness"):
        assert f"\n{slot} " in f"\n{out}" and "default: builtin" in out
    assert run_cli(monkeypatch, capsys, "account", "create", "Ada")[0] == 0
    assert run_cli(monkeypatch, capsys, "account", "create", "Bob")[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "set", "memory", "loopback_memory", "--account", "Ada")
    assert (code, out) == (0, "the memory slot of account Ada is now loopback_memory")
    assert run_cli(monkeypatch, capsys, "household", "create", "Home")[1] == "created household Home"
    assert run_cli(monkeypatch, capsys, "household", "add", "Home", "Bob")[1] == "Bob is now in household Home"
    assert run_cli(monkeypatch, capsys, "household", "list")[1] == "Home: Bob"
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "set", "memory", "other_memory", "--household", "Home")
    assert out == "the memory slot of household Home is now other_memory"
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "set", "harness", "loopback_harness")
    assert out == "the harness slot of the installation is now loopback_harness"
    # A name that is not installed, or a plugin that does not claim the slot, is refused.
    code, _, err = run_cli(monkeypatch, capsys, "slot", "set", "memory", "nothing_here")
    assert code == 1 and "nothing_here cannot occupy the memory slot: not installed; nothing changed" in err
    code, _, err = run_cli(monkeypatch, capsys, "slot", "set", "memory", "no_claim")
    assert code == 1 and "does not claim the memory slot" in err
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "list")
    assert "harness             loopback_harness" in out
    assert "  account Ada: loopback_memory" in out and "  household Home: other_memory" in out
    assert run_cli(monkeypatch, capsys, "slot", "clear", "harness")[1] == (
        "the harness slot of the installation is back to the default"
    )
    assert run_cli(monkeypatch, capsys, "slot", "clear", "harness")[1] == "the installation had no harness setting"
    assert "harness             builtin" in run_cli(monkeypatch, capsys, "slot", "list")[1]


def test_slot_list_says_a_stale_occupant_is_using_the_default_instead(db_url, monkeypatch, capsys, plugin):
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert run_cli(monkeypatch, capsys, "slot", "set", "memory", "loopback_memory")[0] == 0
    # As if a new version of the plugin moved to another slot after it was pinned.
    monkeypatch.setattr(plugin.LoopbackMemory, "slot", "web_search")
    code, out, _ = run_cli(monkeypatch, capsys, "slot", "list")
    assert code == 0
    assert (
        "  installation: loopback_memory: using the default instead "
        "(does not claim the memory slot (it claims web_search))" in out
    )


def test_doctor_flags_an_occupant_that_cannot_answer(plugin):
    report = Report()
    store = StoreReport("embedded", "here", "running")
    store.slot_settings = [("installation", "memory", "removed_plugin"), ("account Ada", "memory", "no_claim"),
                           ("installation", "harness", "loopback_harness")]  # fmt: skip
    _slots(report, store)
    checks = {(c.area, c.status): c.detail for c in report.checks}
    assert checks[("slot: memory (installation)", MISSING)] == (
        "removed_plugin not installed: using the default instead (pepper slot clear memory)"
    )
    assert "does not claim the memory slot" in checks[("slot: memory (account Ada)", MISSING)]
    assert checks[("slot: harness (installation)", OK)] == "occupied by loopback_harness"


def test_plugins_are_listed_with_what_they_claim(db_url, monkeypatch, capsys, plugin):
    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, _ = run_cli(monkeypatch, capsys, "plugin", "list")
    assert code == 0
    assert "loopback_memory" in out and "claims the memory slot" in out
    assert "no_claim" in out and "claims no slot and declares no kind" in out
    assert "loopback_route" in out and "adds a route" in out
    assert "loopback_hook" in out and "adds a text channel (a webhook)" in out
    assert "loopback_link" in out and "adds a text channel (a connection)" in out


def test_sandbox_run_strips_the_settings_secrets_from_the_child(db_url, monkeypatch, capsys, plugin):
    import sys

    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-cli-secret")
    monkeypatch.setenv("HARMLESS", "holds sk-cli-secret inside")
    monkeypatch.setenv("VISIBLE", "yes")
    program = "import os; print(sorted(k for k in os.environ if k in ('OPENAI_API_KEY', 'HARMLESS', 'VISIBLE')))"
    code, out, _ = run_cli(monkeypatch, capsys, "sandbox", "run", sys.executable, "-c", program)
    assert (code, out) == (0, "['VISIBLE']\n(exit status 0)")
    code, out, _ = run_cli(monkeypatch, capsys, "sandbox", "run", "/no/such/program")
    assert code == 0 and out.endswith("(exit status 127)")


def test_plugin_install_of_something_pip_cannot_install_is_one_error(monkeypatch, capsys, tmp_path, plugin):
    code, _, err = run_cli(monkeypatch, capsys, "plugin", "install", str(tmp_path / "missing"))
    assert code == 1 and err.startswith("pepper: error: pip could not install")
