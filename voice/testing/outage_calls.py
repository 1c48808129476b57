"""The calls of the Postgres-restart suite (``core.testing.postgres_restart``): calls in progress
on one ``pepper serve`` while its database is down.

Each call is placed and connected before the outage (the notice played, the caller's audio
reaching the loopback Realtime model). While Postgres is stopped, every caller speaks: the
caller's audio must keep reaching the model and the model's spoken answer must keep reaching the
caller (audio both ways), and the socket stays open. The transcript lines of that exchange are
written while the database is down, so they wait (``voice.engine``: retried until it is back).
Once it is back the calls hang up, and each call's record must be written once: the call
completed, its turn delivered, the line the caller said during the outage recorded once and the
model's answer once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from core.store import Database
from core.testing.postgres_restart import call_outcome, calls_settled
from core.testing.processes import until_or_false
from voice.testing.realtime_peer import PeerSession, speak, tone
from voice.testing.suite_calls import NOTICE, SuiteCalls
from voice.testing.twilio_caller import MediaCall, TwilioCaller

HEARD = "Are you still there?"
ANSWER = "Still here, go on."
AUDIO_IN = 4000  # half a second of the caller's mu-law reaching the model
AUDIO_OUT = 4000  # half a second of the model's answer reaching the caller


@dataclass
class _Call:
    call: MediaCall
    session: PeerSession
    kept: bool = False


class OutageCalls(SuiteCalls):
    """``async with OutageCalls(20) as calls: await run(..., side=calls)``."""

    def __init__(self, count: int = 20) -> None:
        super().__init__()
        self.count = count
        self._calls: list[_Call] = []

    @property
    def kept(self) -> int:
        return sum(c.kept for c in self._calls)

    async def place(self, served: Any) -> list[tuple[bool, str]]:
        """Place the calls, one after another (each its own model session); a check per call."""
        caller = TwilioCaller(served.token, local=served.web, public=served.public, account_sid=served.account_sid,
                              media_local=served.media)  # fmt: skip
        checks = []
        for _ in range(self.count):
            self._model.script_session(speak(NOTICE, ms=300), speak(ANSWER, ms=1200), heard=(HEARD,))
            answer = await caller.dial(from_=served.owner, to=served.line)
            if not answer.connected:
                checks.append((False, f"a call was not connected: {answer.twiml[:200]}"))
                continue
            sessions = len(self._model.sessions)
            call = await self._stack.enter_async_context(caller.media(answer))
            try:
                session = await self.connected(call, sessions, within=30)
            except AssertionError as exc:
                checks.append((False, f"a call never connected: {exc}"))
                continue
            self._calls.append(_Call(call, session))
            checks.append((True, "a call connected"))
        return checks

    async def during_outage(self, within: float = 15) -> list[tuple[bool, str]]:
        """While the database is down: each caller speaks and is answered; audio both ways."""
        start_in = {id(c): len(c.session.audio_in) for c in self._calls}
        start_out = {id(c): c.call.received_media_bytes for c in self._calls}
        for c in self._calls:
            c.call.say(tone(600))  # heard as HEARD; then the model answers with ANSWER

        def grew(c: _Call) -> tuple[int, int]:
            return len(c.session.audio_in) - start_in[id(c)], c.call.received_media_bytes - start_out[id(c)]

        await until_or_false(lambda: all(i >= AUDIO_IN and o >= AUDIO_OUT for i, o in map(grew, self._calls)), within)
        checks = []
        for c in self._calls:
            into, out = grew(c)
            c.kept = into >= AUDIO_IN and out >= AUDIO_OUT and not c.call.closed.is_set()
            checks.append((c.kept, f"a call's audio went on during the outage ({into} bytes to the model, {out} back)"))
        return checks

    async def end(self, db: Database, within: float = 90) -> list[tuple[bool, str]]:
        """Once the database is back: hang up; each call's record written once."""
        for c in self._calls:
            await c.call.hang_up()
        sids = [c.call.call_sid for c in self._calls]
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            done = await calls_settled(db, sids)
            if done >= len(sids):
                break
            await asyncio.sleep(0.2)
        checks = []
        for c in self._calls:
            sid = c.call.call_sid
            row = await call_outcome(db, sid, HEARD, ANSWER)
            ok = (
                row is not None
                and (row["status"], row["turn_status"]) == ("completed", "delivered")
                and (row["heard"], row["answered"]) == (1, 1)
            )
            checks.append((ok, f"a call's records after the outage: {row}"))
            c.kept = c.kept and ok
        return checks
