"""Additive plugin kinds from the loopback plugin: HTTP routes under the plugin's prefix, and a
model protocol adapter under its own name that cannot take a built-in protocol's."""

from __future__ import annotations

import json

from core.models.router import ModelRouter
from core.models.types import ChatMessage, Prompt
from core.settings import Settings
from gateway.app import create_app


async def test_plugin_routes_answer_under_their_prefix_only(plugin) -> None:
    app = create_app(Settings(), None)
    client = app.test_client()
    response = await client.get("/plugins/loopback_route/hello?x=1")
    assert response.status_code == 200
    assert json.loads(await response.get_data()) == {"plugin": "loopback_route", "path": "/hello", "query": {"x": "1"}}
    # Garbage: the plugin's own answer; a path it never declared: 404.
    response = await client.post("/plugins/loopback_route/echo", data=b"\x00\xffnot json")
    assert response.status_code == 400
    assert (await client.get("/plugins/loopback_route/nothing")).status_code == 404
    assert (await client.get("/plugins/no_such_plugin/hello")).status_code == 404
    # A forged route that climbs out of the prefix is not mounted, and the core route is untouched.
    paths = {rule.rule for rule in app.url_map.iter_rules()}
    assert not any(".." in p for p in paths)
    assert (await client.get("/healthz")).status_code == 503  # the core health check (no database here)
    # The same method and path twice: the first stays.
    assert (await client.get("/plugins/loopback_route/hello")).status_code == 200
    # A handler that raises answers 500 with a fixed body.
    response = await client.get("/plugins/loopback_route/boom")
    assert (response.status_code, await response.get_data()) == (500, b'{"error": "plugin-failed"}')


async def test_a_model_protocol_plugin_adds_a_protocol_but_never_replaces_a_builtin(plugin) -> None:
    settings = Settings(models={"tiers": {"small": {"model": "plugin:loopback:echo-1"}}})
    router = ModelRouter.from_settings(settings)
    assert "plugin:loopback" in router.adapters
    assert "plugin:openai" not in router.adapters and "openai" not in router.adapters
    prompt = Prompt(system_stable="", messages=(ChatMessage("user", "hi"),))
    generation = await router.generate(prompt, conversation_key="c")
    assert (generation.text, generation.model) == ("loopback echo-1 heard: hi", "plugin:loopback:echo-1")
    await router.aclose()


async def test_a_voice_provider_plugin_adds_an_engine_a_line_can_run_on(db_url, monkeypatch, capsys, plugin) -> None:
    import asyncio

    from cli_support import run_cli

    from voice.engines import RealtimeEngines, engine_available

    engines = RealtimeEngines(Settings(), models="text models")
    assert engines.get("plugin:loopback_voice") is not None
    assert plugin.SEEN["loopback_voice"][1] == "text models"
    assert engine_available("plugin:loopback_voice") and not engine_available("plugin:nothing")
    monkeypatch.setenv("DATABASE_URL", db_url)

    def cli(*argv: str) -> tuple[int, str, str]:
        return run_cli(monkeypatch, capsys, *argv)

    await asyncio.to_thread(cli, "account", "create", "Ada")
    await asyncio.to_thread(cli, "line", "assign", "+14155550100", "personal", "Ada")
    code, out, _ = await asyncio.to_thread(cli, "line", "engine", "+14155550100", "plugin:loopback_voice")
    assert (code, out) == (0, "calls on +14155550100 now run on plugin:loopback_voice")
    code, _, err = await asyncio.to_thread(cli, "line", "engine", "+14155550100", "plugin:nothing")
    assert code == 1 and "not part of this build; nothing changed" in err
