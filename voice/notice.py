"""The transcription notice as audio Pepper plays itself, so that the caller hearing it is a
guarantee of the engine, not an instruction to the model.

The notice is synthesised once per voice and text with the cascade's local TTS (piper, offline),
cached in the data dir (``notice-audio/<voice>-<sha256 of the text>.ulaw``, mu-law 8 kHz) and in
memory, and played before the model may speak:

* on Realtime, Gemini Live and the cascade, straight to Twilio (``media`` frames and a ``notice``
  mark); caller audio is forwarded to the model only once that mark comes back;
* on GPT-Live as ``session.output_audio.fixture.play`` (PCM16 24 kHz): the model's own speech is
  interrupted and its input muted while it plays; Pepper still forwards nothing until the mark
  after it comes back.

Without the local TTS (a build without the cascade, ``PEPPER_VOICE_NOTICE_AUDIO=model``, or a
synthesis that fails) the model is asked to say it, as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from voice.codec import audioop

log = logging.getLogger(__name__)

# Synthesises ``text`` as mu-law 8 kHz (blocking; run off the event loop).
Synthesise = Callable[[str], bytes]
CASCADE_MODULE = "voice.adapters.cascade"
# The voice the local TTS speaks in (part of the cache key: another voice is another recording).
LOCAL_VOICE = "piper-joe-medium"
FIXTURE_RATE = 24000
FIXTURE_MAX_SECONDS = 30


def local_synthesiser() -> Synthesise | None:
    """The cascade's piper voice (noise-free, so the recording is the same every time), or None
    when this build lacks it."""
    try:
        synthesise: Synthesise = importlib.import_module(CASCADE_MODULE).notice_mulaw
        return synthesise
    except ImportError:
        return None


def fixture_pcm(mulaw: bytes) -> bytes:
    """The notice as a GPT-Live audio fixture: raw mono PCM16 little-endian at 24 kHz, at most 30 s."""
    pcm, _ = audioop.ratecv(audioop.ulaw2lin(mulaw, 2), 2, 1, 8000, FIXTURE_RATE, None)
    return pcm[: FIXTURE_MAX_SECONDS * FIXTURE_RATE * 2]


class NoticeAudio:
    """The notice recordings of this server: ``directory`` holds them across restarts (None: in
    memory only)."""

    def __init__(self, directory: Path | None, synthesise: Synthesise | None, voice: str = LOCAL_VOICE):
        self.directory = directory
        self.synthesise = synthesise
        self.voice = voice
        self._memory: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self.synthesised = 0  # how many were made (not read back from the cache)

    def _key(self, text: str) -> str:
        voice = re.sub(r"[^A-Za-z0-9_.-]", "_", self.voice)
        return f"{voice}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"

    async def mulaw(self, text: str) -> bytes | None:
        """The notice as mu-law 8 kHz, from the cache or synthesised now; None without a TTS or
        when synthesis fails (the model says it instead)."""
        key = self._key(text)
        if key in self._memory:
            return self._memory[key]
        if self.synthesise is None:
            return None
        async with self._lock:
            if key in self._memory:
                return self._memory[key]
            audio = await asyncio.to_thread(self._load_or_make, key, text)
            if audio:
                self._memory[key] = audio
            return audio or None

    def _load_or_make(self, key: str, text: str) -> bytes:
        path = self.directory / f"{key}.ulaw" if self.directory is not None else None
        if path is not None and path.is_file():
            return path.read_bytes()
        assert self.synthesise is not None
        try:
            audio = self.synthesise(text)
        except Exception:
            log.exception("could not synthesise the call notice; the model will say it")
            return b""
        self.synthesised += 1
        if path is not None and audio:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(audio)
                os.replace(tmp, path)  # never a half-written recording under the real name
            except OSError:
                log.warning("could not cache the call notice audio in %s", path.parent)
        return audio
