"""The calls of the two-server suite (``core.testing.two_servers``): phone calls whose media socket
lands on the other server than their webhook, placed before one server is killed.

Each call's webhook goes to one server and its media socket to the other's media port (they share
the database and the secret key, so the stream's token and the call's record are good on both).
A call is connected when the notice played (its mark came back) and the caller's audio reaches
the loopback Realtime model. After the kill, the calls held by the survivor go on: the caller's
audio keeps reaching the model and the socket stays open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.testing.processes import until_or_false
from voice.testing.realtime_peer import PeerSession, speak
from voice.testing.suite_calls import NOTICE, SuiteCalls
from voice.testing.twilio_caller import MediaCall, TwilioCaller

AUDIO_GROWS = 8000  # one second of the caller's mu-law reaching the model


@dataclass
class _Call:
    call: MediaCall
    session: PeerSession
    media_on: int | None  # which server holds it (None: through the load balancer)


class TwoServerCalls(SuiteCalls):
    """``async with TwoServerCalls(per_direction=2) as calls: await run(..., side=calls)``."""

    def __init__(self, per_direction: int = 2, through_front: int = 2) -> None:
        super().__init__()
        self.per_direction = per_direction
        self.through_front = through_front
        self._calls: list[_Call] = []

    async def before_kill(self, servers: Any) -> list[tuple[bool, str]]:
        """Place the calls, crossing servers both ways; a check per call: it connected. First a few
        through the load balancer (webhook and media socket both through Caddy), hung up after."""
        checks = []
        front = TwilioCaller(servers.token, local=servers.front, public=servers.public,
                             account_sid=servers.account_sid)  # fmt: skip
        for _ in range(self.through_front):
            checks.append(await self._place(front, servers, None))
        for placed in self._calls:
            await placed.call.hang_up()
        self._calls.clear()
        for webhook_on in (0, 1):
            media_on = 1 - webhook_on
            caller = TwilioCaller(servers.token, local=servers.webs[webhook_on], public=servers.public,
                                  account_sid=servers.account_sid, media_local=servers.medias[media_on])  # fmt: skip
            for _ in range(self.per_direction):
                checks.append(await self._place(caller, servers, media_on))
        return checks

    async def _place(self, caller: TwilioCaller, servers: Any, media_on: int | None) -> tuple[bool, str]:
        what = (f"a call with its webhook on server {1 - media_on} and media on server {media_on}"
                if media_on is not None else "a call through the load balancer")  # fmt: skip
        self._model.script_session(speak(NOTICE, ms=300))
        answer = await caller.dial(from_=servers.owner, to=servers.line)
        if not answer.connected:
            return False, f"{what} was not connected: {answer.twiml[:200]}"
        sessions = len(self._model.sessions)
        call = await self._stack.enter_async_context(caller.media(answer))
        try:
            session = await self.connected(call, sessions, within=30)
        except AssertionError as exc:
            return False, f"{what} never connected: {exc}"
        self._calls.append(_Call(call, session, media_on))
        return True, what

    async def after_kill(self, survivor: int, within: float = 20) -> list[tuple[bool, str]]:
        """The survivor's calls go on: open, and the caller's audio still reaching the model."""
        checks = []
        mine = [c for c in self._calls if c.media_on == survivor]
        start = {id(c): len(c.session.audio_in) for c in mine}
        await until_or_false(lambda: all(len(c.session.audio_in) - start[id(c)] >= AUDIO_GROWS for c in mine), within)
        for c in mine:
            grew = len(c.session.audio_in) - start[id(c)]
            ok = grew >= AUDIO_GROWS and not c.call.closed.is_set()
            checks.append((ok, f"a call on the survivor went on after the kill ({grew} bytes reached the model)"))
        for c in mine:
            await c.call.hang_up()
        return checks
