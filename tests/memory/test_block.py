"""The memory block: its order, the today-never-cut rule, exchanges across channels, and who sees it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from memory_kit import NOW, conversation, say, summary

from core.conversation import record_inbound
from core.memory import NO_MEMORY, MemoryConfig, build_memory_block
from core.memory.exchanges import split_exchanges
from core.testing.scripted import reply
from text_loop import HarnessDeps, run_turn


@dataclass
class M:
    created_at: datetime
    channel: str
    direction: str = "inbound"
    body: str = "x"


def test_exchanges_split_on_pauses_not_on_channels() -> None:
    t = datetime(2025, 6, 3, 9, 0, tzinfo=UTC)
    messages = [
        M(t, "email", body="Can you find a plumber?"),
        M(t + timedelta(minutes=20), "sms", body="For Thursday, I mean"),  # a texted follow-up
        M(t + timedelta(minutes=21), "sms", "outbound", "On it."),
        M(t + timedelta(hours=20), "sms", body="Any luck?"),  # the next morning
        M(t + timedelta(hours=20, minutes=5), "voice", "outbound", "Yes, Tuesday."),
    ]
    exchanges = split_exchanges(reversed(messages), timedelta(minutes=30))
    assert [len(e.messages) for e in exchanges] == [3, 2]
    assert exchanges[0].channels == ("email", "sms") and exchanges[1].channels == ("sms", "voice")
    # Exactly the gap is still one exchange; one second more is two.
    edge = [M(t, "sms"), M(t + timedelta(minutes=30), "email"), M(t + timedelta(minutes=60, seconds=1), "sms")]
    assert [len(e.messages) for e in split_exchanges(edge, timedelta(minutes=30))] == [2, 1]


async def test_block_order_coverage_and_today_never_cut(db, ada) -> None:
    conv = await conversation(db, ada.id)
    config = MemoryConfig(block_older_messages=3, block_older_message_chars=40)
    # Summaries: April (month), the week of 26 May (overlaps nothing of April), 2 June (day),
    # and a day inside that week, which the week already covers.
    await summary(db, ada.id, "month", date(2025, 4, 1), "APRIL-SUMMARY")
    await summary(db, ada.id, "week", date(2025, 5, 26), "WEEK-SUMMARY")
    await summary(db, ada.id, "day", date(2025, 5, 28), "DAY-INSIDE-WEEK")
    await summary(db, ada.id, "day", date(2025, 6, 2), "JUNE-2-SUMMARY")
    # Covered messages never appear; 3 June has no summary yet, so its messages do (newest 3).
    await say(db, ada.id, datetime(2025, 6, 2, 10, tzinfo=UTC), "covered by the June 2 summary")
    for n in range(5):
        await say(db, ada.id, datetime(2025, 6, 3, 8, n, tzinfo=UTC), f"uncovered {n} " + "y" * 80)
    long_today = "Today " + "z" * 2000
    await say(db, ada.id, datetime(2025, 6, 4, 6, 0, tzinfo=UTC), long_today, channel="email")
    for n in range(10):  # more than block_older_messages: all of today stays
        await say(db, ada.id, datetime(2025, 6, 4, 9, n, tzinfo=UTC), f"today-{n}", channel="web")
    answering = await say(db, ada.id, datetime(2025, 6, 4, 12, 59, tzinfo=UTC), "the message being answered")

    block = await build_memory_block(
        db, ada.id, conv, "Europe/Paris", NOW, config=config, exclude_message_ids=[answering]
    )
    order = ["APRIL-SUMMARY", "WEEK-SUMMARY", "JUNE-2-SUMMARY", "uncovered 2", "uncovered 4", "Today ", "today-9"]
    positions = [block.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert "DAY-INSIDE-WEEK" not in block
    assert "covered by the June 2 summary" not in block
    assert "uncovered 0" not in block and "uncovered 1" not in block and "earlier ones are left out" in block
    assert "y" * 80 not in block  # older messages are trimmed
    assert long_today in block  # today's are never cut
    assert all(f"today-{n}" in block for n in range(10))
    assert "the message being answered" not in block
    # Today's messages sit in exchanges split by time, across channels.
    assert "Exchange, Wed 4 Jun 2025, 08:00 (email):" in block
    assert "Exchange, Wed 4 Jun 2025, 11:00-11:09 (web):" in block


async def test_block_without_history_says_it_is_the_start(db, ada) -> None:
    block = await build_memory_block(db, ada.id, await conversation(db, ada.id), "Europe/Paris", NOW)
    assert block == "Memory: this is the start of the conversation."


async def test_only_verified_owner_sessions_get_the_block(db, ada, models) -> None:
    await summary(db, ada.id, "day", date(2025, 6, 3), "SECRET-SUMMARY: door code 4411")
    deps = HarnessDeps(db=db, models=models, clock=lambda: NOW)
    message, _ = await record_inbound(db, ada.id, "web", "hi")
    models.script(reply("Hello."), reply("Hello."), reply("Hello."), reply("Hello."))
    await run_turn(deps, ada.id, "web", "hi", inbound_message_ids=[message.id])
    await run_turn(deps, ada.id, "voice", "hi", kind="call", trust="owner_unverified")
    await run_turn(deps, ada.id, "voice", "hi", kind="call", trust="third_party")
    await run_turn(deps, ada.id, "web", "hi", kind="room")
    owner, unverified, caller, room = models.prompts
    assert "SECRET-SUMMARY" in owner.system_dynamic
    for prompt in (unverified, caller, room):
        assert prompt.system_dynamic == NO_MEMORY
        assert "4411" not in prompt.system_stable + prompt.system_dynamic
    assert "search_memory" in {t.name for t in owner.tools}
    assert all("search_memory" not in {t.name for t in p.tools} for p in (unverified, caller, room))
