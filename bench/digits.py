"""What pressing a menu's keys costs a call Pepper placed (``send_digits``, ``voice.digits``).

A call placed through the loopback Twilio to a task's approved number, answered; the scripted
realtime model presses ``1``; the stream closes; the loopback Twilio asks the ``<Connect action>``
and opens the new stream from its TwiML. Figures, per call, on loopback (no network, no model
time, Twilio's own part not counted):

* **close**: the tool's output reached the model -> Pepper closed the media socket;
* **action**: the ``<Connect action>`` request -> its ``<Play digits>`` answer (the closed
  stream's records awaited, the call reopened, a token issued). Baseline: the same request after a
  stream that ended with ``end_call`` (answered ``<Hangup/>``), on the same calls;
* **open**: the TwiML in hand -> the new stream's model session configured (``session.update``
  at the model). Baseline: the same for the call's first stream.

    PYTHONPATH=. .venv/bin/python bench/digits.py [--calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from datetime import UTC, datetime

from core import identity
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.settings import Settings
from core.store import Database
from core.testing.figures import ms_figures
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.twilio_peer import TwilioPeer
from gateway.media_server import media_port
from gateway.server import running_app
from voice.testing.realtime_peer import RealtimePeer, call_tool, speak
from voice.testing.twilio_caller import Answer, TwilioCaller, parse_twiml

TOKEN = "bench-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE, MENU = "+14155552671", "+14155550100", "+14155559999"


def _answer(sid: str, text: str) -> Answer:
    parsed = parse_twiml(text)
    return Answer(200, text, sid, parsed.get("stream_url"), parsed.get("parameters", {}), action=parsed.get("action"))


async def _configured(model: RealtimePeer, index: int) -> None:
    await model.wait_for(lambda: len(model.sessions) > index and "session.update" in model.sessions[index].types())


async def _one(services, twilio: TwilioPeer, model: RealtimePeer, caller: TwilioCaller, task_id: int, account_id,
               figures: dict[str, list[float]]) -> None:  # fmt: skip
    model.script(speak("Hi.", ms=20), call_tool("send_digits", {"digits": "1"}), speak("", ms=0),
                 call_tool("end_call"), speak("", ms=0))  # fmt: skip
    count = len(twilio.calls)
    await services.calls.outbound.deliver(account_id, task_id=task_id, run_id=None, key=None, brief="A table for two.")
    placed = (await twilio.wait_for_calls(count + 1))[count]
    _, text = await twilio.answer_call(caller.local, PUBLIC, placed, "human")
    first = _answer(placed.sid, text)
    index = len(model.sessions)
    async with caller.media(first) as call:
        began = time.perf_counter()
        await _configured(model, index)
        figures["open, first stream"].append((time.perf_counter() - began) * 1000)
        await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), what="the notice mark")
        session = model.sessions[index]
        await model.respond(index)
        await model.wait_for(lambda: session.tool_outputs)
        began = time.perf_counter()
        await call.wait(lambda: call.closed.is_set(), what="the stream closing")
        figures["close"].append((time.perf_counter() - began) * 1000)
    began = time.perf_counter()
    _, text = await twilio.stream_ended(caller.local, PUBLIC, placed, first.action)
    figures["action: <Play digits> + new stream"].append((time.perf_counter() - began) * 1000)
    assert placed.digits_heard == ["1"], placed.digits_heard
    second = _answer(placed.sid, text)
    async with caller.media(second) as call:
        began = time.perf_counter()
        await _configured(model, index + 1)
        figures["open, stream after the keys"].append((time.perf_counter() - began) * 1000)
        await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), what="the notice mark")
        session = model.sessions[index + 1]
        await model.respond(index + 1)  # end_call
        await call.wait(lambda: call.closed.is_set(), what="the stream closing")
    began = time.perf_counter()
    _, text = await twilio.stream_ended(caller.local, PUBLIC, placed, second.action)
    figures["baseline action: <Hangup/>"].append((time.perf_counter() - began) * 1000)
    assert "Hangup" in text and "Stream" not in text, text


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url)
        try:
            account = await identity.create_account(db, "Bench", timezone="UTC")
            await identity.add_handle(db, account.id, "phone", OWNER, verified=True)
            await identity.assign_line(db, LINE, "personal", account.id)
            now = datetime.now(UTC)
            async with db.transaction() as conn:
                task = await create_task(conn, account.id, title="Book", prompt="Book a table.", now=now,
                                         schedule=parse_schedule("in 1 minute", now=now, timezone="UTC"),
                                         deliver_to=("call",))  # fmt: skip
            await db.execute("UPDATE scheduled_tasks SET call_number = $2, call_approved = true WHERE id = $1",
                             task.id, MENU)  # fmt: skip
            async with TwilioPeer(auth_token=TOKEN) as twilio, RealtimePeer() as model:
                settings = Settings(database_url=url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                                    twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-bench",
                                    openai_realtime_url=model.websocket_url, voice_notice="Hi, this is Pepper.",
                                    voice_notice_audio="model", port=0, media_port=0, graceful_timeout=2,
                                    scheduler_enabled=False)  # fmt: skip
                async with running_app(settings, db) as (app, port):
                    services = app.extensions["pepper"]
                    deps = services.calls.deps
                    deps.config = dataclasses.replace(deps.config, closing_grace=3.0)
                    caller = TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC,
                                          account_sid=twilio.account_sid,
                                          media_local=f"ws://127.0.0.1:{media_port(services.media)}")  # fmt: skip
                    figures: dict[str, list[float]] = {
                        "close": [], "action: <Play digits> + new stream": [], "baseline action: <Hangup/>": [],
                        "open, stream after the keys": [], "open, first stream": [],
                    }  # fmt: skip
                    print(f"{args.calls} calls, one press each, loopback Twilio and model, embedded Postgres,"
                          f" {datetime.now(UTC):%Y-%m-%d}")  # fmt: skip
                    for _ in range(args.calls):
                        await _one(services, twilio, model, caller, task.id, account.id, figures)
                    for label, values in figures.items():
                        print(f"{label:<38} {ms_figures(values)}")
        finally:
            await db.close()


if __name__ == "__main__":
    asyncio.run(main())
