"""Calls held by media processes (``PEPPER_MEDIA_PROCESSES``): spread over them, ended by a status
callback the web server receives, recorded when their process dies, drained on shutdown.

The last test runs ``pepper serve`` as a user would (its own process, two media processes)
against a loopback Twilio caller, Twilio REST and OpenAI Realtime; the others check call control
in one process, where the notification and its durable fallback are easier to isolate.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from phone_support import LINE, NOTICE, OWNER, PUBLIC, TOKEN, _set_pin, until

from core import identity
from core.errors import StartupError
from core.store import Database
from core.testing.processes import alive, free_port, spawned_children, until_healthy
from core.testing.twilio_peer import TwilioPeer
from gateway.sockets import bind_shared
from voice.control import POLL_SECONDS, CallControl
from voice.testing.realtime_peer import RealtimePeer, speak
from voice.testing.twilio_caller import TwilioCaller

# --- the shared port ---------------------------------------------------------------------------------


def test_the_media_port_is_shared_by_media_processes_but_a_port_in_use_fails_at_once():
    first = bind_shared("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = bind_shared("127.0.0.1", port)  # what each media process does
    second.listen()
    with socket.create_connection(("127.0.0.1", port)):
        pass  # the listening one takes it; the reservation never listens
    second.close()
    first.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(StartupError, match="PEPPER_MEDIA_PORT"):
            bind_shared("127.0.0.1", taken.getsockname()[1])


# --- call control in one process -----------------------------------------------------------------


async def test_a_call_whose_end_was_recorded_without_a_notification_is_hung_up_by_the_poll(phone):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        holder = await phone.db.fetchval("SELECT held_by FROM calls WHERE call_sid = $1", answer.call_sid)
        assert holder == phone.calls.deps.holder and holder is not None
        # What a status callback records, without its pg_notify (a notification lost in transit).
        await phone.db.execute("UPDATE calls SET ended_at = now(), status = 'completed' WHERE call_sid = $1",
                               answer.call_sid)  # fmt: skip
        started = asyncio.get_running_loop().time()
        await call.wait(lambda: call.closed.is_set(), within=POLL_SECONDS + 5, what="the poll to hang up")
        assert asyncio.get_running_loop().time() - started <= POLL_SECONDS + 1
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"


async def test_a_holder_whose_listening_connection_dropped_claims_its_calls_again_and_still_hears(phone):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        old = await phone.db.fetchval("SELECT held_by FROM calls WHERE call_sid = $1", answer.call_sid)
        assert await phone.db.fetchval("SELECT pg_terminate_backend($1)", old)

        async def moved() -> Any:
            held_by = await phone.db.fetchval("SELECT held_by FROM calls WHERE call_sid = $1", answer.call_sid)
            return held_by not in (None, old) and held_by

        new = await until(moved, within=POLL_SECONDS + 5, what="the call held under the new session")
        assert new == phone.calls.deps.holder
        # Only the notification, no recorded end: the poll would not end this call, the listener does.
        await phone.db.execute("SELECT pg_notify('pepper_calls', $1)", answer.call_sid)
        await call.wait(lambda: call.closed.is_set(), within=POLL_SECONDS, what="the notification to hang up")
    assert (await phone.call_row(answer.call_sid))["end_reason"] == "hangup"


async def test_the_end_of_a_call_held_by_a_dead_process_is_written_once(phone, db: Database):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        turn_id = await db.fetchval("SELECT turn_id FROM calls WHERE call_sid = $1", answer.call_sid)
        # Another call, held by a process whose listening session no longer exists (pid 1 is never a backend).
        orphan_turn = await db.fetchval("INSERT INTO turns (conversation_id, channel, kind) SELECT conversation_id,"
                                        " channel, kind FROM turns WHERE id = $1 RETURNING id", turn_id)  # fmt: skip
        await db.execute(
            "INSERT INTO calls (call_sid, account_id, line_number, route, status, turn_id, held_by)"
            " VALUES ('CAorphan', $1, '+14155550100', 'owner', 'in-progress', $2, 1)",
            phone.account_id,
            orphan_turn,
        )
        patient = CallControl(phone.calls, db.dsn)
        assert await patient.end_orphans() == []  # suspected; its holder may yet reconnect
        sweepers = [CallControl(phone.calls, db.dsn, orphan_grace=0), CallControl(phone.calls, db.dsn, orphan_grace=0)]
        swept = await asyncio.gather(*(s.end_orphans() for s in sweepers))
        assert sorted(swept, key=len) == [[], ["CAorphan"]]  # once, whoever got there first
        row = await db.fetchrow("SELECT * FROM calls WHERE call_sid = 'CAorphan'")
        # Claimed under the sweeping process (all of them here share this process's holder).
        holder = phone.calls.deps.holder
        assert (row["status"], row["end_reason"], row["held_by"]) == ("completed", "process-died", holder)
        assert row["ended_at"] is not None and row["summary"]
        turn = await db.fetchrow("SELECT status, error FROM turns WHERE id = $1", orphan_turn)
        assert (turn["status"], turn["error"]) == ("failed", "process-died")
        # The live call, held by this (living) process, is left alone.
        assert await db.fetchval("SELECT summary FROM calls WHERE call_sid = $1", answer.call_sid) is None
        await call.hang_up()
    assert (await phone.call_row(answer.call_sid))["end_reason"] == "hangup"


# --- pepper serve with two media processes -------------------------------------------------------


async def _media_holders(db: Database) -> dict[int, int]:
    """Listening backend pid -> OS pid of each running media process."""
    rows = await db.fetch(
        "SELECT pid, application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pepper-media-%'"
    )
    return {r["pid"]: int(r["application_name"].split(" ")[1]) for r in rows}


async def _held_by(db: Database, call_sid: str) -> int | None:
    return await db.fetchval("SELECT held_by FROM calls WHERE call_sid = $1", call_sid)


async def _ended(db: Database, call_sid: str) -> Any:
    row = await db.fetchrow("SELECT * FROM calls WHERE call_sid = $1", call_sid)
    return row if row is not None and row["summary"] is not None else None


async def test_serve_spreads_calls_over_media_processes_and_controls_them_across_processes(
    db: Database, db_url: str, subprocess_env: dict[str, str], tmp_path: Path
):
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await _set_pin(db, ada.id)
    await identity.assign_line(db, LINE, "personal", ada.id)
    port, media = free_port(), free_port()
    async with TwilioPeer(auth_token=TOKEN) as twilio, RealtimePeer() as model:
        env = {
            **subprocess_env, "DATABASE_URL": db_url, "PEPPER_PUBLIC_URL": PUBLIC, "PEPPER_PORT": str(port),
            "PEPPER_MEDIA_PORT": str(media), "PEPPER_MEDIA_PROCESSES": "2", "PEPPER_TURN_WORKERS": "0",
            "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
            "PEPPER_TWILIO_API_URL": twilio.api_url, "OPENAI_API_KEY": "sk-test",
            "PEPPER_OPENAI_REALTIME_URL": model.websocket_url, "PEPPER_VOICE_NOTICE": NOTICE,
            "PEPPER_VOICE_NOTICE_AUDIO": "model",
            "PEPPER_GRACEFUL_TIMEOUT": "5", "PEPPER_SCHEDULER_ENABLED": "false", "PEPPER_MEMORY_JOBS_INTERVAL": "0",
        }  # fmt: skip
        caller = TwilioCaller(TOKEN, local=f"http://127.0.0.1:{port}", public=PUBLIC, account_sid=twilio.account_sid,
                              media_local=f"ws://127.0.0.1:{media}")  # fmt: skip
        with (tmp_path / "serve.log").open("w") as log_file:
            server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=log_file
            )
        calls = AsyncExitStack()
        open_calls: dict[str, Any] = {}

        async def place_call() -> str:
            """Dial, stream, and wait until the notice played and caller audio reaches the model."""
            model.script_session(speak(NOTICE, ms=300))
            answer = await caller.dial(from_=OWNER, to=LINE)
            assert answer.connected, answer.twiml
            call = await calls.enter_async_context(caller.media(answer))
            await call.wait(lambda: any(m.name.startswith("n") for m in call.marks), within=30, what="the notice")
            session = model.sessions[-1]
            await model.wait_for(lambda: bool(session.first_audio_at), within=30)
            open_calls[answer.call_sid] = call
            return answer.call_sid

        try:
            await until_healthy(f"http://127.0.0.1:{port}", 60)
            holders = await until(lambda: _two(_media_holders(db)), 90, "two media processes")
            assert set(holders.values()) == spawned_children(server.pid)

            # Calls land on both processes (SO_REUSEPORT hashes each connection to one of them).
            held: dict[str, int] = {}
            for _ in range(16):
                sid = await place_call()
                held[sid] = await _held_by(db, sid)
                if set(held.values()) == set(holders):
                    break
            assert set(held.values()) == set(holders), held

            # Twilio's status callback reaches the web server; the media process holding the call ends it.
            ended_sid = next(iter(held))
            assert await caller.status(ended_sid, "completed") == 204
            await open_calls[ended_sid].wait(lambda: open_calls[ended_sid].closed.is_set(), within=10,
                                             what="the holder to close the socket")  # fmt: skip
            row = await until(lambda: _ended(db, ended_sid), 10, "the call's records")
            assert row["end_reason"] == "hangup" and row["ended_at"] is not None
            turn = await db.fetchrow("SELECT status, reply FROM turns WHERE id = $1", row["turn_id"])
            assert turn["status"] == "delivered" and "ended: hangup" in turn["reply"]
            said = await db.fetchval("SELECT body FROM messages WHERE turn_id = $1 AND direction = 'outbound'",
                                     row["turn_id"])  # fmt: skip
            assert said is not None and NOTICE in said

            # A media process killed mid-call: restarted, its call's end written, the next call answered.
            victim_holder = held[next(sid for sid in held if sid != ended_sid)]
            victim = holders[victim_holder]
            os.kill(victim, signal.SIGKILL)
            for sid in [sid for sid, holder in held.items() if holder == victim_holder and sid != ended_sid]:
                dead = await until(lambda sid=sid: _ended(db, sid), 30, "the dead process's calls to be recorded")
                assert dead["end_reason"] == "process-died"
                assert await db.fetchval("SELECT status FROM turns WHERE id = $1", dead["turn_id"]) == "failed"
            restarted = await until(lambda: _two(_media_holders(db)), 60, "the media process to be restarted")
            assert victim not in restarted.values()
            assert set(restarted.values()) == spawned_children(server.pid)
            [newcomer] = set(restarted) - set(holders)
            for _ in range(16):  # until the kernel hands one to the new process
                if await _held_by(db, await place_call()) == newcomer:
                    break
            else:
                raise AssertionError("the restarted media process never answered a call")

            # Graceful shutdown: the calls still open are hung up and recorded, the processes stop.
            still_open = [sid for sid, call in open_calls.items() if not call.closed.is_set()]
            assert still_open
            server.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(server.wait(), 40)
            assert code == 0
            for sid in still_open:
                row = await _ended(db, sid)
                assert row is not None and row["end_reason"] == "shutdown", (sid, row and dict(row))
            assert not any(alive(pid) for pid in restarted.values())
        finally:
            if server.returncode is None:
                server.send_signal(signal.SIGTERM)
                await asyncio.wait_for(server.wait(), 60)
            await calls.aclose()


async def _two(holders_coro: Any) -> dict[int, int] | None:
    holders = await holders_coro
    return holders if len(holders) == 2 else None
