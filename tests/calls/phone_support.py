"""Shared pieces of the phone-call tests, imported by name (a conftest cannot be imported twice).

Phone calls end to end: a loopback Twilio caller and a loopback OpenAI Realtime server, Pepper on
a real uvicorn socket over a fresh database, the realtime model reached through the openai SDK."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.smtp_capture import SmtpCapture
from core.testing.twilio_peer import TwilioPeer
from gateway.media_server import media_port
from voice.testing.realtime_peer import RealtimePeer
from voice.testing.twilio_caller import MediaCall, TwilioCaller

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER = "+14155552671"
LINE = "+14155550100"
ANSWERING_LINE = "+14155550101"
STRANGER = "+14155559999"
PIN = "2468"
NOTICE = "Hi, this is Pepper. This call is transcribed."

SPEECH = Path(__file__).resolve().parents[2] / "voice" / "testing" / "data"


_PIN_HASH: list[str] = []


async def _set_pin(db: Database, account_id: Any) -> None:
    """The owner's PIN, hashed once per run (argon2id takes about a second on a busy machine)."""
    if not _PIN_HASH:
        _PIN_HASH.append(identity.hash_pin(PIN))
    await db.execute("UPDATE accounts SET pin_hash = $2 WHERE id = $1", account_id, _PIN_HASH[0])


async def until(predicate: Any, within: float = 10.0, what: str = "the condition") -> Any:
    """Poll an async predicate until it returns something truthy, and return that."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never saw {what}")
        await asyncio.sleep(0.02)


async def verify_by_keypad(phone: Phone, call: MediaCall, pin: str = PIN) -> None:
    """Key the PIN in and wait for the model session to be reconfigured for the verified caller."""
    session = phone.model.sessions[-1]
    updates = len([e for e in session.events if e["type"] == "session.update"])
    await call.keypad(pin + "#")
    await phone.model.wait_for(lambda: len([e for e in session.events if e["type"] == "session.update"]) > updates)


async def first_tool_output(phone: Phone, call: MediaCall, audio: bytes) -> str:
    """Once the notice played, the caller says ``audio``: the output of the first tool call it leads to."""
    await phone.until_listening(call)
    call.say(audio)
    session = phone.model.sessions[0]
    await phone.model.wait_for(lambda: session.tool_outputs, within=15)
    return str(session.tool_outputs[0]["output"])


def workday(days_ahead: int = 3) -> date:
    """A weekday at least ``days_ahead`` days from now (UTC): inside the default booking hours."""
    day = datetime.now(UTC).date() + timedelta(days=days_ahead)
    while day.weekday() >= 5:
        day += timedelta(days=1)
    return day


def speech(name: str) -> bytes:
    """Real speech (espeak-ng), 8 kHz mu-law; regenerate with scripts/voice-fixtures."""
    return (SPEECH / f"{name}.ulaw").read_bytes()


@dataclass
class Phone:
    db: Database
    twilio: TwilioPeer
    model: RealtimePeer
    caller: TwilioCaller
    services: Any
    account_id: Any
    handle_id: Any
    smtp: SmtpCapture | None = None

    @property
    def calls(self) -> Any:
        return self.services.calls

    def tune(self, **changes: Any) -> None:
        """Shorten the call's timers for a test (the VoiceConfig the service uses)."""
        deps = self.services.calls.deps
        deps.config = dataclasses.replace(deps.config, **changes)

    async def dial_owner(self, **extra: str):
        answer = await self.caller.dial(from_=OWNER, to=LINE, **extra)
        assert answer.connected, answer.twiml
        return answer

    async def until_listening(self, call: MediaCall) -> None:
        """The notice played and its mark came back: Pepper now passes audio to the model."""
        await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), what="the notice mark")
        await self.model.wait_for(lambda: bool(self.model.sessions) and self.model.sessions[-1].first_audio_at)

    async def call_row(self, call_sid: str) -> Any:
        for _ in range(500):
            row = await self.db.fetchrow("SELECT * FROM calls WHERE call_sid = $1", call_sid)
            if row is not None and row["ended_at"] is not None and row["summary"] is not None:
                return row
            await asyncio.sleep(0.01)
        raise AssertionError("the call was never recorded as ended")


def call_settings(db_url: str, twilio: TwilioPeer, **extra: Any) -> Settings:
    """Pepper's settings for a call test: the Twilio peer, the notice, a free port."""
    extra.setdefault("voice_notice_audio", "model")  # the notice tests (test_notice.py) play it themselves
    return Settings(database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                    twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-test",
                    voice_notice=NOTICE, port=0, media_port=0, graceful_timeout=2, **extra)  # fmt: skip


def caller_for(app: Any, port: int, twilio: TwilioPeer) -> TwilioCaller:
    """A loopback Twilio caller for a running Pepper: webhooks to its HTTP port, media to its media port."""
    media = media_port(app.extensions["pepper"].media)
    return TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC, account_sid=twilio.account_sid,
                        media_local=f"ws://127.0.0.1:{media}")  # fmt: skip


async def scrape(caller: TwilioCaller) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Pepper's ``/metrics`` (the server the caller dials), sample by (name, labels)."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(caller.local + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def grown(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def scrape_after_call(caller: TwilioCaller, before: dict[Any, float]) -> dict[Any, float]:
    """``/metrics`` once a call more has ended than in ``before`` (its figures are added as its
    engine finishes, just after its record is written)."""

    def ended(samples: dict[Any, float]) -> float:
        return sum(v for (name, _), v in samples.items() if name == "pepper_calls_ended_total")

    for _ in range(200):
        after = await scrape(caller)
        if ended(after) > ended(before):
            return after
        await asyncio.sleep(0.025)
    raise AssertionError("the call's end never reached /metrics")


def normalised(text: str) -> str:
    """Words only: lower case, no punctuation (how a transcript is compared with the text spoken)."""
    import re

    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


async def transcribed(mulaw: bytes) -> str:
    """8 kHz mu-law as the cascade's local Whisper hears it (loaded on first use)."""
    from voice.adapters.cascade import local_speech
    from voice.codec import audioop

    return await asyncio.to_thread(local_speech().stt.transcribe_sync, audioop.ulaw2lin(mulaw, 2))
