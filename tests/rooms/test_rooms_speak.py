"""When Pepper speaks in a room, against a real Synapse: decided in code before any model call."""

from __future__ import annotations

from rooms_support import handling, make_room, member, pepper_posts_seen_by, until

from core.records import rooms
from core.testing.scripted import reply


async def test_a_name_in_passing_gets_no_turn_and_a_mention_reply_or_follow_up_does(
    db, homeserver, pepper, follower, models, clock
):
    setup = await make_room(db, homeserver, pepper, follower, "Ada", "Bob")
    ada, bob, room = setup.members["Ada"], setup.members["Bob"], setup.room
    passing = await ada.say(room, "pepper would know, but never mind, Bob what do you think?")
    await until(follower, lambda: _stored(db, passing))
    assert await handling(db, passing) == ("skipped", "not-addressed")
    assert models.received == []  # no model call at all

    models.script(reply("The market opens at 9."))
    asked = await ada.say(room, "when does the market open?", mention=pepper.user_id)
    await until(follower, lambda: _answered(db, asked))
    assert await handling(db, asked) == ("answered", "mention")
    prompt = models.prompts[0].messages[-1].content
    assert "when does the market open?" in prompt and "[room messages;" in prompt
    assert await pepper_posts_seen_by(bob.client, room, pepper.user_id) == ["The market opens at 9."]

    # Ada follows up soon after: a turn; Bob, whom Pepper did not answer, does not get one.
    models.script(reply("NO_REPLY"))
    follow = await ada.say(room, "and on Sundays?")
    other = await bob.say(room, "I'll drive")
    await until(follower, lambda: _answered(db, follow))
    assert await handling(db, follow) == ("answered", "silent")  # the model chose to say nothing
    assert await handling(db, other) == ("skipped", "not-addressed")
    assert len(await pepper_posts_seen_by(bob.client, room, pepper.user_id)) == 1  # nothing posted for silence

    # Outside the window a plain message is not a follow-up; a reply to Pepper's post is addressed.
    clock.advance(minutes=10)
    late = await ada.say(room, "ok thanks")
    await until(follower, lambda: _stored(db, late))
    assert await handling(db, late) == ("skipped", "not-addressed")
    pepper_post = await db.fetchval("SELECT event_id FROM room_posts WHERE event_id IS NOT NULL")
    models.script(reply("Sundays: 10 to 2."))
    replied = await bob.say(room, "is that every day?", reply_to=pepper_post)
    await until(follower, lambda: _answered(db, replied))
    assert await handling(db, replied) == ("answered", "reply")


async def test_another_agent_is_answered_only_when_it_mentions_pepper_and_never_in_a_loop(
    db, homeserver, pepper, follower, models
):
    setup = await make_room(db, homeserver, pepper, follower, "Ada", outsiders=("Bot",))
    ada, bot, room = setup.members["Ada"], setup.members["Bot"], setup.room
    models.default = reply("Noted.")
    ignored = await bot.say(room, "Daily digest: 3 new items")
    mentions = [await bot.say(room, f"hey {pepper.user_id} round {i}", mention=pepper.user_id) for i in range(6)]
    await until(follower, lambda: _all_done(db, [ignored, *mentions]))
    assert await handling(db, ignored) == ("skipped", "agent-not-mentioning")
    answered = [await handling(db, e) for e in mentions]
    assert [h for h in answered if h == ("answered", "agent-mention")] == [("answered", "agent-mention")] * 3
    assert len(models.received) == 3  # the cap is code: no model call past it
    # A member writing starts the count again.
    models.script(reply("Hi Ada."))
    await ada.say(room, "hello all")
    again = await bot.say(room, f"{pepper.user_id} still there?", mention=pepper.user_id)
    await until(follower, lambda: _answered(db, again))
    assert await handling(db, again) == ("answered", "agent-mention")


async def _stored(db, event_id):
    return await handling(db, event_id) is not None


async def _answered(db, event_id):
    found = await handling(db, event_id)
    return found is not None and found[0] == "answered"


async def _all_done(db, event_ids):
    for e in event_ids:
        found = await handling(db, e)
        if found is None or found[0] == "queued":
            return False
    return True


async def test_pepper_joins_a_room_a_linked_member_invites_it_to_and_declines_anyone_else(
    db, homeserver, pepper, follower, models
):
    await follower.step(timeout_ms=0)
    ada = await member(db, homeserver, "Ada")
    mallory = await member(db, homeserver, "Mallory", linked=False)
    ours = await ada.client.create_room("Book club", [])
    await ada.client.send_text(ours, f"{pepper.user_id} before you came", "early", mention=pepper.user_id)
    await ada.client.invite(ours, pepper.user_id)
    theirs = await mallory.client.create_room("Free stuff", [pepper.user_id])

    async def joined() -> bool:
        return (
            await ada.client.membership(ours, pepper.user_id) == "join"
            and await mallory.client.membership(theirs, pepper.user_id) == "leave"  # declined
        )

    await until(follower, joined)
    room = await rooms.room_by_matrix_id(db, ours)
    assert room is not None and room.name == "Book club"
    assert [m.account_id for m in await rooms.members(db, room.id)] == [ada.account.id]
    assert await rooms.room_by_matrix_id(db, theirs) is None

    models.script(reply("Hello, book club."))
    asked = await ada.say(room, "what shall we read?", mention=pepper.user_id)
    await until(follower, lambda: _answered(db, asked))
    assert await pepper_posts_seen_by(ada.client, room, pepper.user_id) == ["Hello, book club."]
    early = await db.fetchrow("SELECT handling, reason FROM room_events WHERE body LIKE '%before you came'")
    assert (early["handling"], early["reason"]) == ("skipped", "history")  # sent before Pepper followed
    assert len(models.prompts) == 1
