"""A scripted ModelService: replies from a queue, remembers every prompt it was given.

For tests and benchmarks of the harness. Queue ``Generation`` objects (``reply``/``calls`` build
them) or exceptions to raise; each ``generate`` takes the next one. The wire-level loopback peers
replace it where a test needs the real router and adapters.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from core.models.errors import ModelNotConfigured
from core.models.types import Generation, Prompt, StreamEvent, TextDelta, ToolCall, Usage

_ids = itertools.count(1)


def reply(text: str, *, model: str = "scripted-small") -> Generation:
    return Generation(text, (), Usage(10, max(1, len(text) // 4)), model, "scripted", "stop")


def calls(
    *requested: tuple[str, dict[str, Any]] | ToolCall, text: str = "", model: str = "scripted-small"
) -> Generation:
    """A generation asking for tools: ``calls(("current_time", {}), ("add_note", {"text": "x"}))``."""
    made = tuple(c if isinstance(c, ToolCall) else ToolCall(f"call_{next(_ids)}", c[0], dict(c[1])) for c in requested)
    return Generation(text, made, Usage(10, 5), model, "scripted", "tool_calls")


@dataclass(frozen=True)
class Received:
    prompt: Prompt
    conversation_key: str
    tier: str
    background: bool


Step = Generation | BaseException | Callable[[Prompt], Generation]


class ScriptedModels:
    """A ModelService that plays a script. Running out of script is a test failure (AssertionError)."""

    def __init__(self, steps: Iterable[Step] = (), *, default: Step | None = None):
        self.steps: list[Step] = list(steps)
        self.default = default
        self.received: list[Received] = []

    def script(self, *steps: Step) -> ScriptedModels:
        self.steps.extend(steps)
        return self

    @property
    def prompts(self) -> list[Prompt]:
        return [r.prompt for r in self.received]

    async def generate(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> Generation:
        self.received.append(Received(prompt, conversation_key, tier, background))
        if self.steps:
            step = self.steps.pop(0)
        elif self.default is not None:
            step = self.default
        else:
            raise AssertionError(f"the scripted model ran out of script after {len(self.received) - 1} calls")
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(prompt)
        return step

    async def stream(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> AsyncGenerator[StreamEvent, None]:
        generation = await self.generate(prompt, conversation_key=conversation_key, tier=tier, background=background)
        if generation.text:
            yield TextDelta(generation.text)
        yield generation


class UnconfiguredModels(ScriptedModels):
    """What the router does with no provider set up."""

    def __init__(self) -> None:
        super().__init__(default=ModelNotConfigured("no model provider is configured"))
