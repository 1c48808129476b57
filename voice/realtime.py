"""One interface to a realtime voice model, whatever the provider.

A call session talks to a :class:`RealtimeConnection` and reads normalised events from it. Audio
in both directions is base64 G.711 mu-law at 8 kHz, exactly as Twilio carries it: an adapter for
a model that accepts mu-law passes it through; one that does not converts inside the adapter.

Events are plain slotted dataclasses (one per model event on the hot path).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import PepperError
from core.models.types import ToolSpec


class RealtimeError(PepperError):
    code = "realtime-failed"


class RealtimeDisconnected(RealtimeError):
    """The model's socket closed or failed; the session may reconnect."""

    code = "realtime-disconnected"

    def __init__(self, message: str, *, close_code: int | None = None):
        super().__init__(message, retryable=True)
        self.close_code = close_code


class RealtimeServerFailed(RealtimeDisconnected):
    """The model reported its own failure as an event (``ModelErrorEvent.server_side``): the call
    engine replaces the session as it would a dropped one. A call's tape holds the event, so a
    replay raises this again there, and no drop is recorded after it."""


@dataclass(frozen=True)
class SessionConfig:
    """What the model is told at the start and whenever the call's trust changes."""

    instructions: str
    tools: tuple[ToolSpec, ...]
    voice: str = "marin"
    # The conversation so far as (role, text), for a model that takes it at the start of a session
    # (GPT-Live's ``input``); given on a reconnect.
    history: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class SpeechStarted:
    item_id: str | None
    audio_start_ms: int | None


@dataclass(slots=True)
class SpeechStopped:
    item_id: str | None
    audio_end_ms: int | None = None  # where in the session's input audio the model heard it end


@dataclass(slots=True)
class AudioDelta:
    response_id: str
    item_id: str
    payload: str  # base64 mu-law 8 kHz


@dataclass(slots=True)
class AssistantTranscript:
    response_id: str
    item_id: str
    text: str


@dataclass(slots=True)
class UserTranscript:
    item_id: str
    text: str


@dataclass(slots=True)
class FunctionCall:
    response_id: str
    call_id: str
    name: str
    arguments: str  # JSON text as the model wrote it


@dataclass(slots=True)
class ResponseCreated:
    response_id: str


@dataclass(slots=True)
class ResponseDone:
    response_id: str
    status: str  # completed, cancelled, failed, incomplete
    function_calls: int = 0


@dataclass(slots=True)
class ModelErrorEvent:
    """The model reported an error on the session (an event, not an exception: see
    ``core.models.errors.ModelError`` for those)."""

    code: str
    message: str

    @property
    def server_side(self) -> bool:
        """The provider's own failure (its 5xx as an event): the session is not to be trusted
        any more, and the call engine replaces it as it would a dropped socket."""
        return self.code in SERVER_ERROR_CODES


# The error codes (or types, when the code is empty) a provider reports for its own failure.
SERVER_ERROR_CODES = frozenset({"server_error", "internal_error", "api_error", "overloaded_error", "unavailable"})


@dataclass(slots=True)
class TranscriptFragment:
    """A piece of a full-duplex model's running transcript (GPT-Live has no turns): ``role`` is
    ``caller`` or ``pepper``; times are on the model session's timeline (ms since it started)."""

    role: str
    text: str
    start_ms: int
    end_ms: int


@dataclass(slots=True)
class Delegated:
    """A full-duplex model handed a task to Pepper (metadata only: the task is what the caller said
    up to ``offset_ms`` on the session's timeline)."""

    delegation_id: str
    offset_ms: int


@dataclass(slots=True)
class Other:
    type: str
    data: dict[str, Any] = field(default_factory=dict)


RealtimeEvent = (
    SpeechStarted
    | SpeechStopped
    | AudioDelta
    | AssistantTranscript
    | UserTranscript
    | FunctionCall
    | ResponseCreated
    | ResponseDone
    | ModelErrorEvent
    | TranscriptFragment
    | Delegated
    | Other
)


class RealtimeConnection(Protocol):
    """One live model session. Methods raise :class:`RealtimeDisconnected` when the socket is gone."""

    async def configure(self, config: SessionConfig) -> None:
        """Set (or replace) instructions, tools and voice; turn detection stays on the server."""

    async def append_audio(self, payload: str) -> None:
        """Append base64 mu-law caller audio."""

    def append_audio_nowait(self, payload: str) -> bool:
        """Append it now if that needs no waiting (the hot path: every 20 ms per call); False when
        nothing was sent and :meth:`append_audio` must be awaited instead."""

    def deliver_audio_to(self, sink: Callable[[AudioDelta], bool]) -> None:
        """Optionally hand the model's audio to ``sink`` as it arrives, when :meth:`events` is
        waiting with nothing queued (so order is kept), instead of yielding it from
        :meth:`events`; ``sink`` returns False to refuse one, which then comes through
        :meth:`events`. An adapter may ignore this."""

    async def send_tool_output(self, call_id: str, output: str) -> None: ...

    async def add_note(self, text: str) -> None:
        """Add a runtime note to the conversation as context; starts no response."""

    async def create_response(self, instructions: str | None = None) -> None:
        """Ask for a response; ``instructions`` override the session's for this response only."""

    async def cancel_response(self) -> None: ...

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Cut an assistant item to what the caller heard."""

    def events(self) -> AsyncIterator[RealtimeEvent]:
        """Events in arrival order; ends by raising :class:`RealtimeDisconnected`."""


class RealtimeModel(Protocol):
    name: str

    def connect(self) -> AbstractAsyncContextManager[RealtimeConnection]: ...
