"""The model router: tiers, mixes, failover and the background service tier.

**Which adapter runs a model** is decided by its name (:func:`provider_for`):

* an explicit prefix wins: ``openai:``, ``anthropic:``, ``google:``, ``compat:`` (the prefix is
  removed before the name goes to the provider);
* ``gpt-``, ``chatgpt-``, ``codex-`` and the o-series (``o1``, ``o3-mini``, ``o4-mini``...) go to
  OpenAI (Responses API); ``claude-`` to Anthropic; ``gemini-`` and ``gemma-`` to Google;
* any other name goes to the OpenAI-compatible endpoint (``models.compatible_base_url``), so
  ``llama3.2`` or ``qwen3:8b`` work as Ollama names them;
* ``plugin:PROTOCOL:model`` goes to the model protocol adapter a plugin registered under
  ``PROTOCOL`` (:func:`plugin_adapters`). A plugin can add protocols, never replace the built-in
  ones: its adapters live under ``plugin:`` names, and a protocol named like a built-in is refused.

**A tier** is one model with a reasoning effort, or a weighted mix. Inside a mix the choice is
rendezvous (highest-random-weight) hashing of (conversation key, UTC date, model): one conversation
stays on one model for the day, and adding a model or changing one weight moves only the
conversations that must move. Tiers nobody configured get defaults on whichever provider has a key.

**Failover** is strict: only a ``ModelTransientError``, one hop, to the tier's alternate, and only
before the first streamed text. A second failure surfaces. Each failover counts
``pepper_model_calls{outcome="failed_over"}`` under the provider that failed, and the answer's
``Generation.extras["failed_attempt"]`` names the failed call (model, provider, status) with the
usage its provider reported for it, if any (``ModelError.usage``): it is charged that and no more.

**Background** calls ask for the provider's low-priority tier (OpenAI and Google ``flex``) and,
when that fails transiently (busy), run again at once on the standard tier of the same model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import re
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from core.metrics import metrics
from core.models.adapters.base import CallOptions, ModelAdapter
from core.models.config import ModelChoiceConfig, ModelsConfig
from core.models.errors import ModelError, ModelNotConfigured, ModelTransientError, StreamInterrupted
from core.models.types import Generation, Prompt, StreamEvent, TextDelta, WebSource

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

OPENAI, ANTHROPIC, GOOGLE, COMPATIBLE = "openai", "anthropic", "google", "openai-compatible"
PROVIDER_ORDER = (OPENAI, ANTHROPIC, GOOGLE, COMPATIBLE)
# The hosted search is the research helper's, not a conversation's: one key, so one model a day.
HOSTED_SEARCH_KEY = "web-research"
_PREFIXES = {"openai:": OPENAI, "anthropic:": ANTHROPIC, "google:": GOOGLE, "compat:": COMPATIBLE}
_OPENAI_NAME = re.compile(r"^(gpt-|chatgpt-|codex-|o\d)")
KEY_NAMES = {
    OPENAI: "OPENAI_API_KEY",
    ANTHROPIC: "ANTHROPIC_API_KEY",
    GOOGLE: "GEMINI_API_KEY",
    COMPATIBLE: "models.compatible_base_url",
}

# Defaults per provider when no tier is configured: (model, effort). Names age; configure them.
DEFAULT_TIER_MODELS: dict[str, dict[str, tuple[str, str | None]]] = {
    OPENAI: {"small": ("gpt-5-mini", "low"), "medium": ("gpt-5-mini", "medium"), "large": ("gpt-5", "medium")},
    ANTHROPIC: {
        "small": ("claude-haiku-4-5", None),
        "medium": ("claude-sonnet-4-5", None),
        "large": ("claude-opus-4-1", None),
    },
    GOOGLE: {
        "small": ("gemini-2.5-flash", None),
        "medium": ("gemini-2.5-flash", None),
        "large": ("gemini-2.5-pro", None),
    },
}
NOT_CONFIGURED = (
    "No AI model is set up yet, so I can't answer that. The owner can add a key "
    "(OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY) or an OpenAI-compatible endpoint; "
    "`pepper doctor` shows what is missing."
)


PLUGIN_PREFIX = "plugin:"
RESERVED_PROTOCOLS = frozenset({OPENAI, ANTHROPIC, GOOGLE, COMPATIBLE, "compat", "openai-responses",
                                "anthropic-messages"})  # fmt: skip


def provider_for(model: str) -> tuple[str, str]:
    """``(provider, the provider's model name)`` for a configured model name."""
    if model.startswith(PLUGIN_PREFIX):
        protocol, _, name = model[len(PLUGIN_PREFIX) :].partition(":")
        return PLUGIN_PREFIX + protocol, name
    for prefix, provider in _PREFIXES.items():
        if model.startswith(prefix):
            return provider, model[len(prefix) :]
    if _OPENAI_NAME.match(model):
        return OPENAI, model
    if model.startswith("claude-"):
        return ANTHROPIC, model
    if model.startswith(("gemini-", "gemma-")):
        return GOOGLE, model
    return COMPATIBLE, model


_R = TypeVar("_R")
_P = ParamSpec("_P")


def _tally(tier: str, outcome: Generation | ModelError) -> None:
    """One call of ``tier`` into ``pepper_model_tier_calls``: a generation (and the attempt it failed
    over from), or the error it ended with."""
    counted = metrics().model_tier_calls
    if isinstance(outcome, ModelError):
        counted.labels(tier, outcome.provider or "unknown", outcome.code).inc()
        return
    counted.labels(tier, provider_for(outcome.model)[0], "ok").inc()
    if outcome.failed_over_from:
        counted.labels(tier, provider_for(outcome.failed_over_from)[0], "failed_over").inc()


def _tallied_generate(
    method: Callable[Concatenate[_R, _P], Coroutine[Any, Any, Generation]],
) -> Callable[Concatenate[_R, _P], Coroutine[Any, Any, Generation]]:
    @functools.wraps(method)
    async def generate(self: _R, *args: _P.args, **kw: _P.kwargs) -> Generation:
        tier = str(kw.get("tier", "small"))
        try:
            generation = await method(self, *args, **kw)
        except ModelError as exc:
            _tally(tier, exc)
            raise
        _tally(tier, generation)
        return generation

    return generate


def _tallied_stream(
    method: Callable[Concatenate[_R, _P], AsyncGenerator[StreamEvent, None]],
) -> Callable[Concatenate[_R, _P], AsyncGenerator[StreamEvent, None]]:
    @functools.wraps(method)
    async def stream(self: _R, *args: _P.args, **kw: _P.kwargs) -> AsyncGenerator[StreamEvent, None]:
        tier = str(kw.get("tier", "small"))
        try:
            async with contextlib.aclosing(method(self, *args, **kw)) as events:
                async for event in events:
                    if not isinstance(event, TextDelta):
                        _tally(tier, event)
                    yield event
        except ModelError as exc:
            _tally(tier, exc)
            raise

    return stream


@dataclass(frozen=True)
class ModelChoice:
    """A model with its reasoning settings and its weight in a mix."""

    model: str
    effort: str | None = None
    thinking_budget: int | None = None
    weight: float = 1.0

    @property
    def ident(self) -> str:
        """What the hash keys on: the same model at another effort is another choice."""
        return f"{self.model}|{self.effort or ''}|{self.thinking_budget or ''}"

    @property
    def provider(self) -> str:
        return provider_for(self.model)[0]

    def describe(self) -> str:
        extra = [f"effort {self.effort}"] if self.effort else []
        extra += [f"thinking {self.thinking_budget} tokens"] if self.thinking_budget else []
        return self.model + (f" ({', '.join(extra)})" if extra else "")

    @classmethod
    def from_config(cls, c: ModelChoiceConfig) -> ModelChoice:
        return cls(c.model, c.effort, c.thinking_budget, c.weight)


@dataclass(frozen=True)
class Tier:
    name: str
    mix: tuple[ModelChoice, ...]
    alternate: ModelChoice | None = None

    def __post_init__(self) -> None:
        if not self.mix:
            raise ValueError(f"tier {self.name!r} has no model")


def rendezvous_score(choice: ModelChoice, conversation_key: str, day: date) -> float:
    """Weighted highest-random-weight score: P(choice wins) = weight / total weight."""
    digest = hashlib.blake2b(f"{conversation_key}\x1f{day.isoformat()}\x1f{choice.ident}".encode(), digest_size=8)
    unit = (int.from_bytes(digest.digest(), "big") + 0.5) / 2**64  # in (0, 1)
    return -choice.weight / math.log(unit)


def pick(mix: tuple[ModelChoice, ...], conversation_key: str, day: date) -> ModelChoice:
    if len(mix) == 1:
        return mix[0]
    return max(mix, key=lambda c: rendezvous_score(c, conversation_key, day))


def configured_providers(settings: Settings) -> list[str]:
    have = {
        OPENAI: _secret(settings.openai_api_key),
        ANTHROPIC: _secret(settings.anthropic_api_key),
        GOOGLE: _secret(settings.gemini_api_key),
        COMPATIBLE: bool(settings.models.compatible_base_url),
    }
    return [p for p in PROVIDER_ORDER if have[p]]


def _secret(value: object) -> bool:
    getter = getattr(value, "get_secret_value", None)
    return bool(getter()) if getter else bool(value)


def _default_choice(provider: str, tier: str, config: ModelsConfig) -> ModelChoice | None:
    if provider == COMPATIBLE:
        return ModelChoice(f"compat:{config.compatible_model}") if config.compatible_model else None
    table = DEFAULT_TIER_MODELS[provider]
    model, effort = table.get(tier, table["small"])
    return ModelChoice(model, effort)


HOSTED_SEARCH_PROVIDERS = frozenset({OPENAI, ANTHROPIC, GOOGLE})


def hosted_search_model(settings: Settings, tier: str) -> tuple[str | None, str | None]:
    """The model ``tier`` picks today for the hosted search, and the provider that searches for it
    (None when that model's provider has no hosted search or no key). Builds no SDK client."""
    found = tiers_from_settings(settings).get(tier)
    if found is None:
        return None, None
    model = pick(found.mix, HOSTED_SEARCH_KEY, datetime.now(UTC).date()).model
    provider = provider_for(model)[0]
    if provider not in HOSTED_SEARCH_PROVIDERS or provider not in configured_providers(settings):
        return model, None
    return model, provider


def tiers_from_settings(settings: Settings) -> dict[str, Tier]:
    """The tiers in force: configured ones as written, ``small``/``medium``/``large`` defaulted.

    A default tier runs on the first provider with a key (OpenAI, Anthropic, Google, then the
    compatible endpoint) and fails over to the same tier on the next one. Builds no SDK client.
    """
    config = settings.models
    providers = configured_providers(settings)
    tiers: dict[str, Tier] = {}
    for name, tc in config.tiers.items():
        alternate = ModelChoice.from_config(tc.alternate) if tc.alternate else None
        tiers[name] = Tier(name, tuple(ModelChoice.from_config(c) for c in tc.choices()), alternate)
    for name in ("small", "medium", "large"):
        if name in tiers:
            continue
        choices = [c for c in (_default_choice(p, name, config) for p in providers) if c is not None]
        if choices:
            tiers[name] = Tier(name, (choices[0],), choices[1] if len(choices) > 1 else None)
    return tiers


class ModelRouter:
    """The ``ModelService`` every caller uses. See the module docstring for the rules."""

    def __init__(
        self,
        adapters: Mapping[str, ModelAdapter],
        tiers: Mapping[str, Tier],
        *,
        today: Callable[[], date] | None = None,
    ) -> None:
        self.adapters = dict(adapters)
        self.tiers = dict(tiers)
        self._today = today or (lambda: datetime.now(UTC).date())

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelRouter:
        """Adapters for every provider with a key (or the compatible base URL), and the tiers."""
        timeout = settings.models.timeout
        adapters: dict[str, ModelAdapter] = {}
        for provider in configured_providers(settings):
            if provider == OPENAI:
                from core.models.adapters.openai_responses import OpenAIResponsesAdapter

                key = settings.openai_api_key.get_secret_value()  # type: ignore[union-attr]
                adapters[OPENAI] = OpenAIResponsesAdapter(
                    api_key=key, base_url=settings.openai_base_url, timeout=timeout
                )
            elif provider == ANTHROPIC:
                from core.models.adapters.anthropic import AnthropicAdapter

                key = settings.anthropic_api_key.get_secret_value()  # type: ignore[union-attr]
                adapters[ANTHROPIC] = AnthropicAdapter(
                    api_key=key, base_url=settings.anthropic_base_url, timeout=timeout
                )
            elif provider == GOOGLE:
                from core.models.adapters.google import GoogleAdapter

                key = settings.gemini_api_key.get_secret_value()  # type: ignore[union-attr]
                adapters[GOOGLE] = GoogleAdapter(api_key=key, base_url=settings.gemini_base_url, timeout=timeout)
            else:
                from core.models.adapters.openai_compatible import OpenAICompatibleAdapter

                secret = settings.models.compatible_api_key
                adapters[COMPATIBLE] = OpenAICompatibleAdapter(
                    base_url=settings.models.compatible_base_url or "",
                    api_key=secret.get_secret_value() if secret else None,
                    timeout=timeout,
                )
        adapters.update(plugin_adapters(settings))
        return cls(adapters, tiers_from_settings(settings))

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()

    # Routing.
    def choose(self, tier: str, conversation_key: str, *, day: date | None = None) -> ModelChoice:
        """The model this conversation uses in ``tier`` on ``day`` (UTC today by default)."""
        return pick(self._tier(tier).mix, conversation_key, day or self._today())

    def _tier(self, name: str) -> Tier:
        if not self.adapters:
            raise ModelNotConfigured(NOT_CONFIGURED)
        found = self.tiers.get(name)
        if found is None:
            raise ModelNotConfigured(f"no model tier named {name!r} is configured")
        return found

    def _resolve(self, choice: ModelChoice, background: bool) -> tuple[ModelAdapter, CallOptions]:
        provider, model = provider_for(choice.model)
        adapter = self.adapters.get(provider)
        if adapter is None:
            need = KEY_NAMES.get(provider) or f"the plugin protocol {provider.removeprefix(PLUGIN_PREFIX)}"
            raise ModelNotConfigured(f"the model {choice.model} needs {need}, which is not set", provider=provider)
        return adapter, CallOptions(model, choice.effort, choice.thinking_budget, background)

    def _can_fail_over(self, tier: Tier, choice: ModelChoice, error: ModelError) -> ModelChoice | None:
        alt = tier.alternate
        if alt is None or alt.ident == choice.ident or provider_for(alt.model)[0] not in self.adapters:
            return None
        log.warning("model call failing over: from=%s to=%s status=%s", choice.model, alt.model, error.status)
        metrics().model_calls.labels(provider_for(choice.model)[0], "failed_over").inc()
        return alt

    @staticmethod
    def _stamp(
        gen: Generation, choice: ModelChoice, failed_over_from: ModelChoice | None, error: ModelError | None = None
    ) -> Generation:
        extras = dict(gen.extras)
        if choice.effort:
            extras["effort"] = choice.effort
        if failed_over_from is not None and error is not None:
            extras["failed_attempt"] = failed_attempt(failed_over_from.model, error)
        return replace(
            gen,
            model=choice.model,
            failed_over_from=failed_over_from.model if failed_over_from else None,
            extras=extras,
        )

    # Calls.
    @_tallied_generate
    async def generate(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> Generation:
        spec = self._tier(tier)
        choice = pick(spec.mix, conversation_key, self._today())
        try:
            return self._stamp(await self._generate_one(choice, prompt, background), choice, None)
        except ModelTransientError as exc:
            exc.model = choice.model
            alt = self._can_fail_over(spec, choice, exc)
            if alt is None:
                raise
            failed = exc
        return self._stamp(await self._generate_one(alt, prompt, background), alt, choice, failed)

    async def _generate_one(self, choice: ModelChoice, prompt: Prompt, background: bool) -> Generation:
        adapter, options = self._resolve(choice, background)
        if background and adapter.supports_background:
            try:
                return await adapter.generate(prompt, options)
            except ModelTransientError as exc:
                log.info("background service tier busy, using standard: model=%s status=%s", choice.model, exc.status)
            gen = await adapter.generate(prompt, replace(options, background=False))
            return replace(gen, extras={**gen.extras, "background_fell_back": True})
        return await adapter.generate(prompt, replace(options, background=False))

    @_tallied_stream
    async def stream(
        self, prompt: Prompt, *, conversation_key: str, tier: str = "small", background: bool = False
    ) -> AsyncGenerator[StreamEvent, None]:
        """TextDelta items, then one Generation. Fails over only before the first TextDelta."""
        spec = self._tier(tier)
        choice = pick(spec.mix, conversation_key, self._today())
        started = False
        # Every inner stream is closed by ``aclosing`` the moment this one is: a consumer that stops
        # early (a barge-in cancels the cascade's reply) must not leave the provider's HTTP stream
        # open until the garbage collector finds it, possibly after the event loop has closed.
        try:
            async with contextlib.aclosing(self._stream_one(choice, prompt, background)) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        started = True
                        yield event
                    else:
                        yield self._stamp(event, choice, None)
            return
        except StreamInterrupted as exc:
            exc.model = choice.model
            raise
        except ModelTransientError as exc:
            exc.model = choice.model
            alt = None if started else self._can_fail_over(spec, choice, exc)
            if alt is None:
                raise
            failed = exc
        try:
            async with contextlib.aclosing(self._stream_one(alt, prompt, background)) as events:
                async for event in events:
                    yield event if isinstance(event, TextDelta) else self._stamp(event, alt, choice, failed)
        except ModelError as exc:
            exc.model = alt.model
            raise

    async def _stream_one(
        self, choice: ModelChoice, prompt: Prompt, background: bool
    ) -> AsyncGenerator[StreamEvent, None]:
        adapter, options = self._resolve(choice, background)
        if background and adapter.supports_background:
            try:
                async with contextlib.aclosing(adapter.stream(prompt, options)) as events:
                    async for event in events:
                        yield event
                return
            except ModelTransientError as exc:
                # Raised only before the first delta (after it the adapter raises StreamInterrupted).
                log.info("background service tier busy, using standard: model=%s status=%s", choice.model, exc.status)
            async with contextlib.aclosing(adapter.stream(prompt, replace(options, background=False))) as events:
                async for event in events:
                    yield (
                        event
                        if isinstance(event, TextDelta)
                        else replace(event, extras={**event.extras, "background_fell_back": True})
                    )
            return
        async with contextlib.aclosing(adapter.stream(prompt, replace(options, background=False))) as events:
            async for event in events:
                yield event

    # The providers' own web search (the research helper's ``hosted`` search occupant).
    def offers_hosted_search(self, tier: str, conversation_key: str = HOSTED_SEARCH_KEY) -> bool:
        """Whether the model this tier picks today can search the web itself."""
        try:
            adapter, _ = self._resolve(self.choose(tier, conversation_key), False)
        except ModelNotConfigured:
            return False
        return adapter.supports_hosted_search

    async def hosted_search(
        self, query: str, *, tier: str, count: int, conversation_key: str = HOSTED_SEARCH_KEY
    ) -> list[WebSource]:
        """The pages the tier's model finds with its provider's search tool. No failover: another
        provider's search is another occupant, which the person chose or not."""
        choice = self.choose(tier, conversation_key)
        adapter, options = self._resolve(choice, False)
        if not adapter.supports_hosted_search:
            raise ModelNotConfigured(f"{choice.model} has no hosted web search", provider=adapter.provider)
        return await adapter.hosted_search(query, options, count)

    def describe(self) -> list[tuple[str, str]]:
        """``(tier, one line)`` for each tier: its mix with shares, and its alternate."""
        return describe_tiers(self.tiers)


def failed_attempt(model: str, error: ModelError) -> dict[str, Any]:
    """A failed call as a turn record keeps it: the model, its provider, the error, and the tokens
    the provider reported for it (``usage``: input, output, cached, reasoning), when it did."""
    entry: dict[str, Any] = {"model": model, "provider": provider_for(model)[0], "error": error.code}
    if error.status is not None:
        entry["status"] = error.status
    if error.usage is not None:
        u = error.usage
        entry["usage"] = [u.input_tokens, u.output_tokens, u.cached_input_tokens, u.reasoning_tokens]
    return entry


def plugin_adapters(settings: Settings) -> dict[str, ModelAdapter]:
    """The adapters of installed ``model_protocol`` plugins, under ``plugin:PROTOCOL``.

    A plugin exports ``protocols`` (names) and ``adapter(settings)`` (a ``ModelAdapter``). A
    protocol named like a built-in one, or already taken by another plugin, is refused (logged);
    a plugin whose adapter cannot be built is left out (logged), the others still load.
    """
    from core.slots.plugins import discover, of_kind

    adapters: dict[str, ModelAdapter] = {}
    for plugin in of_kind(discover(), "model_protocol"):
        protocols = [p for p in getattr(plugin.obj, "protocols", ()) if isinstance(p, str) and p]
        for protocol in protocols:
            if protocol in RESERVED_PROTOCOLS or PLUGIN_PREFIX + protocol in adapters:
                log.warning("plugin protocol refused: plugin=%s protocol=%s", plugin.name, protocol)
                continue
            try:
                adapters[PLUGIN_PREFIX + protocol] = plugin.obj.adapter(settings)
            except Exception:
                log.exception("plugin protocol adapter failed to build: plugin=%s", plugin.name)
    return adapters


def describe_tiers(tiers: Mapping[str, Tier]) -> list[tuple[str, str]]:
    out = []
    for name, tier in tiers.items():
        total = sum(c.weight for c in tier.mix)
        if len(tier.mix) == 1:
            text = tier.mix[0].describe()
        else:
            text = ", ".join(f"{c.describe()} {100 * c.weight / total:.0f}%" for c in tier.mix)
        if tier.alternate:
            text += f"; fails over to {tier.alternate.describe()}"
        out.append((name, text))
    return out
