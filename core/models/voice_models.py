"""The realtime voice models Pepper names, in one table: the defaults of the settings, the names
the docs give, and what ``pepper doctor --online`` looks for in each provider's model list.

``current`` lists the ids the provider offered when this table was last checked (December 2026,
``shared/reference``), newest last; the default is the one Pepper has been tested against.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VoiceModel:
    engine: str  # the voice engine (core.settings.VoiceEngine) that runs it
    provider: str  # the text model router's provider whose key and model list it shares
    setting: str  # the Settings field that names it
    env: str  # ... and its environment variable
    default: str
    current: tuple[str, ...]


VOICE_MODELS: tuple[VoiceModel, ...] = (
    VoiceModel("openai-realtime", "openai", "voice_model", "PEPPER_VOICE_MODEL", "gpt-realtime",
               ("gpt-realtime", "gpt-realtime-mini", "gpt-realtime-1.5", "gpt-realtime-2", "gpt-realtime-2.1")),
    VoiceModel("gemini-live", "google", "gemini_live_model", "PEPPER_GEMINI_LIVE_MODEL",
               "gemini-live-2.5-flash-preview", ("gemini-live-2.5-flash-preview",)),
    VoiceModel("gpt-live", "openai", "gpt_live_model", "PEPPER_GPT_LIVE_MODEL", "gpt-live-1",
               ("gpt-live-1", "gpt-live-1.1")),
)  # fmt: skip


def voice_model(engine: str) -> VoiceModel:
    return next(m for m in VOICE_MODELS if m.engine == engine)


def default_voice_model(engine: str) -> str:
    return voice_model(engine).default
