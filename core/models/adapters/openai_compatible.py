"""Any OpenAI-compatible endpoint (Ollama, vLLM, a llama.cpp server) through Chat Completions.

Mapping: one ``system`` message (stable prefix first), ``function`` tools, an assistant message
with ``tool_calls``, and one ``tool`` message per result. Streaming asks for usage in the last
chunk (``stream_options.include_usage``); servers that ignore it report zero usage.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import openai

from core.models.adapters.base import CallOptions, ModelAdapter, finish_for, parse_arguments, system_text
from core.models.adapters.openai_responses import convert_openai_error, sdk_arguments
from core.models.errors import ModelError, ModelTransientError
from core.models.types import FinishReason, Generation, Prompt, StreamEvent, TextDelta, ToolCall, Usage

PROVIDER = "openai-compatible"
_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


def _messages(prompt: Prompt) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = system_text(prompt)
    if system:
        out.append({"role": "system", "content": system})
    for m in prompt.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": m.content or None}
            if m.tool_calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in m.tool_calls
                ]
            out.append(message)
        elif m.tool_result is not None:
            out.append({"role": "tool", "tool_call_id": m.tool_result.call_id, "content": m.tool_result.content})
    return out


def _params(prompt: Prompt, options: CallOptions) -> dict[str, Any]:
    params: dict[str, Any] = {
        "model": options.model,
        "messages": _messages(prompt),
        "max_tokens": prompt.max_output_tokens,
    }
    if prompt.tools:
        params["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in prompt.tools
        ]
    if prompt.temperature is not None:
        params["temperature"] = prompt.temperature
    if options.effort:
        params["reasoning_effort"] = options.effort
    return params


def _usage(u: Any) -> Usage:
    if u is None:
        return Usage()
    return Usage(
        input_tokens=u.prompt_tokens or 0,
        output_tokens=u.completion_tokens or 0,
        cached_input_tokens=getattr(u.prompt_tokens_details, "cached_tokens", 0) or 0,
        reasoning_tokens=getattr(u.completion_tokens_details, "reasoning_tokens", 0) or 0,
    )


class OpenAICompatibleAdapter(ModelAdapter):
    provider = PROVIDER

    def __init__(self, *, base_url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        # Local servers ignore the key, but the SDK insists on one.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "unused", base_url=base_url, max_retries=0, timeout=timeout
        )

    async def _generate(self, prompt: Prompt, options: CallOptions) -> Generation:
        completion = await self._client.chat.completions.create(
            **sdk_arguments(_params(prompt, options), required=("messages",))
        )
        if not completion.choices:
            raise ModelTransientError("the compatible endpoint returned no choices", provider=PROVIDER)
        choice = completion.choices[0]
        calls = tuple(
            ToolCall(c.id, c.function.name, parse_arguments(c.function.arguments))
            for c in choice.message.tool_calls or ()
            if c.type == "function"
        )
        reason = _FINISH.get(choice.finish_reason, "stop")
        return Generation(
            choice.message.content or "",
            calls,
            _usage(completion.usage),
            options.model,
            PROVIDER,
            finish_for(calls, reason),
            raw_id=completion.id,
            extras={"provider_model": completion.model},
        )

    async def _stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]:
        params = {**_params(prompt, options), "stream_options": {"include_usage": True}}
        stream = await self._client.chat.completions.create(
            **sdk_arguments(params, required=("messages",)), stream=True
        )
        texts: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        reason: FinishReason | None = None
        usage, ident, model = Usage(), None, options.model
        async with stream:
            async for chunk in stream:
                ident, model = chunk.id, chunk.model or model
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        texts.append(delta.content)
                        yield TextDelta(delta.content)
                    for tc in delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        if tc.id:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                    if choice.finish_reason:
                        reason = _FINISH.get(choice.finish_reason, "stop")
        if reason is None:
            raise ModelTransientError("the compatible stream ended without a finish reason", provider=PROVIDER)
        tool_calls = tuple(
            ToolCall(s["id"], s["name"], parse_arguments(s["arguments"])) for _, s in sorted(calls.items())
        )
        yield Generation(
            "".join(texts),
            tool_calls,
            usage,
            options.model,
            PROVIDER,
            finish_for(tool_calls, reason),
            raw_id=ident,
            extras={"provider_model": model},
        )

    async def _list_models(self) -> list[str]:
        return [model.id async for model in self._client.models.list()]

    def _convert(self, exc: Exception) -> ModelError | None:
        return convert_openai_error(exc, PROVIDER)

    async def aclose(self) -> None:
        await self._client.close()
