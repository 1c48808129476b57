"""What every provider adapter shares: call options, error conversion and the stream rules.

An adapter fills three hooks: ``_generate`` (one non-streaming call), ``_stream`` (TextDelta items,
then one Generation) and ``_convert`` (an SDK exception to a ``ModelError``, or ``None`` when it is
not the SDK's). This base class owns the rules: SDK errors become the model error tree at the
boundary, and once a ``TextDelta`` has been yielded any failure surfaces as ``StreamInterrupted``
(never failed over: the person saw part of the reply). ``asyncio.CancelledError`` passes untouched.

This module imports no vendor SDK; each adapter module imports its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import httpx

from core.metrics import metrics
from core.models.errors import (
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelTransientError,
    StreamInterrupted,
)
from core.models.types import FinishReason, Generation, Prompt, StreamEvent, TextDelta, Usage, WebSource
from core.tracing import traced, traced_stream

try:  # The OpenAI and Anthropic SDKs ship on httpx2, a fork under its own import name.
    import httpx2

    _HTTPX2_TRANSPORT: tuple[type[BaseException], ...] = (httpx2.TransportError,)
except ImportError:  # pragma: no cover
    _HTTPX2_TRANSPORT = ()

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    aiohttp.ClientError,
    httpx.TransportError,
    *_HTTPX2_TRANSPORT,
)


@dataclass(frozen=True)
class CallOptions:
    """How to run one call, as the router decided it.

    ``model`` is the provider's own model name (any routing prefix removed). ``effort`` is a
    reasoning effort ("minimal", "low", "medium", "high"); ``thinking_budget`` a token budget for
    providers that take one (Anthropic, Google). ``background`` asks for the provider's
    low-priority service tier where it has one (``supports_background``).
    """

    model: str
    effort: str | None = None
    thinking_budget: int | None = None
    background: bool = False


def error_for_status(status: int | None, message: str, provider: str) -> ModelError:
    """The error class a provider HTTP status maps to."""
    if status in (401, 403):
        return ModelAuthError(message, provider=provider, status=status)
    if status is None or status in (408, 409, 425, 429) or status >= 500:
        return ModelTransientError(message, provider=provider, status=status)
    return ModelRequestError(message, provider=provider, status=status)


def parse_arguments(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """Tool-call arguments as a dict; text that is not a JSON object is kept under ``_raw``."""
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def system_text(prompt: Prompt) -> str:
    """The stable prefix and the dynamic part as one system text, for providers without blocks."""
    if prompt.system_dynamic:
        return f"{prompt.system_stable}\n\n{prompt.system_dynamic}" if prompt.system_stable else prompt.system_dynamic
    return prompt.system_stable


# What a hosted search is asked: the query alone (the research helper's own words, never the
# person's conversation), and to cite what it used, which is what comes back as the results.
HOSTED_SEARCH_ASK = "Search the web for: {query}\nAnswer in a few sentences, citing the pages you used."
HOSTED_SEARCH_TOKENS = 1024


def report_usage(exc: BaseException, usage: Usage) -> None:
    """Note on ``exc`` what the provider reported it used before the call failed (an adapter's
    ``_stream`` calls it for a stream cut after its start event); ``stream`` carries it onto the
    model error it raises (``ModelError.usage``)."""
    with contextlib.suppress(AttributeError, TypeError):
        exc.pepper_usage = usage  # type: ignore[attr-defined]


def finish_for(tool_calls: tuple[Any, ...], reason: FinishReason) -> FinishReason:
    return "tool_calls" if tool_calls and reason == "stop" else reason


def _model_span(arguments: Any) -> dict[str, Any]:
    return {"provider": arguments["self"].provider, "model": arguments["options"].model}


def _usage_span(event: Any) -> dict[str, Any]:
    if not isinstance(event, Generation):
        return {}
    return {
        "tokens.input": event.usage.input_tokens,
        "tokens.output": event.usage.output_tokens,
        "status": event.finish_reason,
    }


class ModelAdapter(ABC):
    """One provider behind the common interface. Subclasses fill the three hooks below."""

    provider: str = "unknown"
    supports_background: bool = False
    # The provider runs a web search itself when asked (OpenAI's web_search tool, Anthropic's web
    # search tool, Google Search grounding): see ``hosted_search``.
    supports_hosted_search: bool = False

    async def _converting(self, call: Awaitable[T]) -> T:
        """``call``'s result, its failure converted into the error tree (``ModelError`` as it is)."""
        try:
            return await call
        except ModelError:
            raise
        except Exception as exc:
            error = self._convert_any(exc)
            if error is None:
                raise
            raise error from exc

    @traced("pepper.model.generate", lambda a: _model_span(a), lambda g, _: _usage_span(g))
    async def generate(self, prompt: Prompt, options: CallOptions) -> Generation:
        try:
            generation = await self._converting(self._generate(prompt, options))
        except ModelError as exc:
            self._count(exc.code)
            raise
        self._count("ok", generation)
        return generation

    def _count(self, outcome: str, generation: Generation | None = None) -> None:
        counted = metrics()
        counted.model_calls.labels(self.provider, outcome).inc()
        if generation is not None:
            usage = generation.usage
            tokens = counted.model_tokens
            tokens.labels(self.provider, "input").inc(usage.input_tokens)
            tokens.labels(self.provider, "output").inc(usage.output_tokens)
            tokens.labels(self.provider, "cached").inc(usage.cached_input_tokens)

    @traced_stream("pepper.model.stream", lambda a: _model_span(a), lambda e, _: _usage_span(e))
    async def stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]:
        """TextDelta items, then exactly one Generation. A failure after the first delta raises
        ``StreamInterrupted``; before it, the converted error (which the router may fail over)."""
        started = False
        try:
            async with contextlib.aclosing(self._stream(prompt, options)) as events:  # closed with this one
                async for event in events:
                    if isinstance(event, TextDelta):
                        started = True
                    else:
                        self._count("ok", event)
                    yield event
        except StreamInterrupted as exc:
            self._count(exc.code)
            raise
        except Exception as exc:
            error = exc if isinstance(exc, ModelError) else self._convert_any(exc)
            if error is None:
                raise
            self._count(StreamInterrupted.code if started else error.code)
            reported = getattr(exc, "pepper_usage", None)
            if started:
                log.warning(
                    "model stream interrupted after it began: provider=%s status=%s", self.provider, error.status
                )
                interrupted = StreamInterrupted(
                    f"the {self.provider} reply stopped part way: {error}", provider=self.provider, status=error.status
                )
                interrupted.usage = reported
                raise interrupted from exc
            if reported is not None:
                error.usage = reported
            if error is exc:
                raise
            raise error from exc

    async def list_models(self) -> list[str]:
        """The model names this key may use: one cheap, read-only call (``pepper doctor --online``).
        Raises the converted ``ModelError`` (a wrong key is ``ModelAuthError``)."""
        return await self._converting(self._list_models())

    async def _list_models(self) -> list[str]:
        raise NotImplementedError(f"{self.provider} lists no models")

    async def hosted_search(self, query: str, options: CallOptions, count: int) -> list[WebSource]:
        """The pages the provider's own web search cites for ``query`` (at most ``count``, each
        address once), from one non-streaming call with the provider's search tool on."""
        by_url: dict[str, WebSource] = {}
        for source in await self._converting(self._hosted_search(query, options, count)):
            known = by_url.get(source.url)
            if known is None or (not known.snippet and source.snippet):
                by_url[source.url] = WebSource(known.title if known else source.title, source.url, source.snippet)
        return list(by_url.values())[:count]

    async def _hosted_search(self, query: str, options: CallOptions, count: int) -> list[WebSource]:
        raise NotImplementedError(f"{self.provider} has no hosted web search")

    def _convert_any(self, exc: Exception) -> ModelError | None:
        error = self._convert(exc)
        if error is None and isinstance(exc, TRANSPORT_ERRORS):
            error = ModelTransientError(
                f"{self.provider} connection failed: {type(exc).__name__}", provider=self.provider
            )
        if error is not None:
            log.info("model call failed: provider=%s kind=%s status=%s", self.provider, error.code, error.status)
        return error

    @abstractmethod
    async def _generate(self, prompt: Prompt, options: CallOptions) -> Generation: ...

    @abstractmethod
    def _stream(self, prompt: Prompt, options: CallOptions) -> AsyncGenerator[StreamEvent, None]: ...

    @abstractmethod
    def _convert(self, exc: Exception) -> ModelError | None: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the SDK client's connections."""
