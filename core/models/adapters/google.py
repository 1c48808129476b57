"""Google Gemini through google-genai ``generateContent`` / ``streamGenerateContent``, with thinking config.

Mapping: the system prompt is ``system_instruction`` (Gemini caches prefixes implicitly); tools are
``function_declarations`` with their JSON Schema; an assistant's tool calls are ``functionCall``
parts and results ``functionResponse`` parts (``{"result": ...}`` or ``{"error": ...}``) in a user
turn. Automatic function calling and the SDK's own retries are off. Thought signatures come back
in ``Generation.provider_state`` and are echoed on the matching calls. ``background`` asks for the
``flex`` service tier.

Usage is normalised: ``output_tokens`` includes thinking tokens (as OpenAI counts them).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import AsyncGenerator
from typing import Any

from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gt

from core.models.adapters.base import (
    HOSTED_SEARCH_ASK,
    HOSTED_SEARCH_TOKENS,
    CallOptions,
    ModelAdapter,
    error_for_status,
    finish_for,
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

PROVIDER = "google"
_LEVELS = {
    "none": "MINIMAL",
    "minimal": "MINIMAL",
    "low": "LOW",
    "medium": "MEDIUM",
    "high": "HIGH",
    "xhigh": "HIGH",
    "max": "HIGH",
}
_FILTERED = {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
_ids = itertools.count(1)


def _contents(messages: tuple[ChatMessage, ...]) -> list[gt.Content]:
    out: list[gt.Content] = []

    def add(role: str, parts: list[gt.Part]) -> None:
        if out and out[-1].role == role and out[-1].parts is not None:
            out[-1].parts.extend(parts)
        else:
            out.append(gt.Content(role=role, parts=parts))

    for m in messages:
        if m.role == "user":
            add("user", [gt.Part(text=m.content)])
        elif m.role == "assistant":
            signatures = {
                s.get("call_id"): s["thought_signature"]
                for s in m.provider_state
                if s.get("provider") == PROVIDER and "thought_signature" in s
            }
            parts = [gt.Part(text=m.content)] if m.content else []
            for c in m.tool_calls:
                signature = signatures.get(c.id)
                parts.append(
                    gt.Part(
                        function_call=gt.FunctionCall(id=c.id, name=c.name, args=c.arguments),
                        thought_signature=base64.b64decode(signature) if signature else None,
                    )
                )
            add("model", parts)
        elif m.tool_result is not None:
            r = m.tool_result
            payload = {"error": r.content} if r.is_error else {"result": r.content}
            add("user", [gt.Part(function_response=gt.FunctionResponse(id=r.call_id, name=r.name, response=payload))])
    return out


def _config(prompt: Prompt, options: CallOptions) -> gt.GenerateContentConfig:
    config = gt.GenerateContentConfig(
        max_output_tokens=prompt.max_output_tokens,
        automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
    )
    system = system_text(prompt)
    if system:
        config.system_instruction = system
    if prompt.tools:
        config.tools = [
            gt.Tool(
                function_declarations=[
                    gt.FunctionDeclaration(name=t.name, description=t.description, parameters_json_schema=t.parameters)
                    for t in prompt.tools
                ]
            )
        ]
    if prompt.temperature is not None:
        config.temperature = prompt.temperature
    if options.thinking_budget is not None:
        config.thinking_config = gt.ThinkingConfig(thinking_budget=options.thinking_budget)
    elif options.effort:
        config.thinking_config = gt.ThinkingConfig(thinking_level=_LEVELS.get(options.effort, "LOW"))  # type: ignore[arg-type]
    if options.background:
        config.service_tier = gt.ServiceTier.FLEX
    return config


class _Collector:
    """Gathers parts across stream chunks (or the one chunk of a plain call)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[ToolCall] = []
        self.state: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.usage: Any = None
        self.ident: str | None = None
        self.model: str | None = None

    def add(self, response: gt.GenerateContentResponse) -> list[str]:
        """Take one response chunk; return its new visible text pieces."""
        new: list[str] = []
        self.ident = response.response_id or self.ident
        self.model = response.model_version or self.model
        if response.usage_metadata is not None:
            self.usage = response.usage_metadata
        for candidate in (response.candidates or ())[:1]:
            if candidate.finish_reason is not None:
                self.finish = getattr(candidate.finish_reason, "value", str(candidate.finish_reason))
            for part in (candidate.content.parts if candidate.content else None) or ():
                if part.function_call is not None:
                    fc = part.function_call
                    call_id = fc.id or f"call_{next(_ids)}"
                    self.calls.append(ToolCall(call_id, fc.name or "", dict(fc.args or {})))
                    if part.thought_signature:
                        self.state.append(
                            {
                                "provider": PROVIDER,
                                "call_id": call_id,
                                "thought_signature": base64.b64encode(part.thought_signature).decode(),
                            }
                        )
                elif part.text and not part.thought:
                    new.append(part.text)
        self.texts.extend(new)
        return new

    def generation(self, options: CallOptions) -> Generation:
        u = self.usage
        usage = Usage()
        if u is not None:
            thoughts = u.thoughts_token_count or 0
            usage = Usage(
                input_tokens=u.prompt_token_count or 0,
                output_tokens=(u.candidates_token_count or 0) + thoughts,
                cached_input_tokens=u.cached_content_token_count or 0,
                reasoning_tokens=thoughts,
            )
        reason: FinishReason = "stop"
        if self.finish == "MAX_TOKENS":
            reason = "length"
        elif self.finish in _FILTERED:
            reason = "content_filter"
        elif self.finish == "MALFORMED_FUNCTION_CALL":
            reason = "error"
        tool_calls = tuple(self.calls)
        return Generation(
            "".join(self.texts),
            tool_calls,
            usage,
            options.model,
            PROVIDER,
            finish_for(tool_calls, reason),
            raw_id=self.ident,
            extras={"provider_model": self.model},
            provider_state=tuple(self.state),
        )


def _grounding_sources(response: gt.GenerateContentResponse) -> list[WebSource]:
    """The web pages of the answer's grounding metadata, each with the words of the answer it
    supports (Google's addresses are its own redirect links to the page; the egress relay follows them)."""
    sources: list[WebSource] = []
    for candidate in response.candidates or ():
        meta = candidate.grounding_metadata
        if meta is None:
            continue
        chunks = meta.grounding_chunks or []
        words: dict[int, str] = {}
        for support in meta.grounding_supports or ():
            text = support.segment.text if support.segment and support.segment.text else ""
            for index in support.grounding_chunk_indices or ():
                words.setdefault(index, text)
        for index, chunk in enumerate(chunks):
            if chunk.web is not None and chunk.web.uri:
                sources.append(WebSource(chunk.web.title or chunk.web.uri, chunk.web.uri, words.get(index, "")))
    return sources


class GoogleAdapter(ModelAdapter):
    provider = PROVIDER
    supports_background = True
    supports_hosted_search = True

    def __init__(self, *, api_key: str, base_url: str | None = None, timeout: float = 120.0) -> None:
        http = gt.HttpOptions(
            base_url=base_url,
            api_version="v1beta",
            timeout=int(timeout * 1000),
            retry_options=gt.HttpRetryOptions(attempts=1),  # the router fails over; no SDK retries
        )
        self._client = genai.Client(api_key=api_key, http_options=http)

    async def _generate(self, prompt: Prompt, options: CallOptions) -> Generation:
        response = await self._client.aio.models.generate_content(
            model=options.model, contents=_contents(prompt.messages), config=_config(prompt, options)
        )
        collector = _Collector()
        collector.add(response)
        return collector.generation(options)

    async def _stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]:
        stream = await self._client.aio.models.generate_content_stream(
            model=options.model, contents=_contents(prompt.messages), config=_config(prompt, options)
        )
        collector = _Collector()
        try:
            async for chunk in stream:
                for text in collector.add(chunk):
                    yield TextDelta(text)
        finally:
            await stream.aclose()
        if collector.finish is None:
            raise ModelTransientError("the google stream ended without a finish reason", provider=PROVIDER)
        yield collector.generation(options)

    async def _hosted_search(self, query: str, options: CallOptions, count: int) -> list[WebSource]:
        config = gt.GenerateContentConfig(
            tools=[gt.Tool(google_search=gt.GoogleSearch())], max_output_tokens=HOSTED_SEARCH_TOKENS
        )
        response = await self._client.aio.models.generate_content(
            model=options.model, contents=HOSTED_SEARCH_ASK.format(query=query), config=config
        )
        return _grounding_sources(response)

    async def _list_models(self) -> list[str]:
        pager = await self._client.aio.models.list(config={"page_size": 20})  # the first page is proof enough
        return [str(model.name) for model in pager.page]

    def _convert(self, exc: Exception) -> ModelError | None:
        if isinstance(exc, genai_errors.APIError):
            status = exc.code if isinstance(exc.code, int) and exc.code >= 100 else None
            return error_for_status(status, f"google answered HTTP {status}", PROVIDER)
        return None

    async def aclose(self) -> None:
        await self._client.aio.aclose()
