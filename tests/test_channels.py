"""A new text channel needs only the ``Channel`` interface: a pager channel written here, with no
gateway code of its own, is answered by the one pipeline (a real turn worker, Postgres and a
loopback model) and gets what every text channel gets: a duplicate delivery is one turn, a reply
that reached the person commits the turn's staged write, one that failed drops it, a reply
longer than the channel's limit goes out in parts, and an opted-out person gets no turn."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from core import identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.processes import until
from gateway.channels import Claimed, Delivery, Limits, delivered, failed, receive
from gateway.composition import build_turn_services
from gateway.services import Services
from gateway.worker import TurnWorker


class PagerChannel:
    """Pages the reply, twelve characters a page; ``refuse``: the pager network is down."""

    name = "cli"  # a message channel no other text channel answers on
    limits = Limits(reply_part_chars=12)

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.paged: list[tuple[str, UUID | None, list[str]]] = []

    def can_reply(self, claimed: Claimed) -> bool:
        return "pager" in claimed.meta

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        self.paged.append((claimed.meta["pager"], turn_id, parts))
        return failed("pager-offline") if self.refuse else delivered(status="paged")


async def answer_all(db: Database, db_url: str, channel: PagerChannel, *replies: Any) -> OpenAIPeer:
    """Run a turn worker that knows only ``channel`` until every queued message is answered."""
    async with OpenAIPeer() as model:
        model.script(*replies)
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url)
        async with build_turn_services(settings, db) as services:
            worker = TurnWorker(services, concurrency=1, poll_seconds=0.05, channels=[channel])
            await worker.start()
            try:

                async def answered() -> bool:
                    return not await db.fetchval(
                        "SELECT count(*) FROM messages WHERE handling IN ('queued', 'running')"
                    )

                await until(answered, 15, "every message answered")
            finally:
                await worker.stop(5)
    return model


async def todo_for(db: Database, account_id: UUID, title: str) -> int:
    return await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, $2) RETURNING id", account_id, title)


async def test_a_delivered_reply_commits_the_staged_write_and_a_duplicate_is_one_turn(db: Database, db_url: str):
    ada = await identity.create_account(db, "Ada")
    todo = await todo_for(db, ada.id, "book dentist")
    meta = {"pager": "ada-pager"}
    first, created = await receive(db, "cli", ada.id, "I booked the dentist", key="page-1", meta=meta)
    again, created_again = await receive(db, "cli", ada.id, "I booked the dentist", key="page-1", meta=meta)
    assert (created, created_again, again.id) == (True, False, first.id)
    channel = PagerChannel()
    await answer_all(
        db, db_url, channel, reply_tools(("complete_todo", {"id": todo})), reply_text("Dentist ticked off.")
    )
    [(pager, turn_id, parts)] = channel.paged
    assert pager == "ada-pager" and parts == ["Dentist", "ticked off."]  # split to the channel's limit
    assert await db.fetchval("SELECT count(*) FROM turns") == 1
    assert await db.fetchval("SELECT count(*) FROM messages WHERE direction = 'inbound'") == 1
    turn = await db.fetchrow("SELECT status, delivery FROM turns WHERE id = $1", turn_id)
    assert turn["status"] == "delivered" and '"paged"' in turn["delivery"]
    assert await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is not None
    assert await db.fetchval("SELECT handling FROM messages WHERE id = $1", first.id) == "done"


async def test_a_failed_delivery_drops_the_staged_write(db: Database, db_url: str):
    ada = await identity.create_account(db, "Ada")
    todo = await todo_for(db, ada.id, "pay rent")
    await receive(db, "cli", ada.id, "paid the rent", key="page-2", meta={"pager": "ada-pager"})
    channel = PagerChannel(refuse=True)
    await answer_all(db, db_url, channel, reply_tools(("complete_todo", {"id": todo})), reply_text("Rent ticked off."))
    [(_, turn_id, _)] = channel.paged
    turn = await db.fetchrow("SELECT status, delivery FROM turns WHERE id = $1", turn_id)
    assert turn["status"] == "failed" and '"pager-offline"' in turn["delivery"]
    assert await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is None
    assert await db.fetchval("SELECT status FROM staged_writes") == "dropped"


async def test_a_message_the_channel_cannot_answer_or_from_an_opted_out_handle_gets_no_turn(db: Database, db_url: str):
    ada = await identity.create_account(db, "Ada")
    await receive(db, "cli", ada.id, "no pager to answer on", key="page-3")
    # On a consent channel the pipeline itself checks the opt-out, for any channel that uses it.
    phone = await identity.add_handle(db, ada.id, "phone", "+14155552671", verified=True)
    await identity.set_consent(db, phone.id, ("sms",), opted_out=True, source="test")
    blocked, _ = await receive(db, "sms", ada.id, "hello?", key="SM-blocked", handle_id=phone.id, meta={"pager": "p"})
    channel = PagerChannel()
    model = await answer_all(db, db_url, channel)
    assert channel.paged == [] and model.requests == []
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    assert await db.fetchval("SELECT handling FROM messages WHERE id = $1", blocked.id) == "skipped"
