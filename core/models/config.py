"""The ``models`` settings section: tiers, mixes, alternates and an OpenAI-compatible endpoint.

In ``pepper.toml``::

    [models]
    compatible_base_url = "http://127.0.0.1:11434/v1"   # Ollama, vLLM, llama.cpp server

    [models.tiers.small]
    mix = [{ model = "gpt-5-mini", effort = "low", weight = 3 }, { model = "claude-haiku-4-5", weight = 1 }]
    alternate = { model = "gemini-2.5-flash" }

    [models.tiers.large]
    model = "gpt-5"
    effort = "medium"

or the same as JSON in ``PEPPER_MODELS``. A tier is one model (``model``, ``effort``,
``thinking_budget``) or a weighted ``mix``; ``alternate`` is where a transient failure fails over.
Tiers left out get defaults on whichever providers have keys (see ``core.models.router``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class ModelChoiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    effort: str | None = None
    thinking_budget: int | None = Field(None, ge=0)
    weight: float = Field(1.0, gt=0)


class TierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    effort: str | None = None
    thinking_budget: int | None = Field(None, ge=0)
    mix: tuple[ModelChoiceConfig, ...] = ()
    alternate: ModelChoiceConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # ``alternate = "claude-haiku-4-5"`` is short for ``alternate = { model = "..." }``.
        if isinstance(data, dict) and isinstance(data.get("alternate"), str):
            data = {**data, "alternate": {"model": data["alternate"]}}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> TierConfig:
        if (self.model is None) == (not self.mix):
            raise ValueError("a model tier names either one `model` or a `mix`, not both and not neither")
        return self

    def choices(self) -> tuple[ModelChoiceConfig, ...]:
        if self.mix:
            return self.mix
        assert self.model is not None
        return (ModelChoiceConfig(model=self.model, effort=self.effort, thinking_budget=self.thinking_budget),)


class ModelsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tiers: dict[str, TierConfig] = Field(default_factory=dict)
    compatible_base_url: str | None = None
    compatible_api_key: SecretStr | None = None
    # The model the default tiers use when the compatible endpoint is the only provider.
    compatible_model: str | None = None
    timeout: float = Field(120.0, gt=0)
    # "local" (default: all-MiniLM-L6-v2 on this machine) or an OpenAI embedding model name.
    embeddings: str | None = None
    embedding_dimensions: int | None = Field(None, gt=0)
