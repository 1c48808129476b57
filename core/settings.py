"""Typed settings, read once at start-up from the environment and an optional TOML file.

Provider SDKs keep their own variable names (``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ...);
Pepper's own settings start with ``PEPPER_``. Library code receives a ``Settings`` object and
never reads ``os.environ`` itself.

Precedence, highest first: explicit keyword arguments, environment variables, the TOML file
(``PEPPER_CONFIG``, else ``pepper.toml`` in the working directory), defaults. Keys in the TOML
file are the field names below (``public_url = "https://..."``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from core.errors import ConfigError
from core.models.config import ModelsConfig
from core.models.voice_models import default_voice_model
from core.usage.config import UsageConfig

DEFAULT_DATA_DIR = Path("~/.pepper")
DEFAULT_TWILIO_API_URL = "https://api.twilio.com"
# The realtime voice engines a call can run on (voice/engines.py builds them).
VoiceEngine = Literal["openai-realtime", "gemini-live", "gpt-live", "cascade"]
VOICE_ENGINES: tuple[str, ...] = get_args(VoiceEngine)
# How a call reaches its voice model (docs/voice.md "Transports"): the server's default, and per line.
VoiceTransport = Literal["media-streams", "sip"]
VOICE_TRANSPORTS: tuple[str, ...] = get_args(VoiceTransport)


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    # Pepper itself.
    public_url: str | None = Field(None, validation_alias=_env("PEPPER_PUBLIC_URL", "public_url"))
    data_dir: Path = Field(DEFAULT_DATA_DIR, validation_alias=_env("PEPPER_DATA_DIR", "data_dir"))
    host: str = Field("127.0.0.1", validation_alias=_env("PEPPER_HOST", "host"))
    port: int = Field(8080, ge=0, le=65535, validation_alias=_env("PEPPER_PORT", "port"))
    # Twilio media sockets have their own listener (gateway.media_server); proxy /twilio/media here.
    media_port: int = Field(8081, ge=0, le=65535, validation_alias=_env("PEPPER_MEDIA_PORT", "media_port"))
    # Processes that hold phone calls, all accepting on PEPPER_MEDIA_PORT (gateway.media_procs): a
    # call's audio is CPU-bound relay work, one event loop holds about 100 calls per core. 1 serves
    # the media socket inside the web server, as before.
    media_processes: int = Field(2, ge=1, le=64, validation_alias=_env("PEPPER_MEDIA_PROCESSES", "media_processes"))
    database_url: SecretStr | None = Field(None, validation_alias=_env("DATABASE_URL", "database_url"))
    # The owner's country: numbers written without +country are read in it, and the answering
    # service texts callers only there unless the owner sets ``pepper answering set --sms-countries``.
    default_region: str = Field("US", validation_alias=_env("PEPPER_DEFAULT_REGION", "default_region"))
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", validation_alias=_env("PEPPER_LOG_LEVEL", "log_level")
    )
    # "text": one line per record; "json": one JSON object per line, for a log collector.
    log_format: Literal["text", "json"] = Field("text", validation_alias=_env("PEPPER_LOG_FORMAT", "log_format"))
    max_concurrent_turns: int = Field(
        8, ge=1, validation_alias=_env("PEPPER_MAX_CONCURRENT_TURNS", "max_concurrent_turns")
    )
    graceful_timeout: float = Field(10.0, ge=0, validation_alias=_env("PEPPER_GRACEFUL_TIMEOUT", "graceful_timeout"))
    # Processes that run text turns apart from the web server (each runs up to
    # max_concurrent_turns at once); 0 runs turns inside the web server.
    turn_workers: int = Field(2, ge=0, le=64, validation_alias=_env("PEPPER_TURN_WORKERS", "turn_workers"))
    # How much nicer (lower CPU priority) than the web server the turn workers run: an
    # acknowledgement is latency work, a turn is throughput work, so the scheduler should run the
    # web server first whenever both want a core. 0 runs them at the same priority.
    turn_worker_nice: int = Field(10, ge=0, le=19, validation_alias=_env("PEPPER_TURN_WORKER_NICE", "turn_worker_nice"))
    # And on Linux, beyond niceness, the idle scheduling class (SCHED_IDLE) for them and their local
    # Postgres backends: a nice-10 process still takes its share of a core for a few milliseconds
    # whenever it runs, an idle-class one gives the core up as soon as the web server wants it.
    turn_worker_idle: bool = Field(True, validation_alias=_env("PEPPER_TURN_WORKER_IDLE", "turn_worker_idle"))

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
    # Prices, daily caps per person and the usage tiers (core.usage): [usage] or JSON in PEPPER_USAGE.
    usage: UsageConfig = Field(default_factory=UsageConfig, validation_alias=_env("PEPPER_USAGE", "usage"))

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

    # Email channel. The mail provider's HTTP webhook signing key (Mailgun: Sending > Webhooks).
    email_webhook_signing_key: SecretStr | None = Field(
        None, validation_alias=_env("PEPPER_EMAIL_WEBHOOK_SIGNING_KEY", "email_webhook_signing_key")
    )
    # Mail claiming to be from a person's address must prove it (the provider's DKIM or SPF pass,
    # aligned with the From domain) before it reaches their agent. Turn off only behind a trusted relay.
    email_require_sender_auth: bool = Field(
        True, validation_alias=_env("PEPPER_EMAIL_REQUIRE_SENDER_AUTH", "email_require_sender_auth")
    )

    # Rooms (docs/rooms.md) on a Matrix homeserver. Unset: `pepper serve` runs its own Synapse (SQLite,
    # 127.0.0.1:matrix_port, config in <data dir>/matrix) and registers Pepper's user on it. Set: Pepper
    # logs into that homeserver as matrix_user with matrix_password (or matrix_access_token).
    matrix_homeserver: str | None = Field(None, validation_alias=_env("PEPPER_MATRIX_HOMESERVER", "matrix_homeserver"))
    matrix_user: str = Field("pepper", validation_alias=_env("PEPPER_MATRIX_USER", "matrix_user"))
    matrix_password: SecretStr | None = Field(None, validation_alias=_env("PEPPER_MATRIX_PASSWORD", "matrix_password"))
    matrix_access_token: SecretStr | None = Field(
        None, validation_alias=_env("PEPPER_MATRIX_ACCESS_TOKEN", "matrix_access_token")
    )
    # The embedded Synapse's port and server name (the part after ':' in its users' Matrix IDs).
    matrix_port: int = Field(8448, ge=0, le=65535, validation_alias=_env("PEPPER_MATRIX_PORT", "matrix_port"))
    matrix_server_name: str = Field(
        "localhost", validation_alias=_env("PEPPER_MATRIX_SERVER_NAME", "matrix_server_name")
    )
    # Whether `pepper serve` follows rooms at all (off: no homeserver, no sync loop).
    rooms_enabled: bool = Field(True, validation_alias=_env("PEPPER_ROOMS_ENABLED", "rooms_enabled"))

    # Where this process found its TOML file, if any (for `pepper doctor`).
    config_file: Path | None = Field(None, validation_alias=_env("PEPPER_CONFIG", "config_file"))

    # The scheduler: whether this process runs scheduled tasks, how old a missed occurrence may be
    # and still run after a restart, how long a claim holds without a heartbeat, how often it looks.
    scheduler_enabled: bool = Field(True, validation_alias=_env("PEPPER_SCHEDULER_ENABLED", "scheduler_enabled"))
    scheduler_catch_up_hours: float = Field(
        6.0, ge=0, validation_alias=_env("PEPPER_SCHEDULER_CATCH_UP_HOURS", "scheduler_catch_up_hours")
    )
    scheduler_lease_seconds: float = Field(
        120.0, ge=2, validation_alias=_env("PEPPER_SCHEDULER_LEASE_SECONDS", "scheduler_lease_seconds")
    )
    scheduler_poll_seconds: float = Field(
        15.0, gt=0, validation_alias=_env("PEPPER_SCHEDULER_POLL_SECONDS", "scheduler_poll_seconds")
    )
    # Feature areas. Pepper's own mail address (SMTP); the owner is always on CC of what it sends.
    smtp_host: str | None = Field(None, validation_alias=_env("PEPPER_SMTP_HOST", "smtp_host"))
    smtp_port: int = Field(587, ge=1, le=65535, validation_alias=_env("PEPPER_SMTP_PORT", "smtp_port"))
    smtp_username: str | None = Field(None, validation_alias=_env("PEPPER_SMTP_USERNAME", "smtp_username"))
    smtp_password: SecretStr | None = Field(None, validation_alias=_env("PEPPER_SMTP_PASSWORD", "smtp_password"))
    smtp_from: str | None = Field(None, validation_alias=_env("PEPPER_SMTP_FROM", "smtp_from"))
    # "starttls" (port 587), "tls" (implicit, port 465) or "none" (a local relay only).
    smtp_security: Literal["starttls", "tls", "none"] = Field(
        "starttls", validation_alias=_env("PEPPER_SMTP_SECURITY", "smtp_security")
    )
    # Google OAuth client for Calendar (events scope) and Gmail (compose scope).
    google_client_id: str | None = Field(None, validation_alias=_env("PEPPER_GOOGLE_CLIENT_ID", "google_client_id"))
    google_client_secret: SecretStr | None = Field(
        None, validation_alias=_env("PEPPER_GOOGLE_CLIENT_SECRET", "google_client_secret")
    )
    # Where Google's consent page, API and token requests are (loopback peers in tests).
    google_auth_url: str = Field(
        "https://accounts.google.com/o/oauth2/v2/auth",
        validation_alias=_env("PEPPER_GOOGLE_AUTH_URL", "google_auth_url"),
    )
    google_api_url: str = Field(
        "https://www.googleapis.com", validation_alias=_env("PEPPER_GOOGLE_API_URL", "google_api_url")
    )
    google_revoke_url: str = Field(
        "https://oauth2.googleapis.com/revoke", validation_alias=_env("PEPPER_GOOGLE_REVOKE_URL", "google_revoke_url")
    )
    google_token_url: str = Field(
        "https://oauth2.googleapis.com/token", validation_alias=_env("PEPPER_GOOGLE_TOKEN_URL", "google_token_url")
    )
    # Seals connection secrets (OAuth tokens, CalDAV passwords) at rest: Fernet keys, comma-separated,
    # the first seals and all open (rotation). Unset: <data dir>/secret.key, created on first use.
    secret_key: SecretStr | None = Field(None, validation_alias=_env("PEPPER_SECRET_KEY", "secret_key"))
    # Calls Pepper places (voice.outbound): an unanswered call is tried once more this many seconds
    # later; due retries are looked for every outbound_poll_seconds; a call rings this long.
    outbound_retry_seconds: float = Field(
        600.0, ge=0, validation_alias=_env("PEPPER_OUTBOUND_RETRY_SECONDS", "outbound_retry_seconds")
    )
    outbound_poll_seconds: float = Field(
        5.0, gt=0, validation_alias=_env("PEPPER_OUTBOUND_POLL_SECONDS", "outbound_poll_seconds")
    )
    outbound_ring_seconds: int = Field(
        25, ge=5, le=600, validation_alias=_env("PEPPER_OUTBOUND_RING_SECONDS", "outbound_ring_seconds")
    )
    # Hand a caller to the owner (transfer_to_owner): how long the owner's phone rings first.
    transfer_ring_seconds: int = Field(
        20, ge=5, le=600, validation_alias=_env("PEPPER_TRANSFER_RING_SECONDS", "transfer_ring_seconds")
    )
    # Twilio Lookup v2 (line type and caller name) for each answering-service caller; costs per lookup.
    twilio_lookup: bool = Field(False, validation_alias=_env("PEPPER_TWILIO_LOOKUP", "twilio_lookup"))
    # Phone calls (voice/). A caller on a personal line who is not its verified owner: "refuse"
    # politely, or hand the call to the "answering" service. Never the owner's session.
    voice_unknown_caller: Literal["refuse", "answering"] = Field(
        "refuse", validation_alias=_env("PEPPER_VOICE_UNKNOWN_CALLER", "voice_unknown_caller")
    )
    # The engine calls use unless their line names another (``pepper line engine``): "openai-realtime"
    # (speech to speech), "gemini-live" (GEMINI_API_KEY), "gpt-live" (OpenAI GPT-Live, full duplex,
    # its tasks delegated to Pepper's own turns), "cascade" (local STT -> the text model -> local
    # TTS), or "auto": openai-realtime with an OpenAI key, else the cascade when any text model is
    # set up (the offline default).
    voice_engine: Literal["auto", "openai-realtime", "gemini-live", "gpt-live", "cascade"] = Field(
        "auto", validation_alias=_env("PEPPER_VOICE_ENGINE", "voice_engine")
    )
    gemini_live_model: str = Field(
        default_voice_model("gemini-live"), validation_alias=_env("PEPPER_GEMINI_LIVE_MODEL", "gemini_live_model")
    )
    # A Gemini prebuilt voice (voice_voice names an OpenAI voice).
    gemini_live_voice: str = Field("Kore", validation_alias=_env("PEPPER_GEMINI_LIVE_VOICE", "gemini_live_voice"))
    # The text model tier the cascade answers with, and its speech to text: local "whisper", "deepgram"
    # (DEEPGRAM_API_KEY), or "auto" (Deepgram with a key, else Whisper).
    voice_cascade_tier: str = Field("small", validation_alias=_env("PEPPER_VOICE_CASCADE_TIER", "voice_cascade_tier"))
    voice_cascade_stt: Literal["auto", "whisper", "deepgram"] = Field(
        "auto", validation_alias=_env("PEPPER_VOICE_CASCADE_STT", "voice_cascade_stt")
    )
    # The cascade's text to speech: local "piper" (the offline default, even with a Deepgram key),
    # or "deepgram" (Aura over its streaming websocket, DEEPGRAM_API_KEY; piper speaks any sentence
    # it fails on) with the Aura voice voice_cascade_tts_voice.
    voice_cascade_tts: Literal["piper", "deepgram"] = Field(
        "piper", validation_alias=_env("PEPPER_VOICE_CASCADE_TTS", "voice_cascade_tts")
    )
    voice_cascade_tts_voice: str = Field(
        "aura-2-thalia-en", validation_alias=_env("PEPPER_VOICE_CASCADE_TTS_VOICE", "voice_cascade_tts_voice")
    )
    # Where Deepgram requests go (a loopback peer in tests).
    deepgram_api_url: str | None = Field(None, validation_alias=_env("DEEPGRAM_API_URL", "deepgram_api_url"))
    # The Realtime websocket base (default: OPENAI_BASE_URL with a ws scheme, as the SDK does).
    openai_realtime_url: str | None = Field(
        None, validation_alias=_env("PEPPER_OPENAI_REALTIME_URL", "openai_realtime_url")
    )
    # The voice models (defaults from core.models.voice_models, the one table of their names).
    voice_model: str = Field(
        default_voice_model("openai-realtime"), validation_alias=_env("PEPPER_VOICE_MODEL", "voice_model")
    )
    # GPT-Live (the gpt-live engine): its model, and its websocket base (default: OPENAI_BASE_URL
    # with a ws scheme, as the SDK does; the SDK adds /live/sessions).
    gpt_live_model: str = Field(
        default_voice_model("gpt-live"), validation_alias=_env("PEPPER_GPT_LIVE_MODEL", "gpt_live_model")
    )
    gpt_live_url: str | None = Field(None, validation_alias=_env("PEPPER_GPT_LIVE_URL", "gpt_live_url"))
    voice_voice: str = Field("marin", validation_alias=_env("PEPPER_VOICE_VOICE", "voice_voice"))
    voice_notice: str = Field(
        "Hi, this is Pepper. This call is transcribed. To unlock your assistant, key in your PIN and then"
        " the pound key, say your PIN, or ask me to text you a code.",
        validation_alias=_env("PEPPER_VOICE_NOTICE", "voice_notice"),
    )
    # How calls reach the voice model: Twilio Media Streams through Pepper, or SIP direct (a Twilio
    # Elastic SIP trunk to OpenAI's SIP endpoint; Pepper answers the signed webhook and drives the
    # GPT-Live session over its sideband socket, voice/sip.py). The default for lines that name
    # none (``pepper line transport``).
    voice_transport: VoiceTransport = Field(
        "media-streams", validation_alias=_env("PEPPER_VOICE_TRANSPORT", "voice_transport")
    )
    openai_webhook_secret: SecretStr | None = Field(
        None, validation_alias=_env("OPENAI_WEBHOOK_SECRET", "openai_webhook_secret")
    )
    # The REST base of the Live sessions API for SIP direct (accept, reject, hangup); OPENAI_BASE_URL if unset.
    openai_live_api_url: str | None = Field(
        None, validation_alias=_env("PEPPER_OPENAI_LIVE_API_URL", "openai_live_api_url")
    )
    # Who speaks the transcription notice: Pepper itself from a cached local-TTS recording (a
    # guarantee, voice/notice.py), or the model asked to say it (an instruction).
    voice_notice_audio: Literal["local", "model"] = Field(
        "local", validation_alias=_env("PEPPER_VOICE_NOTICE_AUDIO", "voice_notice_audio")
    )
    voice_max_call_seconds: int = Field(
        1800, ge=10, validation_alias=_env("PEPPER_VOICE_MAX_CALL_SECONDS", "voice_max_call_seconds")
    )
    voice_token_ttl_seconds: int = Field(
        60, ge=5, le=600, validation_alias=_env("PEPPER_VOICE_TOKEN_TTL_SECONDS", "voice_token_ttl_seconds")
    )
    voice_max_verify_failures: int = Field(
        3, ge=1, le=10, validation_alias=_env("PEPPER_VOICE_MAX_VERIFY_FAILURES", "voice_max_verify_failures")
    )
    # Keep each call's recording for ``pepper replay-call`` (voice.call_tape).
    voice_record_calls: bool = Field(True, validation_alias=_env("PEPPER_VOICE_RECORD_CALLS", "voice_record_calls"))
    # Seconds between rounds of background memory work (summaries, dossier rewrites, indexing); 0 turns
    # it off (when the scheduler calls core.memory.memory_jobs_tick instead).
    memory_jobs_interval: float = Field(
        60.0, ge=0, validation_alias=_env("PEPPER_MEMORY_JOBS_INTERVAL", "memory_jobs_interval")
    )

    # GET /metrics (gateway/metrics_route.py): the bearer token a scraper sends; unset, only this
    # machine's own scrapers, talking to Pepper directly, may read it.
    metrics_token: SecretStr | None = Field(None, validation_alias=_env("PEPPER_METRICS_TOKEN", "metrics_token"))

    # Web research (core/web, docs/research.md): the search service ("auto": the first set up of
    # Brave, Tavily, SearXNG; "hosted": the research tier's model searches with its provider's own
    # search tool; "none": no web research), its key or instance URL, where its API is.
    web_search_provider: Literal["auto", "none", "brave", "tavily", "searxng", "hosted"] = Field(
        "auto", validation_alias=_env("PEPPER_WEB_SEARCH_PROVIDER", "web_search_provider")
    )
    brave_api_key: SecretStr | None = Field(None, validation_alias=_env("BRAVE_API_KEY", "brave_api_key"))
    tavily_api_key: SecretStr | None = Field(None, validation_alias=_env("TAVILY_API_KEY", "tavily_api_key"))
    searxng_url: str | None = Field(None, validation_alias=_env("PEPPER_SEARXNG_URL", "searxng_url"))
    brave_search_url: str = Field(
        "https://api.search.brave.com", validation_alias=_env("PEPPER_BRAVE_SEARCH_URL", "brave_search_url")
    )
    tavily_url: str = Field("https://api.tavily.com", validation_alias=_env("PEPPER_TAVILY_URL", "tavily_url"))
    # The model tier the research helper runs on, and how long one hand-off may take in all.
    web_research_tier: str = Field("small", validation_alias=_env("PEPPER_WEB_RESEARCH_TIER", "web_research_tier"))
    web_research_seconds: float = Field(
        60.0, gt=0, validation_alias=_env("PEPPER_WEB_RESEARCH_SECONDS", "web_research_seconds")
    )
    # Places and travel time (core/tools/areas/places): a routing service (OSRM or
    # OpenRouteService) and, for OpenRouteService, its key (it also geocodes addresses). Without
    # one, travel time is an estimate from straight-line distance at this speed, and says so.
    routing_kind: str = Field("none", pattern="^(none|osrm|openrouteservice)$",
                              validation_alias=_env("PEPPER_ROUTING_KIND", "routing_kind"))  # fmt: skip
    routing_url: str | None = Field(None, validation_alias=_env("PEPPER_ROUTING_URL", "routing_url"))
    routing_key: SecretStr | None = Field(None, validation_alias=_env("PEPPER_ROUTING_KEY", "routing_key"))
    travel_speed_kmh: float = Field(
        30.0, gt=0, le=300, validation_alias=_env("PEPPER_TRAVEL_SPEED_KMH", "travel_speed_kmh")
    )
    # How long one request to an MCP server a person connected may take (connecting included).
    mcp_call_seconds: float = Field(20.0, gt=0, validation_alias=_env("PEPPER_MCP_CALL_SECONDS", "mcp_call_seconds"))
    # The relay's caps per fetch (core/web/egress.py).
    web_fetch_seconds: float = Field(15.0, gt=0, validation_alias=_env("PEPPER_WEB_FETCH_SECONDS", "web_fetch_seconds"))
    web_fetch_max_bytes: int = Field(
        5 * 1024 * 1024, ge=1024, validation_alias=_env("PEPPER_WEB_FETCH_MAX_BYTES", "web_fetch_max_bytes")
    )
    # Once the person asks for the web, this many follow-ups within this many minutes may use it too.
    web_followups: int = Field(3, ge=0, validation_alias=_env("PEPPER_WEB_FOLLOWUPS", "web_followups"))
    web_followup_minutes: float = Field(
        30.0, ge=0, validation_alias=_env("PEPPER_WEB_FOLLOWUP_MINUTES", "web_followup_minutes")
    )
    # Tests only: loopback ports the relay may reach (the tests' peers). Empty: none, ever.
    web_test_loopback_ports: tuple[int, ...] = Field(
        (), validation_alias=_env("PEPPER_WEB_TEST_LOOPBACK_PORTS", "web_test_loopback_ports")
    )
    # Following (core/following): the structured sources, the extraction's model tier, how often pages are read.
    sportsdb_url: str = Field(
        "https://www.thesportsdb.com", validation_alias=_env("PEPPER_SPORTSDB_URL", "sportsdb_url")
    )
    sportsdb_key: SecretStr | None = Field(None, validation_alias=_env("PEPPER_SPORTSDB_KEY", "sportsdb_key"))
    tvmaze_url: str = Field("https://api.tvmaze.com", validation_alias=_env("PEPPER_TVMAZE_URL", "tvmaze_url"))
    follow_tier: str = Field("small", validation_alias=_env("PEPPER_FOLLOW_TIER", "follow_tier"))
    follow_page_hours: float = Field(6.0, gt=0, validation_alias=_env("PEPPER_FOLLOW_PAGE_HOURS", "follow_page_hours"))
    # Where the research helper listens (a unix socket); `pepper serve` sets it when it starts one.
    web_research_socket: str | None = Field(
        None, validation_alias=_env("PEPPER_WEB_RESEARCH_SOCKET", "web_research_socket")
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

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

    def secret_values(self) -> frozenset[str]:
        """Every secret these settings hold, in the clear (the sandbox strips them from a child's
        environment): each ``SecretStr``, nested sections' included, and the database URL."""
        found: set[str] = set()

        def walk(value: Any) -> None:
            if isinstance(value, SecretStr):
                if value.get_secret_value():
                    found.add(value.get_secret_value())
            elif isinstance(value, BaseModel):
                for name in type(value).model_fields:
                    walk(getattr(value, name))
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item)
            elif isinstance(value, list | tuple):
                for item in value:
                    walk(item)

        walk(self)
        return frozenset(found)

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


# PEPPER_ variables that are not settings: read by one command, or by the test suite.
OTHER_PEPPER_VARIABLES = frozenset(
    {
        "PEPPER_TOKEN",
        "PEPPER_CALDAV_PASSWORD",
        "PEPPER_IMAP_PASSWORD",
        "PEPPER_BACKUP_PASSPHRASE",
        "PEPPER_TEST_DATABASE_URL",
    }
)


def setting_names() -> tuple[frozenset[str], frozenset[str]]:
    """(environment variable names, TOML keys) that Settings reads."""
    env: set[str] = set()
    keys: set[str] = set()
    for name, field in Settings.model_fields.items():
        keys.add(name)
        alias = field.validation_alias
        for choice in alias.choices if isinstance(alias, AliasChoices) else ():
            if isinstance(choice, str) and choice != name:
                env.add(choice)
    return frozenset(env), frozenset(keys)


def _nearest(name: str, names: frozenset[str]) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def config_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per setting Pepper does not know: a ``PEPPER_*`` variable or a key of the TOML file
    (each a likely misspelling, otherwise silently ignored), with the nearest valid name."""
    environ = os.environ if environ is None else environ
    env_names, keys = setting_names()
    found: list[str] = []
    for name in sorted(environ):
        if name.startswith("PEPPER_") and name not in env_names and name not in OTHER_PEPPER_VARIABLES:
            found.append(f"unknown setting {name} in the environment (ignored){_nearest(name, env_names)}")
    path = _config_file()
    if path is not None:
        for key in sorted(_read_toml(path)):
            if key not in keys and key not in env_names:
                found.append(f"unknown key {key!r} in {path} (ignored){_nearest(key, keys)}")
    return found


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def load_settings(**overrides: Any) -> Settings:
    """Read settings once. Every mistake is a ``ConfigError`` of one line naming the variable, or the
    file and key (never the value: it may be a secret)."""
    path = _config_file()
    if path is not None:
        _read_toml(path)  # a syntax error, named with its file and line
        if "config_file" not in overrides:  # found in the working directory, not named: say which
            overrides = {**overrides, "config_file": path.resolve()}
    try:
        return Settings(**overrides)
    except SettingsError as exc:
        raise ConfigError(_settings_error(exc)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        raise ConfigError(f"bad setting {_where(loc, path, overrides)}: {first['msg']}") from None


def _where(loc: list[str], path: Path | None, overrides: Mapping[str, Any]) -> str:
    """The variable, or the file and key, a bad value came from (pydantic names the first alias)."""
    if not loc:
        return "settings"
    field = next(
        (
            name
            for name, info in Settings.model_fields.items()
            if loc[0] == name
            or (isinstance(info.validation_alias, AliasChoices) and loc[0] in info.validation_alias.choices)
        ),
        None,
    )
    if field is None or field in overrides:
        return ".".join(loc)
    alias = Settings.model_fields[field].validation_alias
    names = [c for c in alias.choices if isinstance(c, str)] if isinstance(alias, AliasChoices) else [field]
    in_env = [n for n in names if n != field and n in os.environ]
    if in_env:
        return ".".join([in_env[0], *loc[1:]])
    if path is not None:
        table = _read_toml(path)
        key = next((n for n in names if n in table), field)
        return f"{'.'.join([key, *loc[1:]])} in {path}"
    return ".".join(loc)


def _settings_error(exc: SettingsError) -> str:
    """pydantic-settings could not decode a complex value (JSON in a variable): say where and why."""
    found = re.search(r'field "(\w+)"', str(exc))
    field = Settings.model_fields.get(found[1]) if found else None
    alias = field.validation_alias if field is not None else None
    for name in alias.choices if isinstance(alias, AliasChoices) else ():
        if isinstance(name, str) and name in os.environ:
            try:
                json.loads(os.environ[name])
            except json.JSONDecodeError as decode:
                return f"{name} is not valid JSON: {decode.msg} (line {decode.lineno}, column {decode.colno})"
            return f"{name} could not be read: {exc}"
    return f"a setting could not be read: {exc}"
