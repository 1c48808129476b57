"""Typed settings, read once at start-up from the environment and an optional TOML file.

Provider SDKs keep their own variable names (``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ...);
Pepper's own settings start with ``PEPPER_``. Library code receives a ``Settings`` object and
never reads ``os.environ`` itself.

Precedence, highest first: explicit keyword arguments, environment variables, the TOML file
(``PEPPER_CONFIG``, else ``pepper.toml`` in the working directory), defaults. Keys in the TOML
file are the field names below (``public_url = "https://..."``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from core.errors import ConfigError
from core.models.config import ModelsConfig

DEFAULT_DATA_DIR = Path("~/.pepper")
DEFAULT_TWILIO_API_URL = "https://api.twilio.com"


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    # Pepper itself.
    public_url: str | None = Field(None, validation_alias=_env("PEPPER_PUBLIC_URL", "public_url"))
    data_dir: Path = Field(DEFAULT_DATA_DIR, validation_alias=_env("PEPPER_DATA_DIR", "data_dir"))
    host: str = Field("127.0.0.1", validation_alias=_env("PEPPER_HOST", "host"))
    port: int = Field(8080, ge=0, le=65535, validation_alias=_env("PEPPER_PORT", "port"))
    database_url: SecretStr | None = Field(None, validation_alias=_env("DATABASE_URL", "database_url"))
    default_region: str = Field("US", validation_alias=_env("PEPPER_DEFAULT_REGION", "default_region"))
    log_level: str = Field("INFO", validation_alias=_env("PEPPER_LOG_LEVEL", "log_level"))
    graceful_timeout: float = Field(10.0, ge=0, validation_alias=_env("PEPPER_GRACEFUL_TIMEOUT", "graceful_timeout"))

    # Model providers: the SDKs' own variable names.
    openai_api_key: SecretStr | None = Field(None, validation_alias=_env("OPENAI_API_KEY", "openai_api_key"))
    openai_base_url: str | None = Field(None, validation_alias=_env("OPENAI_BASE_URL", "openai_base_url"))
    anthropic_api_key: SecretStr | None = Field(None, validation_alias=_env("ANTHROPIC_API_KEY", "anthropic_api_key"))
    anthropic_base_url: str | None = Field(None, validation_alias=_env("ANTHROPIC_BASE_URL", "anthropic_base_url"))
    gemini_api_key: SecretStr | None = Field(
        None, validation_alias=_env("GEMINI_API_KEY", "GOOGLE_API_KEY", "gemini_api_key")
    )
    gemini_base_url: str | None = Field(None, validation_alias=_env("GOOGLE_GEMINI_BASE_URL", "gemini_base_url"))
    deepgram_api_key: SecretStr | None = Field(None, validation_alias=_env("DEEPGRAM_API_KEY", "deepgram_api_key"))
    # Model tiers, mixes, alternates, an OpenAI-compatible endpoint: a [models] table or JSON.
    models: ModelsConfig = Field(default_factory=ModelsConfig, validation_alias=_env("PEPPER_MODELS", "models"))

    # Twilio.
    twilio_account_sid: str | None = Field(None, validation_alias=_env("TWILIO_ACCOUNT_SID", "twilio_account_sid"))
    twilio_auth_token: SecretStr | None = Field(None, validation_alias=_env("TWILIO_AUTH_TOKEN", "twilio_auth_token"))
    twilio_api_url: str = Field(
        DEFAULT_TWILIO_API_URL, validation_alias=_env("PEPPER_TWILIO_API_URL", "twilio_api_url")
    )
    # Secret of a Twilio Webhooks "SharedKey" rule (HMAC-SHA256 signatures), if one is configured.
    twilio_webhook_shared_key: SecretStr | None = Field(
        None, validation_alias=_env("PEPPER_TWILIO_WEBHOOK_SHARED_KEY", "twilio_webhook_shared_key")
    )
    # A text from a number that belongs to no account: "ignore" it, or "reply" with one polite line.
    unknown_sender: Literal["ignore", "reply"] = Field(
        "ignore", validation_alias=_env("PEPPER_UNKNOWN_SENDER", "unknown_sender")
    )

    # Where this process found its TOML file, if any (for `pepper doctor`).
    config_file: Path | None = Field(None, validation_alias=_env("PEPPER_CONFIG", "config_file"))

    # Seconds between rounds of background memory work (summaries, dossier rewrites, indexing); 0 turns
    # it off (when the scheduler calls core.memory.memory_jobs_tick instead).
    memory_jobs_interval: float = Field(
        60.0, ge=0, validation_alias=_env("PEPPER_MEMORY_JOBS_INTERVAL", "memory_jobs_interval")
    )

    @field_validator("data_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("public_url", mode="after")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if not value.startswith(("https://", "http://")):
            raise ValueError("PEPPER_PUBLIC_URL must start with https:// (or http:// for local testing)")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml = _config_file()
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)

    @property
    def uses_embedded_postgres(self) -> bool:
        return self.database_url is None

    @property
    def public_ws_url(self) -> str | None:
        """The public base URL with a ws(s) scheme, as Twilio signs Media Stream upgrades."""
        if self.public_url is None:
            return None
        return "wss://" + self.public_url.removeprefix("https://").removeprefix("http://")

    def redacted(self) -> dict[str, Any]:
        """Every setting, secrets masked: safe to print or log."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                out[name] = "set (hidden)" if value.get_secret_value() else None
            else:
                out[name] = value
        return out


def _config_file() -> Path | None:
    # The one place outside start-up that reads the environment: it decides which file the
    # settings come from, before the settings exist.
    explicit = os.environ.get("PEPPER_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"PEPPER_CONFIG names {path}, which is not a readable file")
        return path
    local = Path("pepper.toml")
    return local if local.is_file() else None


def load_settings(**overrides: Any) -> Settings:
    """Read settings once; raises ``pydantic.ValidationError`` on bad values."""
    return Settings(**overrides)
