"""OpenAI through the Responses API (``POST /v1/responses``), with reasoning effort and service tier.

Mapping: the system prompt goes in ``instructions`` (stable prefix first, so OpenAI's automatic
prefix cache hits); tools are ``function`` tools; an assistant's tool calls are ``function_call``
items and tool results ``function_call_output`` items. ``background`` asks for ``service_tier="flex"``.
Nothing is stored at OpenAI (``store=False``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import openai

from core.models.adapters.base import (
    HOSTED_SEARCH_ASK,
    HOSTED_SEARCH_TOKENS,
    CallOptions,
    ModelAdapter,
    error_for_status,
    finish_for,
    parse_arguments,
    system_text,
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

PROVIDER = "openai"


def convert_openai_error(exc: Exception, provider: str) -> ModelError | None:
    """OpenAI SDK errors (also raised by OpenAI-compatible servers) to the model error tree."""
    if isinstance(exc, openai.APIStatusError):
        return error_for_status(exc.status_code, f"{provider} answered HTTP {exc.status_code}", provider)
    if isinstance(exc, openai.APITimeoutError):
        return ModelTransientError(f"{provider} timed out", provider=provider)
    if isinstance(exc, openai.APIConnectionError):
        return ModelTransientError(f"{provider} connection failed", provider=provider)
    if isinstance(exc, openai.APIError):
        return ModelTransientError(f"{provider} failed: {type(exc).__name__}", provider=provider)
    return None


def sdk_arguments(params: dict[str, Any], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``params`` as arguments of an SDK ``create``: the model as itself, the rest as ``extra_body``.

    Why: ``create`` walks every argument through the SDK's TypedDict transform (``_transform.py``)
    to rename aliased keys, which ours never use; over a prompt's messages and tool schemas that
    walk took about 70 % of a turn worker's CPU (cProfile, ``bench/sms_webhook.py``). ``extra_body``
    goes into the request's JSON as it is, and over the arguments, so the body sent is the same.
    ``required``: arguments ``create`` insists on, given empty (``extra_body`` has their values)."""
    model, body = params["model"], {k: v for k, v in params.items() if k != "model"}
    return {"model": model, **dict.fromkeys(required, ()), "extra_body": body}


def _input_items(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "user":
            items.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            for call in m.tool_calls:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": json.dumps(call.arguments),
                    }
                )
        elif m.tool_result is not None:
            r = m.tool_result
            items.append({"type": "function_call_output", "call_id": r.call_id, "output": r.content})
    return items


def _params(prompt: Prompt, options: CallOptions) -> dict[str, Any]:
    params: dict[str, Any] = {
        "model": options.model,
        "input": _input_items(prompt.messages),
        "max_output_tokens": prompt.max_output_tokens,
        "store": False,
    }
    instructions = system_text(prompt)
    if instructions:
        params["instructions"] = instructions
    if prompt.tools:
        params["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in prompt.tools
        ]
    if options.effort:
        params["reasoning"] = {"effort": options.effort}
    if prompt.temperature is not None:
        params["temperature"] = prompt.temperature
    if options.background:
        params["service_tier"] = "flex"
    return params


def _generation(response: Any, options: CallOptions) -> Generation:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output or ():
        if item.type == "message":
            texts.extend(part.text for part in item.content if part.type == "output_text")
        elif item.type == "function_call":
            calls.append(ToolCall(item.call_id, item.name, parse_arguments(item.arguments)))
    reason: FinishReason = "stop"
    if response.status == "incomplete":
        why = getattr(response.incomplete_details, "reason", None)
        reason = "content_filter" if why == "content_filter" else "length"
    elif response.status == "failed":
        reason = "error"
    u = response.usage
    usage = Usage()
    if u is not None:
        usage = Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cached_input_tokens=getattr(u.input_tokens_details, "cached_tokens", 0) or 0,
            reasoning_tokens=getattr(u.output_tokens_details, "reasoning_tokens", 0) or 0,
        )
    tool_calls = tuple(calls)
    extras: dict[str, Any] = {"provider_model": response.model}
    if response.service_tier:
        extras["service_tier"] = response.service_tier
    return Generation(
        "".join(texts),
        tool_calls,
        usage,
        options.model,
        PROVIDER,
        finish_for(tool_calls, reason),
        raw_id=response.id,
        extras=extras,
    )


def _cited_sources(response: Any) -> list[WebSource]:
    """The ``url_citation`` annotations of the reply (with the words they cite), then the search
    call's own sources (addresses only) that no citation named."""
    cited: list[WebSource] = []
    found: list[str] = []
    for item in response.output or ():
        if item.type == "web_search_call":
            for source in getattr(getattr(item, "action", None), "sources", None) or ():
                if getattr(source, "url", None):
                    found.append(source.url)
        elif item.type == "message":
            for part in item.content:
                if part.type != "output_text":
                    continue
                for note in part.annotations or ():
                    if note.type == "url_citation" and note.url:
                        words = part.text[note.start_index : note.end_index].strip()
                        cited.append(WebSource(note.title or note.url, note.url, words))
    return cited + [WebSource(url, url, "") for url in found]


class OpenAIResponsesAdapter(ModelAdapter):
    provider = PROVIDER
    supports_background = True
    supports_hosted_search = True

    def __init__(self, *, api_key: str, base_url: str | None = None, timeout: float = 120.0) -> None:
        self._client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)
        # The SDK imports its Responses resource on first access and builds the response models on
        # the first reply: well over a second of CPU, which would land on the event loop inside the
        # first turn after start-up (stalling every webhook meanwhile, and on a loaded machine
        # making that turn several times slower). Pay it here, while the server starts.
        _ = self._client.responses
        openai.types.responses.Response.model_rebuild()

    async def _generate(self, prompt: Prompt, options: CallOptions) -> Generation:
        response = await self._client.responses.create(**sdk_arguments(_params(prompt, options)))
        return _generation(response, options)

    async def _stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]:
        stream = await self._client.responses.create(**sdk_arguments(_params(prompt, options)), stream=True)
        async with stream:
            async for event in stream:
                kind = event.type
                if kind == "response.output_text.delta":
                    if event.delta:
                        yield TextDelta(event.delta)
                elif kind in ("response.completed", "response.incomplete"):
                    yield _generation(event.response, options)
                    return
                elif kind in ("response.failed", "error"):
                    raise ModelTransientError("openai reported a failed response mid-stream", provider=PROVIDER)
        raise ModelTransientError("openai stream ended before the response completed", provider=PROVIDER)

    async def _list_models(self) -> list[str]:
        return [model.id async for model in self._client.models.list()]

    async def _hosted_search(self, query: str, options: CallOptions, count: int) -> list[WebSource]:
        params = {
            "model": options.model,
            "input": HOSTED_SEARCH_ASK.format(query=query),
            "tools": [{"type": "web_search"}],
            "include": ["web_search_call.action.sources"],
            "max_output_tokens": HOSTED_SEARCH_TOKENS,
            "store": False,
        }
        return _cited_sources(await self._client.responses.create(**sdk_arguments(params)))

    def _convert(self, exc: Exception) -> ModelError | None:
        return convert_openai_error(exc, PROVIDER)

    async def aclose(self) -> None:
        await self._client.close()
