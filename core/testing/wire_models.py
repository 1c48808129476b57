"""The scripted model's interface, played over the wire.

``WireScriptedModels`` takes the same script as :class:`core.testing.scripted.ScriptedModels`
(``Generation`` objects and model errors) but answers every call through the real
:class:`~core.models.router.ModelRouter`, the OpenAI Responses adapter and the official SDK, over
HTTP to the loopback :class:`~core.testing.peers.OpenAIPeer`. Harness tests use it so that what
they check is what a real provider conversation produces, tool-call ids and usage included.

Tiers are ``small``/``medium``/``large`` on models ``gpt-small``/``gpt-medium``/``gpt-large``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.errors import ModelAuthError, ModelError, ModelRequestError, ModelTransientError
from core.models.router import OPENAI, ModelChoice, ModelRouter, Tier
from core.models.types import Generation, Prompt, StreamEvent, TextDelta
from core.testing.peers import OpenAIPeer, Reply, ScriptedCall, fault
from core.testing.scripted import Received

TIERS = ("small", "medium", "large")


def _wire_fault(error: ModelError) -> Reply | None:
    """The HTTP answer that makes the SDK raise ``error``'s kind; None when it has no wire form."""
    if isinstance(error, ModelTransientError):
        return fault(503, str(error))
    if isinstance(error, ModelAuthError):
        return fault(401, str(error))
    if isinstance(error, ModelRequestError):
        return fault(400, str(error))
    return None


class WireScriptedModels:
    def __init__(self, peer: OpenAIPeer, router: ModelRouter):
        self.peer = peer
        self.router = router
        self.received: list[Received] = []
        # Errors with no wire form (no provider configured, a cancellation) are raised here, in order.
        self._local: list[BaseException | None] = []

    def script(self, *steps: Generation | BaseException) -> WireScriptedModels:
        for step in steps:
            if isinstance(step, Generation):
                calls = tuple(ScriptedCall(c.name, dict(c.arguments)) for c in step.tool_calls)
                self.peer.script(Reply(text=step.text, tool_calls=calls))
                self._local.append(None)
            elif isinstance(step, BaseException):
                wire = _wire_fault(step) if isinstance(step, ModelError) else None
                if wire is not None:
                    self.peer.script(wire)
                self._local.append(None if wire is not None else step)
            else:
                raise TypeError(f"a wire script holds generations and exceptions, not {type(step).__name__}")
        return self

    @property
    def prompts(self) -> list[Prompt]:
        return [r.prompt for r in self.received]

    async def generate(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> Generation:
        self.received.append(Received(prompt, conversation_key, tier, background))
        if not self._local:
            raise AssertionError(f"the scripted model ran out of script after {len(self.received) - 1} calls")
        local = self._local.pop(0)
        if local is not None:
            raise local
        return await self.router.generate(prompt, conversation_key=conversation_key, tier=tier, background=background)

    async def stream(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> AsyncGenerator[StreamEvent, None]:
        generation = await self.generate(prompt, conversation_key=conversation_key, tier=tier, background=background)
        if generation.text:
            yield TextDelta(generation.text)
        yield generation


@asynccontextmanager
async def wire_scripted_models() -> AsyncIterator[WireScriptedModels]:
    async with OpenAIPeer() as peer:
        adapter = OpenAIResponsesAdapter(api_key="sk-test", base_url=peer.base_url, timeout=10.0)
        router = ModelRouter({OPENAI: adapter}, {name: Tier(name, (ModelChoice(f"gpt-{name}"),)) for name in TIERS})
        try:
            yield WireScriptedModels(peer, router)
        finally:
            await router.aclose()
