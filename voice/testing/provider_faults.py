"""Provider faults on calls (issue 31, suite 3): each realtime engine's loopback peer fails, and
the loopback Twilio caller listens for what Pepper plays.

For each engine (OpenAI Realtime, GPT-Live, Gemini Live), one call per fault:

* ``refused``: the model's handshake is refused (HTTP 503) when the call starts: Pepper opens a
  second session at once and the caller hears the notice;
* ``drop``: the model's socket is cut mid-call, the caller listening (no close frame): Pepper
  reconnects and the model apologises;
* ``error``: the model reports its own failure as an error event (OpenAI's and GPT-Live's
  ``server_error``; Gemini Live closes with 1011 "Internal error"): the same.

Each case measures, on the caller's side, the fault (the refusal, the cut, the event) to the first
media frame that is not silence; checks that the call went on (one reconnect in the call's record,
the ``pepper_call_model_reconnects`` counter, the socket open) and hangs up. The timed promise
(``HEARD_WITHIN_MS``) is the script's to check; the tests check only that the caller heard it.

Pepper runs in this process: ``serve(settings)`` is an async context manager that yields
``(http_port, media_port, voice_deps)`` (the gateway's ``running_app``, which this layer cannot
import).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.provider_faults import Case
from core.testing.twilio_peer import TwilioPeer
from voice.deps import VoiceDeps
from voice.testing.gemini_live_peer import GeminiLivePeer
from voice.testing.gpt_live_peer import GptLivePeer
from voice.testing.realtime_peer import RealtimePeer, speak
from voice.testing.twilio_caller import MediaCall, TwilioCaller

Serve = Callable[[Settings], AbstractAsyncContextManager[tuple[int, int, VoiceDeps]]]

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER = "+14155552671"
LINE = "+14155550100"
NOTICE = "Hi, this is Pepper. This call is transcribed."
SORRY = "Sorry, the line dropped for a moment. Where were we?"
ENGINES = ("openai-realtime", "gpt-live", "gemini-live")
FAULTS = ("refused", "drop", "error")


def reconnects(engine: str, outcome: str = "reconnected") -> float:
    from prometheus_client import REGISTRY

    from core.metrics import metrics

    metrics()
    value = REGISTRY.get_sample_value("pepper_call_model_reconnects_total", {"engine": engine, "outcome": outcome})
    return value or 0.0


class EngineFaults:
    """One engine's peer and a Pepper serving the owner's line on it."""

    def __init__(self, engine: str, db: Database, caller: TwilioCaller, peer: Any) -> None:
        self.engine = engine
        self.db = db
        self.caller = caller
        self.peer = peer

    async def run(self, faults: tuple[str, ...] = FAULTS) -> list[Case]:
        return [await self.case(fault) for fault in faults]

    def _script(self) -> None:
        if isinstance(self.peer, (RealtimePeer, GeminiLivePeer)):
            self.peer._responses.clear()
            self.peer.script(speak(NOTICE, ms=300), speak(SORRY, ms=300))

    async def case(self, fault: str) -> Case:
        case = Case(f"call {self.engine} {fault}")
        self._script()
        before = reconnects(self.engine)
        sessions = len(self.peer.sessions)
        at: float | None = None
        if fault == "refused":
            self.peer.refusals.refuse = 1
            refused = len(self.peer.refusals.refused_at)
        answer = await self.caller.dial(from_=OWNER, to=LINE)
        if not case.check(answer.connected, "the call was not connected to a stream"):
            return case
        async with self.caller.media(answer) as call:
            try:
                if fault == "refused":
                    await self._heard_notice(call)
                    case.check(len(self.peer.refusals.refused_at) == refused + 1, "no handshake was refused")
                    at = self.peer.refusals.refused_at[-1] if self.peer.refusals.refused_at else None
                else:
                    await self._heard_notice(call)
                    await asyncio.sleep(0.3)  # listening: what was said has played out
                    at = await self._inject(fault)
                    await self._wait(call, lambda: len(self.peer.sessions) > sessions + 1, "a second model session")
                if at is not None:
                    await self._wait(call, lambda: call.first_sound_after(at) is not None, "sound after the fault")
                    heard = call.first_sound_after(at)
                    if heard is not None:
                        case.heard_ms = (heard - at) * 1000
                case.check(not call.closed.is_set(), "the call ended")
            except AssertionError as exc:
                case.failures.append(f"{case.name}: {exc}")
            await call.hang_up()
        row = await self._call_row(answer.call_sid)
        if case.check(row is not None, "the call was never recorded as ended") and row is not None:
            stats = json.loads(row["stats"]) if isinstance(row["stats"], str) else row["stats"]
            case.check(stats.get("model_reconnects") == 1, f"model_reconnects {stats.get('model_reconnects')}, not 1")
            case.check(row["end_reason"] == "hangup", f"the call ended {row['end_reason']}, not by the hang-up")
        rose = reconnects(self.engine) - before
        case.check(rose == 1, f"pepper_call_model_reconnects{{outcome=reconnected}} rose by {rose}, not 1")
        return case

    async def _inject(self, fault: str) -> float:
        peer = self.peer
        if isinstance(peer, GptLivePeer):
            session = peer.sessions[-1]
            if fault == "drop":
                at = time.monotonic()
                await session.drop()
                return at
            return await session.server_error()
        if fault == "drop":
            return peer.cut()
        if isinstance(peer, GeminiLivePeer):  # Gemini Live reports its own failure by closing with 1011
            at = time.monotonic()
            await peer.drop()
            return at
        return await peer.server_error()

    async def _heard_notice(self, call: MediaCall) -> None:
        await self._wait(call, lambda: any(m.name.startswith("n") for m in call.marks), "the notice's mark")

    @staticmethod
    async def _wait(call: MediaCall, predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
        await call.wait(predicate, within=within, what=what)

    async def _call_row(self, call_sid: str) -> Any:
        for _ in range(1000):
            row = await self.db.fetchrow("SELECT * FROM calls WHERE call_sid = $1", call_sid)
            if row is not None and row["ended_at"] is not None and row["summary"] is not None:
                return row
            await asyncio.sleep(0.01)
        return None


async def owner_line(db: Database, engine: str) -> None:
    """The owner, their phone and their line, the line on ``engine`` (once per database)."""
    if await identity.find_line(db, LINE) is None:
        account = await identity.create_account(db, "Ada")
        await identity.add_handle(db, account.id, "phone", OWNER, verified=True)
        await identity.assign_line(db, LINE, "personal", account.id)
    await identity.set_line_engine(db, LINE, engine)


@asynccontextmanager
async def engine_faults(engine: str, db: Database, db_url: str, serve: Serve) -> AsyncIterator[EngineFaults]:
    """Pepper on ``db`` with the owner's line on ``engine`` and that engine's loopback peer."""
    async with AsyncExitStack() as stack:
        twilio = await stack.enter_async_context(TwilioPeer(auth_token=TOKEN))
        extra: dict[str, Any] = {}
        peer: Any
        if engine == "openai-realtime":
            peer = await stack.enter_async_context(RealtimePeer())
            extra["openai_realtime_url"] = peer.websocket_url
        elif engine == "gpt-live":
            peer = await stack.enter_async_context(GptLivePeer())
            text = await stack.enter_async_context(OpenAIPeer())
            extra |= {"gpt_live_url": peer.websocket_url, "openai_base_url": text.base_url}
        elif engine == "gemini-live":
            peer = await stack.enter_async_context(GeminiLivePeer())
            # The SDK trusts the peer's self-signed certificate as it would a corporate proxy's.
            stack.callback(_restore_env, "SSL_CERT_FILE", os.environ.get("SSL_CERT_FILE"))
            os.environ["SSL_CERT_FILE"] = str(peer.ca_file)
            extra |= {"gemini_api_key": peer.api_key, "gemini_base_url": peer.base_url}
        else:
            raise ValueError(f"no fault cases for the engine {engine!r}")
        await owner_line(db, engine)
        settings = Settings(database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                            twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-test",
                            voice_notice=NOTICE, voice_notice_audio="model", port=0, media_port=0,
                            graceful_timeout=2, memory_jobs_interval=0, **extra)  # fmt: skip
        port, media, deps = await stack.enter_async_context(serve(settings))
        deps.config = dataclasses.replace(deps.config, notice_timeout=5.0, closing_grace=3.0)
        caller = TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC, account_sid=twilio.account_sid,
                              media_local=f"ws://127.0.0.1:{media}")  # fmt: skip
        yield EngineFaults(engine, db, caller, peer)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
