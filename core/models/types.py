"""The normalised vocabulary of a model call, the same for every provider.

Plain dataclasses: the hot path builds many of them, and they are what turn records store.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["user", "assistant", "tool"]
FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error"]
ServiceTier = Literal["standard", "background"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, one-paragraph description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class ChatMessage:
    """One message of the history.

    ``user``: ``content`` is what the person (or the harness, labelled) said.
    ``assistant``: ``content`` and/or ``tool_calls``.
    ``tool``: ``tool_result`` answers one earlier tool call.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_result: ToolResult | None = None
    # Opaque provider blocks of an assistant message (thinking blocks, thought signatures) that the
    # same provider needs echoed back on the next call; each dict names its "provider", and
    # adapters of other providers ignore it. Copied from ``Generation.provider_state``.
    provider_state: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Prompt:
    """Everything a generation needs except the model.

    ``system_stable`` is the byte-stable prefix (persona, rules, skills, dossier) that providers can
    cache; adapters place their cache breakpoint after it. ``system_dynamic`` follows it (the
    memory block). Tools are part of the cached prefix too, so their order must be stable.
    """

    system_stable: str
    messages: tuple[ChatMessage, ...]
    system_dynamic: str = ""
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int = 1024
    temperature: float | None = None


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class Generation:
    """The normalised result of one generation."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    model: str  # the model that actually ran (after routing and any failover)
    provider: str
    finish_reason: FinishReason
    raw_id: str | None = None
    failed_over_from: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    provider_state: tuple[dict[str, Any], ...] = ()

    def as_message(self) -> ChatMessage:
        """The assistant message to append to the history for the next round."""
        return ChatMessage("assistant", self.text, self.tool_calls, provider_state=self.provider_state)


@dataclass(frozen=True)
class WebSource:
    """A page a provider's hosted web search found: its title, address and the words it cited."""

    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class TextDelta:
    text: str


# A stream yields TextDelta items, then exactly one Generation (the complete result) last.
StreamEvent = TextDelta | Generation


class ModelService(Protocol):
    """What the harness and the memory jobs call; the router (``core.models.router``) implements it.

    ``tier`` names a configured tier ("small" by default; larger ones by name). The router picks
    the model inside the tier's mix from ``conversation_key`` and the date, so one conversation
    stays on one model for a day. ``background=True`` asks for the provider's low-priority tier.
    Raises ``ModelNotConfigured`` when no provider is set up, other ``ModelError``s on failure.
    """

    async def generate(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> Generation: ...

    def stream(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> AsyncGenerator[StreamEvent, None]: ...
