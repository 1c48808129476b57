"""Provider faults on calls (issue 31, suite 3): each realtime engine's loopback peer fails, and
the loopback Twilio caller listens for what Pepper plays.

For each engine (OpenAI Realtime, GPT-Live, Gemini Live), one call per fault:

* ``refused``: the model's handshake is refused (HTTP 503) when the call starts: Pepper opens a
  second session at once and the caller hears the notice;
* ``drop``: the model's socket is cut mid-call, the caller listening (no close frame): Pepper
  reconnects and the model apologises;
* ``error``: the model reports its own failure as an error event (OpenAI's and GPT-Live's
  ``server_error``; Gemini Live closes with 1011 "Internal error"): the same.

On the cascade (speech to text, Pepper's text model, Deepgram speaking; the local speech models
loaded, so only the script runs it; one call without a fault first, to warm them), the model
peers are Deepgram's speak socket and the text model: ``refused`` refuses the speak socket at the
start and for the notice (piper says it), ``drop`` closes it with 1011 as the reply starts (piper
says the reply) and ``error`` is the text model's 503 on the caller's turn (the router fails over
to the tier's alternate, Anthropic here, and Deepgram speaks its reply).

With Pepper's own recording of the notice (piper; the script only), ``held`` holds the model's
handshake on OpenAI Realtime and Gemini Live: the notice plays while the session opens (the
first attempt ends at the engine's open timeout, ``VoiceConfig.model_open_timeout``, and the second opens).

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
from pathlib import Path
from typing import Any

from core import identity
from core.records import calls as call_records
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.provider_faults import Case, counted, failed_overs
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
REALTIME_ENGINES = ("openai-realtime", "gpt-live", "gemini-live")
ENGINES = (*REALTIME_ENGINES, "cascade")
FAULTS = ("refused", "drop", "error")
# With Pepper's own recording of the notice (``voice_notice_audio="local"``, piper): the handshake
# held (a provider that hangs), heard as the notice while the session opens. Not on GPT-Live,
# whose notice plays through the session (an audio fixture).
HELD_ENGINES = ("openai-realtime", "gemini-live")
HOLD_SECONDS = 30.0
DEEPGRAM_KEY = "dg-test"
SPEECH = Path(__file__).resolve().parent / "data"


def reconnects(engine: str, outcome: str = "reconnected") -> float:
    """``pepper_call_model_reconnects`` in this process so far."""
    return counted("pepper_call_model_reconnects", engine=engine, outcome=outcome)


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
        elif fault == "held":
            self.peer.refusals.hold = HOLD_SECONDS
        answer = await self.caller.dial(from_=OWNER, to=LINE)
        if not case.check(answer.connected, "the call was not connected to a stream"):
            return case
        async with self._listening(case, answer) as call:
            if fault == "refused":
                await self._heard_notice(call)
                case.check(len(self.peer.refusals.refused_at) == refused + 1, "no handshake was refused")
                at = self.peer.refusals.refused_at[-1] if self.peer.refusals.refused_at else None
            elif fault == "held":
                await self._wait(call, lambda: bool(self.peer.refusals.held_at), "the handshake held")
                at = self.peer.refusals.held_at[-1]
                # The first attempt times out (the engine's model_open_timeout), the second opens.
                await self._wait(call, lambda: len(self.peer.sessions) > sessions, "a model session", 30)
            else:
                await self._heard_notice(call)
                await asyncio.sleep(0.3)  # listening: what was said has played out
                quiet_since = time.monotonic() - 0.2
                at = await self._inject(fault)
                # Nothing sounded just before the fault: what is timed after it is the new session's.
                case.check(not [t for t in call.sounds if quiet_since <= t < at], "sound just before the fault")
                await self._wait(call, lambda: len(self.peer.sessions) > sessions + 1, "a second model session")
            if fault == "held" and at is not None:
                # The recording went out before the handshake began: heard from the fault on (0).
                await self._wait(call, lambda: bool(call.sounds), "the notice")
                case.heard_ms = max(0.0, call.sounds[0] - at) * 1000 if call.sounds else None
            elif at is not None:
                await self._heard_after(case, call, at, "sound after the fault")
        row = await self._ended(case, answer.call_sid)
        if row is not None:
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

    @asynccontextmanager
    async def _listening(self, case: Case, answer: Any) -> AsyncIterator[MediaCall]:
        """The call's media socket for the block; an AssertionError in it is the case's failure.
        After the block: the call is still open (checked), then hung up."""
        async with self.caller.media(answer) as call:
            try:
                yield call
                case.check(not call.closed.is_set(), "the call ended")
            except AssertionError as exc:
                case.failures.append(f"{case.name}: {exc}")
            await call.hang_up()

    async def _heard_after(self, case: Case, call: MediaCall, at: float, what: str, within: float = 10.0) -> None:
        """Wait for the caller's first sound after ``at`` (the fault); the case's ``heard_ms``."""
        await self._wait(call, lambda: call.first_sound_after(at) is not None, what, within)
        heard = call.first_sound_after(at)
        if heard is not None:
            case.heard_ms = (heard - at) * 1000

    async def _ended(self, case: Case, call_sid: str) -> Any:
        """The call's record once it ended; None (a failed check) if it never did."""
        row = await self._call_row(call_sid)
        case.check(row is not None, "the call was never recorded as ended")
        return row

    async def _call_row(self, call_sid: str) -> Any:
        for _ in range(1000):
            row = await call_records.call_row(self.db, call_sid)
            if row is not None and row["ended_at"] is not None and row["summary"] is not None:
                return row
            await asyncio.sleep(0.01)
        return None


class CascadeFaults(EngineFaults):
    """The cascade's model peers: Deepgram's speak socket and the text model (and its alternate)."""

    def __init__(self, db: Database, caller: TwilioCaller, deepgram: Any, text: OpenAIPeer, alternate: Any) -> None:
        super().__init__("cascade", db, caller, deepgram)
        self.text, self.alternate = text, alternate

    async def run(self, faults: tuple[str, ...] = FAULTS) -> list[Case]:
        await self.warm_up()
        return await super().run(faults)

    async def warm_up(self) -> None:
        """One call with no fault first: a process's first cascade call loads and warms its speech
        models (about 0.7 s more to the notice here), which a running server did long before."""
        from core.testing.peers import reply_text

        self.text.script(reply_text(NOTICE))
        answer = await self.caller.dial(from_=OWNER, to=LINE)
        async with self.caller.media(answer) as call:
            await self._wait(call, lambda: any(m.name.startswith("n") for m in call.marks), "the notice's mark", 30)
            await call.hang_up()
        await self._call_row(answer.call_sid)

    async def case(self, fault: str) -> Case:
        from core.testing.peers import fault as http_fault
        from core.testing.peers import reply_text

        case = Case(f"call cascade {fault}")
        deepgram = self.peer
        self.text.clear_script()
        self.alternate.clear_script()
        self.text.script(reply_text(NOTICE))
        failed_over = failed_overs("openai")
        refused = len(deepgram.speak_refused_at)
        if fault == "refused":
            deepgram.speak_refuse = 2  # the socket opened ahead at the start, and again for the notice
        elif fault == "drop":
            self.text.script(reply_text(SORRY))
        else:
            self.text.script(http_fault(503, "upstream overloaded"))
            self.alternate.script(reply_text(SORRY))
        answer = await self.caller.dial(from_=OWNER, to=LINE)
        if not case.check(answer.connected, "the call was not connected to a stream"):
            return case
        at: float | None = None
        async with self._listening(case, answer) as call:
            await self._wait(call, lambda: any(m.name.startswith("n") for m in call.marks), "the notice's mark", 30)
            if fault == "refused":
                got = deepgram.speak_refused_at[refused:]
                case.check(len(got) == 2, f"{len(got)} speak handshakes refused, not 2")
                at = got[0] if got else None  # from the first: the call's start
            else:
                if fault == "drop":
                    deepgram.speak_faults.append("close")
                asked = len(self.text.requests)
                call.say((SPEECH / "weather.ulaw").read_bytes())
                await self._wait(call, lambda: len(self.text.requests) > asked, "the caller's turn", 30)
                if fault == "drop":
                    await self._wait(call, lambda: bool(deepgram.speak_dropped_at), "the speak socket dropped", 30)
                    at = deepgram.speak_dropped_at[-1]
                else:
                    at = self.text.requests[-1].at
            if at is not None:
                await self._heard_after(case, call, at, "sound after it", 30)
        row = await self._ended(case, answer.call_sid)
        if row is not None:
            case.check(row["end_reason"] == "hangup", f"the call ended {row['end_reason']}, not by the hang-up")
        if fault == "error":
            rose = failed_overs("openai") - failed_over
            case.check(rose == 1, f"pepper_model_calls{{outcome=failed_over}} rose by {rose}, not 1")
            case.check(len(self.alternate.requests) >= 1, "the alternate was never asked")
        for name, peer in (("the text model", self.text), ("the alternate", self.alternate)):
            case.check(peer.pending == 0, f"{name} still holds {peer.pending} scripted replies")
        return case


async def owner_line(db: Database, engine: str) -> None:
    """The owner, their phone and their line, the line on ``engine`` (once per database)."""
    if await identity.find_line(db, LINE) is None:
        account = await identity.create_account(db, "Ada")
        await identity.add_handle(db, account.id, "phone", OWNER, verified=True)
        await identity.assign_line(db, LINE, "personal", account.id)
    await identity.set_line_engine(db, LINE, engine)


@asynccontextmanager
async def engine_faults(
    engine: str, db: Database, db_url: str, serve: Serve, *, notice_audio: str = "model"
) -> AsyncIterator[EngineFaults]:
    """Pepper on ``db`` with the owner's line on ``engine`` and that engine's loopback peer; the
    notice said by the model, or played from Pepper's own recording (``notice_audio="local"``)."""
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
        elif engine == "cascade":
            from core.testing.peers import AnthropicPeer
            from voice.adapters.cascade import local_speech
            from voice.testing.deepgram_peer import DeepgramPeer

            speech = local_speech()
            speech.tts.without_noise()

            def synthesize(text: str) -> tuple[bytes, int]:
                return speech.tts.pcm_sync(text), speech.tts.rate

            synthesize("Hello.")  # the peer's voice warmed up: its first sentence is not Pepper's time

            peer = await stack.enter_async_context(
                DeepgramPeer(transcribe=speech.stt.transcribe_sync, synthesize=synthesize, api_key=DEEPGRAM_KEY)
            )
            text = await stack.enter_async_context(OpenAIPeer())
            alternate = await stack.enter_async_context(AnthropicPeer())
            extra |= {"openai_base_url": text.base_url, "anthropic_api_key": "sk-ant-test",
                      "anthropic_base_url": alternate.base_url, "deepgram_api_key": DEEPGRAM_KEY,
                      "deepgram_api_url": peer.base_url, "voice_cascade_tts": "deepgram",
                      "scheduler_enabled": False}  # fmt: skip
        else:
            raise ValueError(f"no fault cases for the engine {engine!r}")
        await owner_line(db, engine)
        settings = Settings(database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                            twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-test",
                            voice_notice=NOTICE, voice_notice_audio=notice_audio, port=0, media_port=0,
                            graceful_timeout=2, memory_jobs_interval=0, **extra)  # fmt: skip
        port, media, deps = await stack.enter_async_context(serve(settings))
        deps.config = dataclasses.replace(deps.config, notice_timeout=5.0, closing_grace=3.0)
        caller = TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC, account_sid=twilio.account_sid,
                              media_local=f"ws://127.0.0.1:{media}")  # fmt: skip
        if engine == "cascade":
            yield CascadeFaults(db, caller, peer, text, alternate)
        else:
            yield EngineFaults(engine, db, caller, peer)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
