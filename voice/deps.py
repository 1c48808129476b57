"""What every call of this server shares: its settings (:class:`VoiceConfig`) and the parts built
once at start-up (:class:`VoiceDeps`)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from core.memory import MemoryConfig
from core.records import calls as call_records
from core.settings import Settings
from core.store import Database
from core.tools.connectors import Connectors
from core.tools.gate import Gate
from core.tools.registry import ToolRegistry
from core.usage.config import UsageConfig
from voice.call_tape import TapeWriter
from voice.engines import RealtimeEngines
from voice.live_call import Delegate, Settle
from voice.notice import NoticeAudio
from voice.realtime import RealtimeModel

SendSms = Callable[[str, str, str], Awaitable[None]]  # (to, from_, body)


def _load_filler() -> bytes:
    return (resources.files("voice") / "data" / "filler.ulaw").read_bytes()


@dataclass(frozen=True)
class VoiceConfig:
    notice: str = "Hi, this is Pepper. This call is transcribed."
    voice: str = "marin"
    max_call_seconds: float = 1800.0
    max_verify_failures: int = 3
    filler_after: float = 1.0
    notice_timeout: float = 20.0
    closing_grace: float = 10.0
    model_reconnects: int = 1
    # A model session's handshake and configuration, at most: past it the attempt counts as refused
    # and the next one starts (websockets' own open timeout is 10 s, heard as silence on a call).
    model_open_timeout: float = 4.0
    code_ttl_seconds: float = 300.0
    # Across calls (voice.verification): wrong PINs within the window that lock the PIN path, per
    # calling number and per account; code texts per call and per account per window.
    pin_failures_per_source: int = 5
    pin_failures_per_account: int = 10
    codes_per_call: int = 2
    codes_per_hour: int = 2
    verify_window_seconds: float = 3600.0
    dtmf_idle_seconds: float = 3.0
    # Each call's recording for ``pepper replay-call`` (voice.call_tape), written every this long.
    record_calls: bool = True
    tape_flush_s: float = 5.0
    transport: str = "media-streams"  # PEPPER_VOICE_TRANSPORT: lines that name none (docs/voice.md)

    @classmethod
    def from_settings(cls, settings: Settings) -> VoiceConfig:
        return cls(
            notice=settings.voice_notice,
            voice=settings.voice_voice,
            max_call_seconds=float(settings.voice_max_call_seconds),
            max_verify_failures=settings.voice_max_verify_failures,
            record_calls=settings.voice_record_calls,
            transport=settings.voice_transport,
        )


@dataclass
class VoiceDeps:
    """Built once at start-up and shared by every call."""

    db: Database
    model: RealtimeModel | None
    registry: ToolRegistry
    gate: Gate
    config: VoiceConfig = field(default_factory=VoiceConfig)
    send_sms: SendSms | None = None
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    filler: bytes = field(default_factory=_load_filler)
    engines: RealtimeEngines | None = None  # per-line engines; ``model`` is the default one
    tape_writer: TapeWriter | None = None  # the calls' recordings, written in batches (made if None)
    # Outside services configured on this server: with the person's connections they decide the
    # connected tools of a verified call, as of a text turn (``core.owner_context``).
    connectors: Connectors | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # Caps and usage tiers (``core.usage``): a person at the day's cap gets a short recorded message.
    usage: UsageConfig = field(default_factory=UsageConfig)
    # The backend pid of this process's call-control session (``voice.control``), recorded on each
    # call it holds so a status callback elsewhere reaches it; None when nothing listens.
    holder: int | None = None
    # A full-duplex model's delegated tasks run as Pepper turns (``voice.live_call``): the text
    # harness, built by the gateway (voice never imports it); None: no text model to run them.
    delegate: Delegate | None = None
    settle: Settle | None = None
    # The notice as audio Pepper plays itself (voice.notice); None: the model is asked to say it.
    notice_audio: NoticeAudio | None = None
    # Putting a caller through to the owner (``voice.transfer.Transfers``); None: never offered.
    transfers: Any = None

    def __post_init__(self) -> None:
        if self.tape_writer is None:
            self.tape_writer = TapeWriter(self.db)

    async def model_for_line(self, line_number: str | None) -> RealtimeModel | None:
        """The model for calls on this line: its own engine if it names one, else ``model``.
        Raises :class:`~voice.engines.EngineUnavailable` for an engine this build lacks."""
        if self.engines is None or line_number is None:
            return self.model
        engine = await call_records.line_engine(self.db, line_number)
        return self.model if engine is None else self.engines.get(engine)

    @property
    def filler_payload(self) -> str:
        return base64.b64encode(self.filler).decode()
