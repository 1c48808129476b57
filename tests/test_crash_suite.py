"""Crash (issue 31, suite 1), the case that fits the CI budget, and the reconciliation it needs.

A real ``pepper serve`` whose turn worker is killed between Twilio taking a reply and Pepper
recording its MessageSid: the worker that replaces it finds the reply's ``sending`` row in Twilio's
message list and takes it as sent, not sending it twice (``core.testing.crash``'s checks, from the
outside: the loopback Twilio and the store). ``scripts/suite-crash`` runs every case: the whole
server killed in that window, a turn worker killed mid-turn, the scheduler mid-run, the web server
mid-webhook and a media process mid-call too.

In one process: a reply a dead worker left ``sending`` is looked up at Twilio: taken as sent when
there, sent once when not, and marked ``sent-unknown`` (not sent again) when the list cannot be read."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from uuid import UUID

from core import identity
from core.conversation import SENT_UNKNOWN, UNSENT, claim_turn, open_turn, record_inbound, record_outbound
from core.settings import Settings
from core.store import Database
from core.testing.crash import run
from core.testing.peers import OpenAIPeer
from core.testing.processes import alive, until
from core.testing.twilio_peer import SentMessage, TwilioPeer
from gateway.server import running_app


async def test_a_worker_killed_between_twilio_taking_a_reply_and_its_record_sends_it_once(
    db_url: str, subprocess_env: dict[str, str]
):
    result = await run(cases=["send-worker"], dsn=db_url, base_env=subprocess_env)
    assert not result.failures, result.summary() + "\n" + "\n".join(result.failures)
    assert (result.lost, result.double_sends, result.double_posts) == (0, 0, 0), result.summary()
    assert result.cases >= 9, result.summary()  # every check of the case ran, and the final ones


# --- a reply a crash left 'sending', in one process ------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
LINE = "+14155550100"


async def _cut_short_while_sending(db: Database, number: str, reply: str) -> tuple[UUID, int]:
    """What a worker killed while Twilio held its send leaves: the text claimed by a dead backend,
    its turn ``replied``, the reply recorded ``sending`` with no MessageSid. The turn and the row."""
    account = await identity.create_account(db, f"P{number[-4:]}")
    handle = await identity.add_handle(db, account.id, "phone", number, verified=True)
    meta = {"from": number, "to": LINE}
    message, _ = await record_inbound(db, account.id, "sms", "hello?", provider_message_id=f"SM{number[-4:]}",
                                      handle_id=handle.id, handling="queued", meta=meta)  # fmt: skip
    await claim_turn(db, 99999)  # a backend pid no live session has
    opened = await open_turn(db, account.id, channel="sms", inbound_message_ids=[message.id])
    await db.execute("UPDATE turns SET status = 'replied', reply = $2 WHERE id = $1", opened.turn_id, reply)
    row = await record_outbound(db, opened.conversation_id, "sms", reply, turn_id=opened.turn_id,
                                delivery_status=UNSENT)  # fmt: skip
    return opened.turn_id, row.id


def _settings(db_url: str, twilio: TwilioPeer, model: OpenAIPeer) -> Settings:
    return Settings(database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid,
                    twilio_auth_token=TOKEN, twilio_api_url=twilio.api_url, openai_api_key="sk-test",
                    openai_base_url=model.base_url, port=0)  # fmt: skip


async def _answered(db: Database) -> None:
    async def done() -> bool:
        return not await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'inbound' AND handling <> 'done'")

    await until(done, 30, "the texts a crash left to be answered")


async def test_a_reply_left_sending_is_looked_up_at_twilio_taken_as_sent_if_there_else_sent_once(
    db: Database, db_url: str
):
    took, lost = "+14155552671", "+14155552672"
    took_turn, took_row = await _cut_short_while_sending(db, took, "It reached Twilio.")
    lost_turn, lost_row = await _cut_short_while_sending(db, lost, "It never left.")
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        # Twilio took the first before the crash (and delivered it), after the row was recorded;
        # an earlier one with the same words (recorded already, within the clock slack) is not it.
        for sid, at, status in (("SMolder", time.time() - 30, "delivered"), ("SMtook", time.time(), "delivered")):
            twilio.sent.append(SentMessage(sid, took, LINE, "It reached Twilio.", None, twilio.account_sid, None,
                                           received_at=at, status=status))  # fmt: skip
        await db.execute("INSERT INTO messages (conversation_id, channel, direction, body, provider_message_id)"
                         " SELECT conversation_id, 'sms', 'outbound', body, 'SMolder' FROM messages WHERE id = $1",
                         took_row)  # fmt: skip
        async with running_app(_settings(db_url, twilio, model), db):
            await _answered(db)
            resent = await _one_more(twilio, 2)
        assert model.requests == []  # neither turn ran again
    assert (resent.to, resent.body) == (lost, "It never left.")
    assert len(twilio.sent) == 3 and twilio.lists == 2
    row = await db.fetchrow("SELECT provider_message_id, delivery_status FROM messages WHERE id = $1", took_row)
    assert (row["provider_message_id"], row["delivery_status"]) == ("SMtook", "delivered")
    assert await db.fetchval("SELECT status FROM turns WHERE id = $1", took_turn) == "delivered"
    row = await db.fetchrow("SELECT provider_message_id, delivery_status FROM messages WHERE id = $1", lost_row)
    assert (row["provider_message_id"], row["delivery_status"]) == (resent.sid, "queued")
    assert await db.fetchval("SELECT status FROM turns WHERE id = $1", lost_turn) == "replied"  # its receipt settles it


async def _one_more(twilio: TwilioPeer, already: int) -> SentMessage:
    await twilio.wait_for_sent(already + 1, within=30)
    return twilio.sent[already]


async def test_a_reply_left_sending_when_twilios_list_cannot_be_read_is_not_sent_again(db: Database, db_url: str):
    turn, row_id = await _cut_short_while_sending(db, "+14155552673", "Maybe it went.")
    # And one a crash left long ago, its text marked answered (before replies were looked up):
    # resolved when the worker starts, not left 'sending' for ever.
    old_turn, old_row = await _cut_short_while_sending(db, "+14155552674", "Long ago.")
    await db.execute("UPDATE messages SET handling = 'done' WHERE turn_id = $1 AND direction = 'inbound'", old_turn)
    await db.execute("UPDATE messages SET created_at = now() - interval '20 minutes' WHERE id = $1", old_row)
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        twilio.fail_lists(1)
        async with running_app(_settings(db_url, twilio, model), db):
            await _answered(db)

            async def old_resolved() -> bool:
                return await db.fetchval("SELECT status FROM turns WHERE id = $1", old_turn) == "failed"

            await until(old_resolved, 30, "the old reply's turn to be settled")
        assert twilio.sent == [] and twilio.lists == 1  # the old one is not looked up: its text is answered
    for row, record in ((row_id, turn), (old_row, old_turn)):
        assert await db.fetchval("SELECT delivery_status FROM messages WHERE id = $1", row) == SENT_UNKNOWN
        settled = await db.fetchrow("SELECT status, delivery::text AS delivery FROM turns WHERE id = $1", record)
        assert settled["status"] == "failed" and "sent-unknown" in settled["delivery"]


# --- a child whose server was killed while it was still starting ----------------------------------

_PARENT = """
import multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])

def child(ready_file):
    time.sleep(1.0)  # still importing when the server dies: its parent is init by now
    import asyncio
    from gateway.children import ChildStop

    async def main():
        stop = ChildStop()
        open(ready_file, "w").write(str(os.getppid()))
        await stop.stopped("test child")

    asyncio.run(main())

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    p = multiprocessing.Process(target=child, args=(sys.argv[2],))
    p.start()
    print(p.pid, flush=True)
    os._exit(0)  # as SIGKILL leaves it: no join, no stop
"""


async def test_a_child_whose_server_died_before_it_was_up_still_stops(tmp_path):
    script, ready = tmp_path / "parent.py", tmp_path / "ready"
    script.write_text(_PARENT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(ROOT), str(ready), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    child = int((await proc.stdout.readline()).strip())
    await proc.wait()
    await until(ready.exists, 60, "the child to start")
    assert ready.read_text() != str(proc.pid)  # it started after its parent was gone
    await until(lambda: not alive(child), 30, "the orphaned child to stop")
