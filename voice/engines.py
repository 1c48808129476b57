"""The realtime engines a call can run on, by name, chosen per line (``phone_lines.voice_engine``)
or by the ``voice_engine`` setting.

Each engine is built the first time a call needs it (its SDK is imported then, inside
``voice/adapters/``) and shared by every later call on it. An engine without its key is ``None``:
its calls apologise and hang up, as before. An engine that is not part of this build (the cascade
module missing) raises :class:`EngineUnavailable`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from core.settings import VOICE_ENGINES
from voice.realtime import RealtimeError, RealtimeModel

log = logging.getLogger(__name__)

CASCADE_MODULE = "voice.adapters.cascade"


class EngineUnavailable(RealtimeError):
    code = "voice-engine-unavailable"


TEXT_MODEL_KEYS = "OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY or an OpenAI-compatible base URL"


def engine_unready(settings: Any, name: str, models: Any) -> str | None:
    """Why calls on this engine would apologise and hang up (a key it lacks), or None when it can
    answer. The server decides with this when it builds an engine, and ``pepper doctor`` says it.
    ``models`` is the text model service (``ModelRouter.from_settings``) the cascade answers with."""
    if name in ("openai-realtime", "gpt-live") and settings.openai_api_key is None:
        return "needs OPENAI_API_KEY"
    if name == "gemini-live" and settings.gemini_api_key is None:
        return "needs GEMINI_API_KEY"
    if name == "cascade" and (models is None or not getattr(models, "adapters", True)):
        return f"answers with a text model and none is configured (set {TEXT_MODEL_KEYS})"
    return None


def _openai(settings: Any, models: Any) -> RealtimeModel | None:
    return _openai_voice(settings, models, "openai-realtime")


def _gpt_live(settings: Any, models: Any) -> RealtimeModel | None:
    return _openai_voice(settings, models, "gpt-live")


def _openai_voice(settings: Any, models: Any, name: str) -> RealtimeModel | None:
    """OpenAI Realtime or GPT-Live: the same SDK client, its model and websocket base per engine."""
    if engine_unready(settings, name, models):
        return None
    from voice.adapters.openai_realtime import OpenAIRealtime

    model_class: type[OpenAIRealtime] = OpenAIRealtime
    model, url = settings.voice_model, settings.openai_realtime_url
    if name == "gpt-live":
        from voice.adapters.gpt_live import GptLive

        model_class, model, url = GptLive, settings.gpt_live_model, settings.gpt_live_url
    return model_class(
        api_key=settings.openai_api_key.get_secret_value(),
        model=model,
        base_url=settings.openai_base_url,
        websocket_base_url=url,
    )


def _gemini(settings: Any, models: Any) -> RealtimeModel | None:
    if engine_unready(settings, "gemini-live", models):
        return None
    from voice.adapters.gemini_live import GeminiLive

    return GeminiLive(
        api_key=settings.gemini_api_key.get_secret_value(),
        model=settings.gemini_live_model,
        voice=settings.gemini_live_voice,
        base_url=settings.gemini_base_url,
    )


def _cascade(settings: Any, models: Any) -> RealtimeModel | None:
    if not engine_available("cascade"):
        raise EngineUnavailable(f"the cascade voice engine is not part of this build ({CASCADE_MODULE} is missing)")
    # A router with no provider configured could not answer: no model, so calls apologise at once.
    if engine_unready(settings, "cascade", models):
        return None
    stt = None
    if settings.deepgram_api_key is not None and settings.voice_cascade_stt in ("auto", "deepgram"):
        from voice.adapters.deepgram_stt import DeepgramSTT

        stt = DeepgramSTT(settings.deepgram_api_key.get_secret_value(), base_url=settings.deepgram_api_url)
    tts = None
    if settings.voice_cascade_tts == "deepgram":
        if settings.deepgram_api_key is None:
            log.warning("PEPPER_VOICE_CASCADE_TTS=deepgram without DEEPGRAM_API_KEY: calls are spoken by piper")
        else:
            from voice.adapters.deepgram_tts import DeepgramTTS

            tts = DeepgramTTS(settings.deepgram_api_key.get_secret_value(), model=settings.voice_cascade_tts_voice,
                              base_url=settings.deepgram_api_url)  # fmt: skip
    module = importlib.import_module(CASCADE_MODULE)
    model: RealtimeModel = module.CascadeModel(models, tier=settings.voice_cascade_tier, stt=stt, tts=tts)
    return model


BUILDERS: dict[str, Callable[[Any, Any], RealtimeModel | None]] = {
    "openai-realtime": _openai,
    "gemini-live": _gemini,
    "gpt-live": _gpt_live,
    "cascade": _cascade,
}
assert set(BUILDERS) == set(VOICE_ENGINES)


def resolve_engine(settings: Any) -> str:
    """The default engine's name: ``auto`` is OpenAI Realtime with an OpenAI key, else the cascade."""
    if settings.voice_engine != "auto":
        return str(settings.voice_engine)
    return "openai-realtime" if settings.openai_api_key is not None else "cascade"


PLUGIN_PREFIX = "plugin:"


def plugin_engines() -> dict[str, Any]:
    """Realtime voice providers of installed plugins (kind ``voice_provider``), by engine name
    ``plugin:NAME``: each has ``engine(settings, models)`` returning a ``RealtimeModel``. They add
    engines; the built-in ones keep their names."""
    from core.slots.plugins import discover, of_kind

    return {PLUGIN_PREFIX + p.name: p.obj for p in of_kind(discover(), "voice_provider")}


def engine_available(name: str) -> bool:
    """Whether this build has the engine's code (not whether its key is set)."""
    if name.startswith(PLUGIN_PREFIX):
        return name in plugin_engines()
    return name in BUILDERS and (name != "cascade" or importlib.util.find_spec(CASCADE_MODULE) is not None)


class RealtimeEngines:
    """Realtime models by engine name, built on first use. ``models`` is the text model service
    (the cascade answers with it)."""

    def __init__(self, settings: Any, *, models: Any = None):
        self.settings = settings
        self.models = models
        self._built: dict[str, RealtimeModel | None] = {}

    def get(self, name: str) -> RealtimeModel | None:
        if name == "auto":
            name = resolve_engine(self.settings)
        if name not in self._built:
            builder = BUILDERS.get(name)
            if builder is None and name.startswith(PLUGIN_PREFIX) and name in plugin_engines():
                builder = plugin_engines()[name].engine
            if builder is None:
                raise EngineUnavailable(f"unknown voice engine {name!r}; one of {', '.join(BUILDERS)}")
            self._built[name] = builder(self.settings, self.models)
            if self._built[name] is None:
                log.warning("voice engine %s is not configured (no key); its calls will apologise", name)
        return self._built[name]

    async def aclose(self) -> None:
        for model in self._built.values():
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()
        self._built.clear()


def sip_line_problems(engine: str, settings: Any, kind: str = "personal") -> list[str]:
    """What keeps a line on SIP direct from taking calls (``pepper doctor`` says the same)."""
    problems = []
    if kind == "answering":
        problems.append("the answering service runs on Media Streams only: on SIP direct its calls are rejected (480)")
    if engine != "gpt-live":
        problems.append(f"SIP direct runs calls on gpt-live only, and this line's engine is {engine}"
                        " (pepper line engine NUMBER gpt-live)")  # fmt: skip
    missing = [name for name, value in (("OPENAI_API_KEY", settings.openai_api_key),
               ("OPENAI_WEBHOOK_SECRET", settings.openai_webhook_secret)) if value is None]  # fmt: skip
    if missing:
        problems.append(f"SIP direct needs {' and '.join(missing)}: until then its SIP calls are refused")
    return problems
