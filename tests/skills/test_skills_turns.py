"""Skills in real turns: the router and OpenAI adapter talk to a loopback OpenAI that plays the model."""

from __future__ import annotations

import logging

from skill_support import make_catalog, outputs, tool_names, turn_record, user_texts

from core.testing.peers import ScriptedCall, reply_text, reply_tools
from text_loop import HarnessConfig, run_turn


def use(name: str, **args) -> ScriptedCall:
    return ScriptedCall("use_skill", {"name": name, **args})


async def test_the_prompt_lists_skills_and_activating_an_inline_skill_returns_its_steps(db, deps, peer, account):
    peer.script(
        reply_tools(use("tidy-todos")),
        reply_tools(("list_todos", {})),
        reply_text("You have no open todos, so nothing to drop."),
    )
    outcome = await run_turn(deps, account.id, "web", "help me tidy my todos")

    first, second, _ = peer.requests
    assert "- tidy-todos: Look over the open todos and suggest what to drop." in first.body["instructions"]
    use_skill = next(t for t in first.body["tools"] if t["name"] == "use_skill")
    # Only skills whose tool sets are installed are offered: email has no tools here.
    assert use_skill["parameters"]["properties"]["name"]["enum"] == [
        "agenda",
        "deep-review",
        "quick-look",
        "tidy-todos",
    ]
    assert "email-digest" not in first.body["instructions"]
    assert "1. List the open todos." not in first.body["instructions"]  # steps load only on activation
    assert outputs(second)[0].startswith("The skill tidy-todos is active. Follow its steps now")
    assert "1. List the open todos.\n2. Suggest which to drop." in outputs(second)[0]
    assert outcome.status == "replied" and outcome.reply.startswith("You have no open todos")

    record = await turn_record(db, outcome.turn_id)
    skills = record["skills"]
    assert [a["skill"] for a in skills["activations"]] == ["tidy-todos"]
    assert skills["activations"][0]["kind"] == "inline"
    assert skills["flags"] == []  # the required todos step was taken


async def test_activating_a_skill_that_does_not_exist_runs_nothing_and_says_which_exist(db, deps, peer, account):
    peer.script(reply_tools(use("book-flight")), reply_text("I can't book flights."))
    outcome = await run_turn(deps, account.id, "web", "book me a flight")

    result = outputs(peer.requests[1])[0]
    assert result.startswith("There is no skill named 'book-flight'. Nothing ran.")
    assert "agenda, deep-review, quick-look, tidy-todos" in result
    record = await turn_record(db, outcome.turn_id)
    assert record["rounds"][0]["counted"] is False  # like an unknown tool, the round is free
    assert record["skills"]["activations"] == []


async def test_an_inline_skill_moves_the_rest_of_the_turn_to_a_larger_tier_and_raises_the_cap(db, deps, peer, account):
    deps.config = HarnessConfig(round_caps={"live": 2})
    peer.script(
        reply_tools(use("deep-review")),
        reply_tools(("list_todos", {})),
        reply_tools(("search_notes", {"query": "plan"})),
        reply_text("Review: nothing open, no notes about the plan."),
    )
    outcome = await run_turn(deps, account.id, "web", "give me a careful review")

    assert [r.body["model"] for r in peer.requests] == ["gpt-small", "gpt-large", "gpt-large", "gpt-large"]
    assert "The rest of this turn runs on the large model tier." in outputs(peer.requests[1])[0]
    # With the live cap of 2 the third round would have been the capped summary; the skill raised it to 4.
    assert outcome.status == "replied" and outcome.rounds == 4
    assert "tools" in peer.requests[2].body and "tools" in peer.requests[3].body
    record = await turn_record(db, outcome.turn_id)
    assert record["tier"] == "large"
    activation = record["skills"]["activations"][0]
    assert activation["tier"] == {"asked": "large", "from": "small", "result": "raised"}
    assert activation["rounds"] == {"asked": 4, "from": 2, "result": "raised"}
    assert [r["tier"] for r in record["rounds"]] == ["small", "large", "large", "large"]


async def test_an_inline_skill_cannot_lower_the_tier_or_the_round_cap(db, deps, peer, account):
    peer.script(
        reply_tools(use("quick-look")),
        reply_tools(("list_todos", {})),
        reply_tools(("search_notes", {"query": "a"})),
        reply_tools(("search_notes", {"query": "b"})),
        reply_text("Done looking."),
    )
    outcome = await run_turn(deps, account.id, "web", "have a quick look", tier="medium")

    assert {r.body["model"] for r in peer.requests} == {"gpt-medium"}
    # The skill asked for 3 rounds; the turn's cap of 8 stands, so the fifth generation still has tools.
    assert outcome.status == "replied" and outcome.rounds == 5
    assert "tools" in peer.requests[4].body
    assert "model tier" not in outputs(peer.requests[1])[0]
    record = await turn_record(db, outcome.turn_id)
    activation = record["skills"]["activations"][0]
    assert activation["tier"] == {"asked": "small", "from": "medium", "result": "refused-lower"}
    assert activation["rounds"] == {"asked": 3, "from": 8, "result": "refused-lower"}
    assert record["tier"] == "medium"


async def test_a_worker_sees_only_its_tools_and_its_report_is_the_reply(db, deps, peer, account):
    peer.script(
        reply_tools(use("agenda", request="what is on today")),
        # The worker tries a tool outside its sets and to start another worker; neither exists for it.
        reply_tools(("list_events", {"day": "monday"}), ("add_todo", {"title": "x"}), use("tidy-todos")),
        reply_text("Today: 09:00 Dentist (Dr Wu), 14:00 Design review."),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on today?")

    orchestrator, worker, worker_2 = peer.requests
    # Calendar tools sit behind the worker: the orchestrator cannot see or call them.
    assert "list_events" not in tool_names(orchestrator) and "use_skill" in tool_names(orchestrator)
    assert tool_names(worker) == ["find_free_time", "list_events", "ask_user", "hand_back"]
    assert (
        "Skill agenda: Say what is on the calendar on a day.\nSteps:\n1. List the events"
        in (worker.body["instructions"])
    )
    assert "Request from Pepper's main assistant: what is on today" in user_texts(worker)[0]
    assert "what's on today?" in user_texts(worker)[0]
    results = outputs(worker_2)
    assert results[0].startswith("09:00-09:30 Dentist")
    assert results[1].startswith("Unknown tool 'add_todo'") and results[2].startswith("Unknown tool 'use_skill'")
    assert await db.fetchval("SELECT count(*) FROM todos") == 0

    # Direct report: the worker's report is the reply, with no further generation.
    assert outcome.reply == "Today: 09:00 Dentist (Dr Wu), 14:00 Design review."
    assert len(peer.requests) == 3 and peer.pending == 0
    record = await turn_record(db, outcome.turn_id)
    skills = record["skills"]
    assert skills["ended_by"] == "direct_report"
    assert [(w["skill"], w["run"], w["status"]) for w in skills["workers"]] == [("agenda", 1, "replied")]
    assert [c["name"] for c in record["tool_calls"]] == ["list_events", "add_todo", "use_skill", "use_skill"]
    assert skills["flags"] == []


async def test_with_more_to_do_the_report_comes_back_to_the_orchestrator(db, deps, peer, account):
    peer.script(
        reply_tools(use("agenda", request="today", more_to_do=True)),
        reply_tools(("list_events", {})),
        reply_text("09:00 Dentist, 14:00 Design review."),
        reply_tools(("add_todo", {"title": "buy floss"})),
        reply_text("Two events today; I added 'buy floss' to your todos."),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on today, and add buy floss to my todos")

    assert outputs(peer.requests[3])[0] == (
        "Report from the agenda worker (use it in your reply):\n09:00 Dentist, 14:00 Design review."
    )
    assert outcome.reply == "Two events today; I added 'buy floss' to your todos."
    assert (await turn_record(db, outcome.turn_id))["skills"]["ended_by"] is None


async def test_a_worker_hands_back_once_and_the_second_run_does_not_see_hand_back(db, deps, peer, account):
    await db.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'Dentist is Dr Wu, on Mondays')", account.id)
    peer.script(
        reply_tools(use("agenda", request="is the dentist today?")),
        reply_tools(ScriptedCall("hand_back", {"need": "the name of the person's dentist"})),
        reply_tools(("search_notes", {"query": "dentist"})),
        reply_tools(use("agenda", request="is the dentist today?", details="Dentist is Dr Wu, on Mondays")),
        # The second run tries hand_back anyway: it is not there.
        reply_tools(ScriptedCall("hand_back", {"need": "more"}), ("list_events", {})),
        reply_text("Yes: Dr Wu at 09:00 today."),
    )
    outcome = await run_turn(deps, account.id, "web", "is the dentist today?")

    first_run, back, _, second_run, second_run_2 = (peer.requests[i] for i in (1, 2, 3, 4, 5))
    assert "hand_back" in tool_names(first_run) and "hand_back" in first_run.body["instructions"]
    assert outputs(back)[0].startswith(
        "The agenda worker stopped: it needs something its tools cannot get: the name of the person's dentist"
    )
    assert "hand_back" not in tool_names(second_run) and "hand_back" not in second_run.body["instructions"]
    assert "Dentist is Dr Wu, on Mondays" in user_texts(second_run)[0]
    assert outputs(second_run_2)[0].startswith("Unknown tool 'hand_back'")
    assert outcome.reply == "Yes: Dr Wu at 09:00 today."
    skills = (await turn_record(db, outcome.turn_id))["skills"]
    assert [(w["run"], w["status"]) for w in skills["workers"]] == [(1, "handed-back"), (2, "replied")]
    assert skills["ended_by"] == "direct_report"


async def test_a_worker_runs_again_only_to_finish_a_hand_back(db, deps, peer, account):
    peer.script(
        reply_tools(use("agenda", more_to_do=True)),
        reply_text("09:00 Dentist."),
        reply_tools(use("agenda", request="again")),
        reply_text("You have the dentist at 09:00."),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on?")
    assert "already ran in this turn" in outputs(peer.requests[3])[-1]
    assert outcome.reply == "You have the dentist at 09:00."


async def test_ask_the_user_ends_the_run_and_the_answer_starts_a_new_turn(db, deps, peer, account):
    peer.script(
        reply_tools(use("agenda", request="which day?")),
        reply_tools(ScriptedCall("ask_user", {"question": "Which day do you mean, today or Sunday?"})),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on that day?")

    assert outcome.reply == "Which day do you mean, today or Sunday?"
    assert len(peer.requests) == 2 and peer.pending == 0  # nothing ran after the question
    skills = (await turn_record(db, outcome.turn_id))["skills"]
    assert skills["ended_by"] == "ask_user"
    assert skills["workers"][0]["status"] == "asked"
    assert skills["flags"] == []  # an unfinished run is not judged on its required steps

    peer.script(reply_text("Sunday is free."))
    again = await run_turn(deps, account.id, "web", "Sunday")
    fresh = peer.requests[2]
    assert again.reply == "Sunday is free." and "ask_user" not in tool_names(fresh)
    assert user_texts(fresh)[-1].startswith("Sunday\n\n")


async def test_the_detector_flags_a_skipped_required_step(db, deps, peer, account, caplog):
    peer.script(reply_tools(use("tidy-todos")), reply_text("Nothing to drop."))
    with caplog.at_level(logging.WARNING):
        outcome = await run_turn(deps, account.id, "web", "tidy my todos")
    flags = (await turn_record(db, outcome.turn_id))["skills"]["flags"]
    assert flags == [{"flag": "skipped-required-step", "skill": "tidy-todos", "step": "todos", "installed": True}]
    assert "skill skipped a required step: skill=tidy-todos step=todos" in caplog.text

    peer.script(reply_tools(use("agenda")), reply_tools(("find_free_time", {})), reply_text("You are free at 10."))
    outcome = await run_turn(deps, account.id, "web", "what's on?")
    flags = (await turn_record(db, outcome.turn_id))["skills"]["flags"]
    assert flags == [{"flag": "skipped-required-step", "skill": "agenda", "step": "list_events", "installed": True}]


async def test_a_worker_whose_tools_are_not_connected_is_refused_plainly(db, deps, peer, account, registry):
    from dataclasses import replace

    from core.tools import ToolRegistry

    deps.registry = ToolRegistry(
        [t if t.area != "calendar" else replace(t, needs_connection="google") for t in registry.all()]
    )
    peer.script(reply_tools(use("agenda")), reply_text("Your calendar is not connected."))
    await run_turn(deps, account.id, "web", "what's on?")
    assert outputs(peer.requests[1])[0].startswith(
        "Failed: the skill agenda cannot run: its calendar tools need an account that is not connected (google)"
    )


async def test_without_a_catalog_the_turn_has_no_skills_and_every_tool(db, deps, peer, account):
    deps.skills = None
    peer.script(reply_text("Hi."))
    outcome = await run_turn(deps, account.id, "web", "hi")
    request = peer.requests[0]
    assert "use_skill" not in tool_names(request) and "list_events" in tool_names(request)
    assert "Skills: none are installed." in request.body["instructions"]
    assert (await turn_record(db, outcome.turn_id))["skills"] is None


async def test_user_skills_are_listed_checked_when_run_and_broken_ones_reported(db, deps, peer, account, caplog):
    inline = "---\nname: my-standup\ndescription: Prepare my standup notes from todos.\n---\n1. List todos.\n"
    greedy = (
        "---\nname: my-greedy\ndescription: Uses too many tool sets for a user skill.\n"
        "toolsets: [calendar, todos, notes]\n---\n1. Do everything.\n"
    )
    broken = "---\nname: my-broken\ndescription: [unclosed\n---\n1. x\n"
    # Stored directly, as if written under older limits or an older parser.
    for name, text in (("my-standup", inline), ("my-greedy", greedy), ("my-broken", broken)):
        await db.execute(
            "INSERT INTO user_skills (account_id, name, source) VALUES ($1, $2, $3)", account.id, name, text
        )
    peer.script(reply_tools(use("my-greedy")), reply_tools(use("my-standup")), reply_text("Standup ready."))
    with caplog.at_level(logging.WARNING):
        outcome = await run_turn(deps, account.id, "web", "standup please")

    listing = peer.requests[0].body["instructions"]
    assert "- my-standup: Prepare my standup notes from todos." in listing and "my-broken" not in listing
    assert outputs(peer.requests[1])[0] == (
        "Refused by Pepper's rules: the skill my-greedy names 3 tool sets; a skill you write may use at most 2."
    )
    assert outputs(peer.requests[2])[1].startswith("The skill my-standup is active.")
    problems = (await turn_record(db, outcome.turn_id))["skills"]["problems"]
    assert {
        "skill": "my-broken",
        "origin": "user",
        "problem": "skill 'my-broken': the header is not valid YAML (header line 2)",
    } in problems
    assert any(p["skill"] == "my-greedy" and "at most 2" in p["problem"] for p in problems)
    assert "user skill unusable: skill=my-broken" in caplog.text

    deps.skills = make_catalog("tidy-todos")
    peer.script(reply_text("ok"))
    await run_turn(deps, account.id, "web", "hi", trust="owner_unverified")
    assert "my-standup" not in peer.requests[-1].body["instructions"]  # own skills: verified owner only


async def test_a_worker_gets_what_is_left_of_the_turns_time_and_then_reports(db, deps, peer, account, budget_clock):
    # Generations of 1 s each on the turn's clock: the orchestrator's round leaves the worker 1.7 s
    # of the turn's 2.7, time for one round more.
    deps.config = HarnessConfig(time_budgets={"live": 2.7})
    generate = deps.models.generate

    async def slow(prompt, **kw):
        budget_clock.advance(1.0)
        return await generate(prompt, **kw)

    deps.models.generate = slow
    peer.script(
        reply_tools(use("agenda", request="this week")),
        reply_tools(("list_events", {"day": "monday"})),
        reply_tools(("list_events", {"day": "tuesday"})),
        reply_text("Monday: 09:00 Dentist. I ran out of time for the rest of the week."),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on this week?")

    # The worker: two rounds with tools, then its share of the time was up and it reported without
    # tools; its report is the reply, and the turn ends there.
    assert [bool(tool_names(r)) for r in peer.requests] == [True, True, True, False]
    assert outcome.reply == "Monday: 09:00 Dentist. I ran out of time for the rest of the week."
    record = await turn_record(db, outcome.turn_id)
    [worker] = record["skills"]["workers"]
    assert worker["status"] == "capped" and record["skills"]["ended_by"] == "direct_report"
    assert [(r["purpose"], r.get("cap")) for r in worker["rounds"]] == [("turn", None), ("turn", None),
                                                                       ("final", "time")]  # fmt: skip


async def test_a_workers_model_calls_count_toward_the_persons_usage(db, deps, peer, account):
    from core.usage.ledger import day_usage

    peer.script(
        reply_tools(use("agenda", request="what is on today")),
        reply_tools(("list_events", {"day": "monday"})),
        reply_text("Today: 09:00 Dentist."),
    )
    outcome = await run_turn(deps, account.id, "web", "what's on today?")
    assert outcome.reply == "Today: 09:00 Dentist."
    used = await day_usage(db, account.id, deps.clock().date())
    record = await turn_record(db, outcome.turn_id)
    worker_rounds = record["skills"]["workers"][0]["rounds"]
    assert used.model_calls == 1 + len(worker_rounds) == len(peer.requests) == 3
    assert used.tokens > 0
