"""A loopback plugin: one occupant for each slot, whose behaviour a test picks per plugin name.

``MODES[name]``: "answer" (default), "raise", "slow" (sleeps past any slot's limit), "malformed"
(returns something the slot does not accept). ``CALLS[name]`` counts the calls each received and
``SEEN[name]`` keeps the last arguments.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

MODES: dict[str, str] = {}
CALLS: Counter[str] = Counter()
SEEN: dict[str, Any] = {}


async def _behave(name: str, args: Any, answer: Any) -> Any:
    CALLS[name] += 1
    SEEN[name] = args
    mode = MODES.get(name, "answer")
    if mode == "raise":
        raise RuntimeError(f"{name} is down")
    if mode == "slow":
        await asyncio.sleep(3600)
    if mode == "malformed":
        return {"not": "the slot's type"}
    return answer() if callable(answer) else answer


class _Memory:
    name = "loopback_memory"
    slot = "memory"

    async def search(self, db: Any, account_id: Any, query: str, *, limit: int) -> Any:
        from core.memory.search import SearchHit

        def hit() -> list[Any]:
            text = f"{self.name} found {query}"
            return [
                SearchHit("message", 1, datetime(2025, 1, 1, tzinfo=UTC), "sms", "inbound", None, None, text, "meaning")
            ]

        return await _behave(self.name, (account_id, query, limit), hit)


class LoopbackMemory(_Memory):
    pass


class OtherMemory(_Memory):
    name = "other_memory"


class LoopbackWeb:
    name = "loopback_web"
    slot = "web_search"

    async def search(self, query: str, count: int = 5) -> Any:
        from core.web.search import SearchHit

        return await _behave(
            self.name, (query, count), lambda: [SearchHit("Loopback", "https://loopback.test/", query)]
        )


class LoopbackSandbox:
    name = "loopback_sandbox"
    slot = "sandbox"

    async def run(self, program: str, argv: list[str], *, env: dict[str, str], time_limit: float) -> Any:
        from core.slots.sandbox import SandboxResult

        return await _behave(
            self.name, {"program": program, "argv": argv, "env": env}, lambda: SandboxResult("loopback ran", 0)
        )


class LoopbackSelect:
    name = "loopback_select"
    slot = "model_select"
    TIERS: tuple[str, ...] = ("large",)

    async def chain_for(self, request: Any) -> Any:
        from core.models.select import ModelPlan

        return await _behave(self.name, request, lambda: ModelPlan(self.TIERS))


class LoopbackHeartbeat:
    name = "loopback_heartbeat"
    slot = "heartbeat_interval"

    async def allowed(self, pulse: Any) -> Any:
        return await _behave(self.name, pulse, pulse.usage not in ("critical", "dead"))


class LoopbackCompaction:
    name = "loopback_compaction"
    slot = "compaction"

    async def compact(self, account_id: Any, view: Any, timezone: str, config: Any, *, web: bool) -> Any:
        return await _behave(self.name, view, f"Memory (loopback): {len(view.messages)} message(s).")


class LoopbackHarness:
    name = "loopback_harness"
    slot = "harness"

    async def run(self, loop: Any) -> Any:
        from text_loop.loop import LoopResult

        return await _behave(self.name, loop, lambda: LoopResult("the loopback harness answered", "replied"))


class NoClaim:
    """Has a memory search but never claims the slot: naming it for memory is stale."""

    name = "no_claim"

    async def search(self, *args: Any, **kw: Any) -> Any:
        return []


class LoopbackProtocol:
    """An additive model protocol adapter; it tries to take the name "openai" too (refused)."""

    name = "loopback_protocol"
    kind = "model_protocol"
    protocols = ("loopback", "openai")

    def adapter(self, settings: Any) -> Any:
        from core.models.adapters.base import ModelAdapter
        from core.models.types import Generation, Usage

        class Adapter(ModelAdapter):
            provider = "loopback"

            async def _generate(self, prompt: Any, options: Any) -> Any:
                said = prompt.messages[-1].content if prompt.messages else ""
                return Generation(
                    f"loopback {options.model} heard: {said}", (), Usage(3, 4), options.model, self.provider, "stop"
                )

            async def _stream(self, prompt: Any, options: Any) -> Any:
                yield await self._generate(prompt, options)

            def _convert(self, exc: Exception) -> Any:
                return None

        return Adapter()


class LoopbackRoute:
    """Additive HTTP routes under /plugins/loopback_route/; two of them are refused (a path that
    climbs out of the prefix, and the same method and path twice)."""

    name = "loopback_route"
    kind = "route"

    def routes(self) -> list[Any]:
        from core.slots.plugins import PluginResponse, PluginRoute

        async def hello(request: Any) -> Any:
            return PluginResponse(200, json.dumps({"plugin": self.name, "path": request.path, "query": request.query}))

        async def echo(request: Any) -> Any:
            if request.body[:1] != b"{":
                return PluginResponse(400, json.dumps({"error": "not JSON"}))
            return PluginResponse(200, request.body)

        async def boom(request: Any) -> Any:
            raise RuntimeError("the plugin's handler failed")

        return [
            PluginRoute("GET", "/hello", hello),
            PluginRoute("POST", "/echo", echo),
            PluginRoute("GET", "/boom", boom),
            PluginRoute("GET", "/../healthz", hello),
            PluginRoute("GET", "/hello", boom),
        ]


class LoopbackVoice:
    """An additive realtime voice provider: engine ``plugin:loopback_voice``."""

    name = "loopback_voice"
    kind = "voice_provider"

    def engine(self, settings: Any, models: Any) -> Any:
        SEEN[self.name] = (settings, models)
        return self


# --- Text channels (kind "channel") ---------------------------------------------------------------

SENT: list[tuple[str, str, str, str]] = []  # (plugin, address, text, key) of every reply sent
HOOK_TOKEN = "loopback-hook-secret"  # what the webhook's caller must show
_LINK: dict[str, asyncio.Queue[tuple[str, str, str]]] = {}


def link_queue() -> asyncio.Queue[tuple[str, str, str]]:
    """What the long-lived connection receives: ``(address, text, key)`` put here by a test."""
    return _LINK.setdefault("queue", asyncio.Queue())


class _Sender:
    name = ""
    kind = "channel"

    async def send(self, address: str, text: str, key: str) -> Any:
        CALLS[f"{self.name}.send"] += 1
        SENT.append((self.name, address, text, key))
        return f"{self.name}-{len(SENT)}"


class LoopbackHook(_Sender):
    """A webhook provider: POST /plugins/loopback_hook/inbound with the caller's token."""

    name = "loopback_hook"

    def routes(self, inbox: Any) -> list[Any]:
        from core.errors import InvalidInput
        from core.slots.plugins import PluginResponse, PluginRoute

        async def inbound(request: Any) -> Any:
            if request.headers.get("X-Loopback-Token") != HOOK_TOKEN:
                return PluginResponse(403, json.dumps({"error": "who are you?"}))
            try:
                data = json.loads(request.body)
                created = await inbox.receive(data.get("from"), data.get("text"), data.get("id"))
            except (ValueError, AttributeError):
                return PluginResponse(400, json.dumps({"error": "not JSON"}))
            except InvalidInput as exc:
                return PluginResponse(400, json.dumps({"error": exc.message}))
            return PluginResponse(200, json.dumps({"recorded": created}))

        return [PluginRoute("POST", "/inbound", inbound)]


class LoopbackLink(_Sender):
    """A long-lived connection: what arrives on ``link_queue()`` is handed to the inbox."""

    name = "loopback_link"

    async def run(self, inbox: Any) -> None:
        CALLS[f"{self.name}.run"] += 1
        queue = link_queue()
        while True:
            address, text, key = await queue.get()
            await inbox.receive(address, text, key)


class CrashingLink(_Sender):
    """A long-lived connection that fails at once, every time it is started."""

    name = "crashing_link"

    async def run(self, inbox: Any) -> None:
        CALLS[f"{self.name}.run"] += 1
        raise ConnectionError("the crashing link's service is down")
