"""Anthropic through the Messages API, with prompt-cache breakpoints, effort and a thinking budget.

Mapping: the system prompt is two text blocks, the stable prefix carrying the one
``cache_control`` breakpoint (Anthropic caches tools, then system, in that order, so the breakpoint
covers the tools too; without a stable system text the last tool carries it) and the dynamic part
after it. An assistant's tool calls are ``tool_use`` blocks; results go back as ``tool_result``
blocks in the next user message (adjacent results share one message). Thinking blocks come back in
``Generation.provider_state`` and are echoed before the tool calls, as the API requires.

Usage is normalised: ``input_tokens`` counts every input token, cache reads included
(``cached_input_tokens``). This SDK version has no ``temperature``; it is not sent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anthropic

from core.models.adapters.base import (
    HOSTED_SEARCH_ASK,
    HOSTED_SEARCH_TOKENS,
    CallOptions,
    ModelAdapter,
    error_for_status,
    finish_for,
    parse_arguments,
    report_usage,
)
from core.models.errors import ModelError, ModelTransientError
from core.models.types import (
    ChatMessage,
    FinishReason,
    Generation,
    Prompt,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
    WebSource,
)

PROVIDER = "anthropic"
_FINISH: dict[str | None, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
    "pause_turn": "stop",
}
_EFFORT = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
}
_CACHE = {"type": "ephemeral"}
_THINKING = ("thinking", "redacted_thinking")


def _messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "user":
            add("user", [{"type": "text", "text": m.content}])
        elif m.role == "assistant":
            blocks = [
                {k: v for k, v in s.items() if k != "provider"}
                for s in m.provider_state
                if s.get("provider") == PROVIDER
            ]
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
            add("assistant", blocks)
        elif m.tool_result is not None:
            r = m.tool_result
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}],
            )
    return out


def _params(prompt: Prompt, options: CallOptions) -> dict[str, Any]:
    system: list[dict[str, Any]] = []
    if prompt.system_stable:
        system.append({"type": "text", "text": prompt.system_stable, "cache_control": _CACHE})
    if prompt.system_dynamic:
        system.append({"type": "text", "text": prompt.system_dynamic})
    params: dict[str, Any] = {
        "model": options.model,
        "messages": _messages(prompt.messages),
        "max_tokens": prompt.max_output_tokens,
    }
    if system:
        params["system"] = system
    if prompt.tools:
        tools = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in prompt.tools]
        if not prompt.system_stable:
            tools[-1]["cache_control"] = _CACHE
        params["tools"] = tools
    if options.thinking_budget:
        params["thinking"] = {"type": "enabled", "budget_tokens": options.thinking_budget}
        params["max_tokens"] = prompt.max_output_tokens + options.thinking_budget
    if options.effort:
        params["output_config"] = {"effort": _EFFORT.get(options.effort, options.effort)}
    return params


def _usage(u: Any) -> Usage:
    cache_read = getattr(u, "cache_read_input_tokens", 0) or 0
    cache_write = getattr(u, "cache_creation_input_tokens", 0) or 0
    return Usage(
        input_tokens=(u.input_tokens or 0) + cache_read + cache_write,
        output_tokens=u.output_tokens or 0,
        cached_input_tokens=cache_read,
    )


def _state(block: dict[str, Any]) -> dict[str, Any]:
    return {"provider": PROVIDER, **block}


# Anthropic's server-side web search, the version every current model takes.
WEB_SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


def _searched_sources(message: Any) -> list[WebSource]:
    """The pages of the ``web_search_tool_result`` blocks, each with the words the reply's
    citations quote from it. A search the tool reports failed raises (it is not "no results")."""
    quotes: dict[str, str] = {}
    pages: list[tuple[str, str]] = []
    for block in message.content:
        if block.type == "web_search_tool_result":
            content = block.content
            if not isinstance(content, list):
                code = getattr(content, "error_code", "unknown")
                raise ModelTransientError(f"anthropic's web search failed: {code}", provider=PROVIDER)
            pages.extend((page.title or page.url, page.url) for page in content if page.type == "web_search_result")
        elif block.type == "text":
            for citation in getattr(block, "citations", None) or ():
                if citation.type == "web_search_result_location" and citation.url not in quotes:
                    quotes[citation.url] = citation.cited_text or ""
    return [WebSource(title, url, quotes.get(url, "")) for title, url in pages]


class AnthropicAdapter(ModelAdapter):
    provider = PROVIDER
    supports_hosted_search = True

    def __init__(self, *, api_key: str, base_url: str | None = None, timeout: float = 120.0) -> None:
        self._client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)

    async def _generate(self, prompt: Prompt, options: CallOptions) -> Generation:
        message = await self._client.messages.create(**_params(prompt, options))
        texts: list[str] = []
        calls: list[ToolCall] = []
        state: list[dict[str, Any]] = []
        for block in message.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(block.id, block.name, parse_arguments(block.input)))
            elif block.type in _THINKING:
                state.append(_state(block.model_dump(exclude_none=True)))
        tool_calls = tuple(calls)
        return Generation(
            "".join(texts),
            tool_calls,
            _usage(message.usage),
            options.model,
            PROVIDER,
            finish_for(tool_calls, _FINISH.get(message.stop_reason, "stop")),
            raw_id=message.id,
            extras={"provider_model": message.model},
            provider_state=tuple(state),
        )

    async def _stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]:
        stream = await self._client.messages.create(**_params(prompt, options), stream=True)
        blocks: dict[int, dict[str, Any]] = {}
        usage_start: Any = None
        output_tokens = 0
        stop: str | None = None
        ident, model, done = None, options.model, False
        try:
            async with stream:
                async for event in stream:
                    kind = event.type
                    if kind == "content_block_delta":
                        block, delta = blocks[event.index], event.delta
                        if delta.type == "text_delta":
                            block["text"] += delta.text
                            if delta.text:
                                yield TextDelta(delta.text)
                        elif delta.type == "input_json_delta":
                            block["json"] += delta.partial_json
                        elif delta.type == "thinking_delta":
                            block["thinking"] += delta.thinking
                        elif delta.type == "signature_delta":
                            block["signature"] = block.get("signature", "") + delta.signature
                    elif kind == "content_block_start":
                        start = event.content_block.model_dump(exclude_none=True)
                        if start["type"] == "text":
                            start["text"] = ""
                        elif start["type"] == "tool_use":
                            start["json"] = ""
                        elif start["type"] == "thinking":
                            start["thinking"] = start.get("thinking", "")
                        blocks[event.index] = start
                    elif kind == "message_start":
                        ident, model, usage_start = event.message.id, event.message.model, event.message.usage
                    elif kind == "message_delta":
                        stop = event.delta.stop_reason or stop
                        output_tokens = event.usage.output_tokens or output_tokens
                    elif kind == "message_stop":
                        done = True
        except Exception as exc:
            if usage_start is not None:  # message_start named the input tokens: the cut call used them
                report_usage(exc, _usage(usage_start))
            raise
        if not done or usage_start is None:
            error = ModelTransientError("the anthropic stream ended before message_stop", provider=PROVIDER)
            if usage_start is not None:
                report_usage(error, _usage(usage_start))
            raise error
        texts: list[str] = []
        calls: list[ToolCall] = []
        state: list[dict[str, Any]] = []
        for _, block in sorted(blocks.items()):
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                calls.append(ToolCall(block["id"], block["name"], parse_arguments(block["json"] or block.get("input"))))
            elif block["type"] in _THINKING:
                state.append(_state(block))
        base = _usage(usage_start)
        usage = Usage(base.input_tokens, output_tokens or base.output_tokens, base.cached_input_tokens)
        tool_calls = tuple(calls)
        yield Generation(
            "".join(texts),
            tool_calls,
            usage,
            options.model,
            PROVIDER,
            finish_for(tool_calls, _FINISH.get(stop, "stop")),
            raw_id=ident,
            extras={"provider_model": model},
            provider_state=tuple(state),
        )

    async def _hosted_search(self, query: str, options: CallOptions, count: int) -> list[WebSource]:
        message = await self._client.messages.create(
            model=options.model,
            max_tokens=HOSTED_SEARCH_TOKENS,
            messages=[{"role": "user", "content": HOSTED_SEARCH_ASK.format(query=query)}],
            tools=[WEB_SEARCH_TOOL],  # type: ignore[list-item]
        )
        return _searched_sources(message)

    async def _list_models(self) -> list[str]:
        page = await self._client.models.list(limit=20)  # the first page is proof enough
        return [model.id for model in page.data]

    def _convert(self, exc: Exception) -> ModelError | None:
        if isinstance(exc, anthropic.APIStatusError):
            return error_for_status(exc.status_code, f"anthropic answered HTTP {exc.status_code}", PROVIDER)
        if isinstance(exc, anthropic.APITimeoutError):
            return ModelTransientError("anthropic timed out", provider=PROVIDER)
        if isinstance(exc, anthropic.APIConnectionError):
            return ModelTransientError("anthropic connection failed", provider=PROVIDER)
        if isinstance(exc, anthropic.APIError):
            # Includes an ``error`` event inside the stream (e.g. overloaded).
            return ModelTransientError(f"anthropic failed: {type(exc).__name__}", provider=PROVIDER)
        return None

    async def aclose(self) -> None:
        await self._client.close()
