"""What the fault suites' calls share (``voice.testing.crash_calls``, ``outage_calls``,
``two_server_calls``): one loopback Realtime model that says the notice, the settings that point
``pepper serve`` at it, and the wait for a call placed through the loopback Twilio caller to
connect.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Self

from voice.testing.realtime_peer import PeerSession, RealtimePeer
from voice.testing.twilio_caller import MediaCall

NOTICE = "Hi, this is Pepper. This call is transcribed."


class SuiteCalls:
    """``async with`` it: the model peer runs, ``env`` holds the server's settings for it, and
    what a subclass enters on ``_stack`` is closed on the way out."""

    def __init__(self) -> None:
        self._model = RealtimePeer()
        self._stack = AsyncExitStack()
        self.env: dict[str, str] = {}

    async def __aenter__(self) -> Self:
        await self._stack.enter_async_context(self._model)
        self.env = {"PEPPER_OPENAI_REALTIME_URL": self._model.websocket_url, "PEPPER_VOICE_NOTICE": NOTICE,
                    "PEPPER_VOICE_NOTICE_AUDIO": "model"}  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def connected(self, call: MediaCall, sessions: int, within: float) -> PeerSession:
        """Wait until the call's notice played (its mark came back) and the caller's audio reached
        a model session opened after the first ``sessions``; return that session. AssertionError
        when time runs out."""
        await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=within, what="the notice")
        await self._model.wait_for(
            lambda: len(self._model.sessions) > sessions and bool(self._model.sessions[-1].first_audio_at),
            within=within,
        )
        return self._model.sessions[-1]
