"""OpenTelemetry traces: one trace per turn and per call, with spans for model calls, tool calls,
gate decisions and deliveries.

Off unless configured: with no ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) in the environment nothing is made and each traced function
costs one flag check. Configured, every process of the server (the web server, turn workers,
media processes inherit the environment) sends its spans with the SDK's batch processor and OTLP
over HTTP (protobuf) to that endpoint; ``OTEL_SERVICE_NAME`` names the service (default
``pepper``). The exporter's own standard variables (headers, timeout, compression) apply as the
SDK documents them.

Attributes are ids, kinds and outcomes only: :func:`attributes` keeps the keys in
:data:`ALLOWED` and drops anything else, so a person's words, numbers or addresses cannot reach a
trace by a careless call site. The wrappers below (:func:`traced`, :func:`traced_stream`) are
decorators so the traced code itself stays as it is.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from typing import Any, TypeVar, cast
from uuid import UUID

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SCOPE = "pepper"

# Every attribute key a span may carry: ids (UUIDs, provider ids such as a Twilio call SID), kinds
# and outcomes, counts. Nothing a person said or typed, no phone number, address or name.
ALLOWED = frozenset(
    {
        "pepper.account_id",
        "pepper.turn_id",
        "pepper.call_sid",
        "pepper.channel",
        "pepper.kind",
        "pepper.trust",
        "pepper.status",
        "pepper.rounds",
        "pepper.tool",
        "pepper.tool_status",
        "pepper.gate.allowed",
        "pepper.gate.policy",
        "pepper.provider",
        "pepper.model",
        "pepper.tokens.input",
        "pepper.tokens.output",
        "pepper.delivered",
        "pepper.writes",
        "pepper.route",
        "pepper.end_reason",
        "pepper.error",
    }
)

_lock = threading.Lock()
_state: dict[str, Any] = {"configured": False, "tracer": None}


def endpoint() -> str | None:
    for name in ENDPOINT_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def enabled() -> bool:
    return _tracer() is not None


def _tracer() -> Any:
    if _state["configured"]:
        return _state["tracer"]
    with _lock:
        if not _state["configured"]:
            _state["tracer"] = _make_tracer() if endpoint() else None
            _state["configured"] = True
    return _state["tracer"]


def _make_tracer() -> Any:
    # Imported here: a server without tracing never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME") or "pepper"
    # Our own provider, not the global one: a library that sets the global provider cannot take
    # Pepper's spans elsewhere, and tests can make a fresh one (``reset``).
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    exporter = OTLPSpanExporter()  # reads the endpoint and the exporter's other variables itself
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _state["provider"] = provider
    log.info("traces go to %s as service %s", endpoint(), service)
    return provider.get_tracer(SCOPE)


def flush(timeout_ms: int = 5000) -> bool:
    """Send the spans still batched (a test, a process about to exit)."""
    provider = _state.get("provider")
    return bool(provider.force_flush(timeout_ms)) if provider is not None else True


def reset() -> None:
    """Forget the configuration, shutting its provider down: the next span reads the environment
    again (tests that point the exporter at a collector of their own)."""
    with _lock:
        provider = _state.pop("provider", None)
        _state.update(configured=False, tracer=None)
    if provider is not None:
        provider.shutdown()


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """The allowed attributes of ``values``, as OpenTelemetry types (a UUID as its text)."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key not in ALLOWED:
            log.debug("trace attribute %s dropped: not an allowed key", key)
            continue
        if isinstance(value, UUID):
            value = str(value)
        if isinstance(value, bool | int | float | str):
            kept[key] = value
    return kept


class _Span:
    """What a traced function may add to its span (a no-op when tracing is off)."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, **values: Any) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes({f"pepper.{key}": value for key, value in values.items()}))

    def failed(self, exc: BaseException) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            self._span.set_attributes({"pepper.error": type(exc).__name__})


@contextlib.contextmanager
def span(name: str, **values: Any) -> Iterator[_Span]:
    """A span named ``name`` (a child of the current one), with ``pepper.<key>`` attributes."""
    tracer = _tracer()
    if tracer is None:
        yield _Span(None)
        return
    with tracer.start_as_current_span(
        name, attributes=attributes({f"pepper.{k}": v for k, v in values.items()}), record_exception=False
    ) as current:
        handle = _Span(current)
        try:
            yield handle
        except BaseException as exc:
            handle.failed(exc)
            raise


F = TypeVar("F", bound=Callable[..., Any])
Describe = Callable[[Mapping[str, Any]], Mapping[str, Any]]
Outcome = Callable[[Any, Mapping[str, Any]], Mapping[str, Any]]

# The span of each recent turn this process ran, by turn id: a delivery reported later (after the
# reply was sent) joins its turn's trace. Bounded; a delivery reported by another process, or long
# after, starts a trace of its own that names the turn.
_TURN_SPANS: OrderedDict[str, Any] = OrderedDict()
TURN_SPANS_KEPT = 2048


def remember_turn(turn_id: UUID | str | None) -> None:
    """Note the current span as turn ``turn_id``'s (called inside the turn's span)."""
    if turn_id is None or _tracer() is None:
        return
    from opentelemetry import trace

    with _lock:
        _TURN_SPANS[str(turn_id)] = trace.get_current_span().get_span_context()
        while len(_TURN_SPANS) > TURN_SPANS_KEPT:
            _TURN_SPANS.popitem(last=False)


@contextlib.contextmanager
def within_turn(turn_id: UUID | str | None) -> Iterator[None]:
    """Make turn ``turn_id``'s span (if this process ran it lately) the parent of spans inside."""
    context = _TURN_SPANS.get(str(turn_id)) if turn_id is not None and _tracer() is not None else None
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(context)))
    try:
        yield
    finally:
        otel_context.detach(token)


def traced(
    name: str,
    describe: Describe | None = None,
    outcome: Outcome | None = None,
    *,
    turn: str | None = None,
) -> Callable[[F], F]:
    """Trace an ``async def``: ``describe(arguments)`` gives the span's attributes from the bound
    arguments (by parameter name), ``outcome(result, arguments)`` the ones its result adds.
    ``turn``: the parameter holding a turn id whose trace the span joins (a delivery)."""

    def wrap(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _tracer() is None:
                return await function(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            with within_turn(bound.get(turn) if turn else None):
                with span(name, **(describe(bound) if describe else {})) as current:
                    result = await function(*args, **kwargs)
                    if outcome is not None:
                        current.set(**outcome(result, bound))
                    return result

        return cast(F, wrapper)

    return wrap


def traced_stream(name: str, describe: Describe | None = None, outcome: Outcome | None = None) -> Callable[[F], F]:
    """Trace an async generator: the span lasts from the first item asked to the last, and
    ``outcome`` is given each item (the attributes of the last one that says anything stay).

    The span is not made the current one: a generator's body runs in whichever context asks for
    its next item, so a current span set inside it would leak into the caller between items.
    Nothing is traced inside a model stream, so it needs no children."""

    def wrap(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            tracer = _tracer()
            if tracer is None:
                async with contextlib.aclosing(function(*args, **kwargs)) as plain:
                    async for item in plain:
                        yield item
                return
            bound = signature.bind_partial(*args, **kwargs).arguments
            started = tracer.start_span(
                name,
                attributes=attributes({f"pepper.{k}": v for k, v in (describe(bound) if describe else {}).items()}),
            )
            handle = _Span(started)
            try:
                async with contextlib.aclosing(function(*args, **kwargs)) as items:
                    async for item in items:
                        if outcome is not None:
                            handle.set(**outcome(item, bound))
                        yield item
            except GeneratorExit:
                raise
            except BaseException as exc:
                handle.failed(exc)
                raise
            finally:
                started.end()

        return cast(F, wrapper)

    return wrap
