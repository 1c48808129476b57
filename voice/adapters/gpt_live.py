"""OpenAI GPT-Live through the official SDK's ``client.live`` websocket client.

A full-duplex model: it listens while it speaks and decides itself when to talk; there are no
responses to request and no audio-done event. It holds no tools: every task is delegated to Pepper
(client delegation), whose result goes back as context appends (``session.thinking.append`` /
``session.commentary.append``). Audio is ``audio/pcmu`` at 8 kHz both ways, so Twilio's base64
payloads pass through unchanged, on the same direct socket path as the Realtime adapter.

What the call engine asks of a response-based model maps here as: ``add_note`` -> a thinking
append, ``create_response(instructions)`` -> a commentary append (the model says it), a tool
output -> commentary for its delegation, in chunks of at most ~500 tokens. ``cancel_response``
and ``truncate`` do nothing: the model stops itself when talked over.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Iterator
from typing import Any

import orjson
from openai import OpenAIError
from openai.types.live.session_config_param import SessionConfigParam
from websockets.exceptions import WebSocketException

from core.models.voice_models import default_voice_model
from voice.adapters.openai_realtime import OpenAIRealtime, OpenAIRealtimeConnection
from voice.realtime import (
    AudioDelta,
    Delegated,
    ModelErrorEvent,
    Other,
    RealtimeDisconnected,
    RealtimeEvent,
    SessionConfig,
    TranscriptFragment,
)

log = logging.getLogger(__name__)

AUDIO_DELTA = "session.output_audio.delta"
_AUDIO_DELTA_NAME = b'"' + AUDIO_DELTA.encode() + b'"'
_APPEND_HEAD = '{"type":"session.input_audio.append","audio":"'
# A context append holds at most 500 tokens; at about four characters a token, with a margin.
CHUNK_CHARS = 1800
# Output that pauses this long has ended (there is no done event): the next audio starts a new
# stretch of speech, with its own item id for the engine's playback marks.
OUTPUT_GAP_S = 0.35
START_TIMEOUT_S = 10.0
# How the session ends on its own, as a drop the engine may reconnect from.
_DROPPED = frozenset({"expired", "connection_lost", "content", "server_error"})


# What session.start's session may hold (the server refuses any other field), from the SDK's types.
START_FIELDS = frozenset(SessionConfigParam.__annotations__)


def start_payload(config: SessionConfig, model: str) -> dict[str, Any]:
    """``session.start``'s session (strict on the server: only fields of the SDK's SessionConfigParam)."""
    session: dict[str, Any] = {
        "model": model,
        "instructions": config.instructions,
        "audio": {"format": {"type": "audio/pcmu", "rate": 8000}, "output": {"voice": config.voice}},
        "delegation": {"type": "client"},
    }
    if config.history:
        # At most 128 items; the newest kept.
        session["input"] = [
            {"type": "message", "role": role,
             "content": [{"type": "output_text" if role == "assistant" else "input_text", "text": text}]}
            for role, text in config.history[-128:]
        ]  # fmt: skip
    return session


def chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """``text`` in pieces of at most ``size`` characters, cut at a space where one is near."""
    text = text.strip()
    while len(text) > size:
        cut = text.rfind(" ", size // 2, size)
        cut = size if cut < 0 else cut
        yield text[:cut].strip()
        text = text[cut:].strip()
    if text:
        yield text


def _fragment(role: str, data: dict[str, Any]) -> TranscriptFragment:
    start = data.get("start_ms")
    end = data.get("end_ms")
    start = start if type(start) is int else 0
    return TranscriptFragment(role, str(data.get("delta") or ""), start, end if type(end) is int else start)


class GptLiveConnection(OpenAIRealtimeConnection):
    append_head = _APPEND_HEAD
    audio_delta = AUDIO_DELTA
    audio_delta_name = _AUDIO_DELTA_NAME

    def __init__(self, conn: Any, model: str):
        super().__init__(conn)
        self.model = model
        self.session_id: str | None = None
        self.expires_at: int | None = None
        self._events = 0
        self._segment = 0
        self._last_audio = 0.0
        # The audio deltas' event is built here (not a static function): it carries the stretch.
        self.audio_event = self._live_audio

    def _live_audio(self, data: dict[str, Any]) -> AudioDelta:
        now = time.monotonic()
        if now - self._last_audio > OUTPUT_GAP_S:
            self._segment += 1
        self._last_audio = now
        item = f"out{self._segment}"
        return AudioDelta(item, item, data.get("delta", ""))

    def break_output(self) -> None:
        """The next audio starts a new stretch of speech (the caller talked over this one)."""
        self._last_audio = 0.0

    def _next_id(self) -> str:
        self._events += 1
        return f"pepper_{self._events}"

    async def configure(self, config: SessionConfig) -> None:
        """The first call starts the session and waits for ``session.started``; later ones do
        nothing (instructions, voice and format cannot change after the start: a change of trust
        reaches the model as a note)."""
        if self.session_id is not None:
            return
        await self._send({"type": "session.start", "session": start_payload(config, self.model)})
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
                    raw = await self._recv()
                    try:
                        data = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(data, dict):
                        continue
                    if data.get("type") == "session.started":
                        session = data.get("session") or {}
                        self.session_id = str(session.get("id") or "")
                        expires = session.get("expires_at")
                        self.expires_at = expires if type(expires) is int else None
                        return
                    if data.get("type") == "error":
                        error = data.get("error") or {}
                        raise RealtimeDisconnected(f"GPT-Live refused the session: {error.get('code', 'error')}")
        except TimeoutError as exc:
            raise RealtimeDisconnected("GPT-Live never started the session") from exc
        except (WebSocketException, OSError, OpenAIError) as exc:
            raise RealtimeDisconnected("the GPT-Live socket failed while starting") from exc

    async def append_context(self, kind: str, content: str, delegation_id: str | None = None) -> list[str]:
        """``session.{kind}.append`` (thinking, commentary or instructions) in chunks; the event ids sent."""
        sent = []
        for piece in chunks(content):
            event_id = self._next_id()
            event: dict[str, Any] = {"type": f"session.{kind}.append", "event_id": event_id, "content": piece}
            if kind != "instructions":
                event["delegation_id"] = delegation_id
            await self._send(event)
            sent.append(event_id)
        return sent

    async def play_fixture(self, pcm24: bytes) -> str:
        """``session.output_audio.fixture.play``: one fixed clip (raw PCM16 24 kHz, at most 30 s)
        through the session's output; the model's speech is interrupted and its input muted and
        dropped while it plays. Its event id (``…fixture.played`` echoes it)."""
        event_id = self._next_id()
        await self._send({"type": "session.output_audio.fixture.play", "event_id": event_id,
                          "audio": base64.b64encode(pcm24).decode()})  # fmt: skip
        return event_id

    async def send_tool_output(self, call_id: str, output: str) -> None:
        await self.append_context("commentary", output, call_id)

    async def add_note(self, text: str) -> None:
        await self.append_context("thinking", text)

    async def create_response(self, instructions: str | None = None) -> None:
        if instructions:
            await self.append_context("commentary", instructions)

    async def cancel_response(self) -> None:
        return None  # the model stops itself when talked over

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        return None  # the model knows what it said; the caller heard less, which Pepper tracks

    async def close_session(self) -> None:
        await self._send({"type": "session.close"})

    def map_event(self, data: dict[str, Any]) -> RealtimeEvent:
        kind = data.get("type", "")
        if kind == AUDIO_DELTA:
            return self._live_audio(data)
        if kind == "session.input_transcript.delta":
            return _fragment("caller", data)
        if kind == "session.output_transcript.delta":
            return _fragment("pepper", data)
        if kind == "session.delegation.created":
            delegation = data.get("delegation")
            offset = data.get("offset_ms")
            if (isinstance(delegation, dict) and isinstance(delegation.get("id"), str) and delegation["id"]
                    and delegation.get("target", "client") == "client" and type(offset) is int):  # fmt: skip
                return Delegated(delegation["id"], offset)
            return Other("malformed", data)
        if kind == "session.closed":
            reason = str(data.get("reason") or "")
            if reason in _DROPPED:
                raise RealtimeDisconnected(f"GPT-Live closed the session: {reason}")
            return Other(kind, data)
        if kind == "error":
            error = data.get("error") or {}
            if not isinstance(error, dict):
                error = {}
            code = str(error.get("code") or error.get("type") or "error")
            return ModelErrorEvent(code, str(error.get("message", "")))
        return Other(kind, data)


class GptLive(OpenAIRealtime):
    """Connects one Live session per call, as the Realtime adapter does (the same SDK client, socket
    class and options). ``websocket_base_url`` follows the SDK."""

    name = "gpt-live"
    full_duplex = True

    def __init__(self, *, api_key: str, model: str = default_voice_model("gpt-live"), base_url: str | None = None,
                 websocket_base_url: str | None = None):  # fmt: skip
        super().__init__(api_key=api_key, model=model, base_url=base_url, websocket_base_url=websocket_base_url)

    def _manager(self, options: Any) -> Any:
        # The model goes in session.start, not the URL. No SDK-level reconnects: the engine
        # reconnects itself, with the transcript so far.
        return self._client.live.connect(websocket_connection_options=options, max_retries=0)

    def _session(self, conn: Any) -> GptLiveConnection:
        return GptLiveConnection(conn, self.model)
