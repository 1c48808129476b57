"""The realtime voice models Pepper names, in one table: the defaults of the settings, the names
the docs give, and what ``pepper doctor --online`` looks for in each provider's model list.

``current`` lists the ids the provider offered when this table was last checked (December 2026:
OpenAI's model list and "GPT-Live" guide, Google's Gemini API model pages and the google-genai SDK),
oldest first; the default is the current model Pepper is tested against. The older ids stay
listed so a setting that still names one passes ``pepper doctor --online`` while it is offered.
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
    # Realtime now sits under OpenAI's "Legacy APIs" beside GPT-Live; gpt-realtime-2 is its current model.
    VoiceModel("openai-realtime", "openai", "voice_model", "PEPPER_VOICE_MODEL", "gpt-realtime-2",
               ("gpt-realtime", "gpt-realtime-mini", "gpt-realtime-1.5", "gpt-realtime-2", "gpt-realtime-2.1")),
    # Gemini 3.8 Live is Google's default stable Live model (September 2026); 3.1 Flash Live the
    # preview before it (the id the google-genai SDK's own examples use); 2.5 the older preview.
    VoiceModel("gemini-live", "google", "gemini_live_model", "PEPPER_GEMINI_LIVE_MODEL", "gemini-3.8-live",
               ("gemini-live-2.5-flash-preview", "gemini-3.1-flash-live-preview", "gemini-3.8-live",
                "gemini-3.8-live-extended-thinking")),
    VoiceModel("gpt-live", "openai", "gpt_live_model", "PEPPER_GPT_LIVE_MODEL", "gpt-live-1",
               ("gpt-live-1", "gpt-live-1.1")),
)  # fmt: skip


def voice_model(engine: str) -> VoiceModel:
    return next(m for m in VOICE_MODELS if m.engine == engine)


def default_voice_model(engine: str) -> str:
    return voice_model(engine).default
