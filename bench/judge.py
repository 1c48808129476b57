"""The nightly judge's throughput: turns graded per minute, and model tokens per graded turn.

N people with a day of real turns each (recorded by ``run_turn`` with a scripted model: a lookup,
a staged write, a reply; delivered or not), then ``judge_now`` for that day through the real router
and OpenAI adapter to a loopback peer that answers each grading request at once with the seven
grades. Turns graded per minute measures the judge's own cost (loading records, building the
labelled prompt, parsing, storing grades and issues), not a model's latency. Tokens per graded turn
are estimated from what went over the wire (4 characters a token), since the peer's usage figures
are canned.

    PYTHONPATH=. .venv/bin/python bench/judge.py [--people 20] [--turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

from core.identity import create_account
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import ModelChoice, ModelRouter, Tier
from core.quality.jobs import QualityConfig, judge_now
from core.quality.points import POINTS
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, calls, reply
from text_loop import HarnessDeps, deliver, run_turn

CHARS_PER_TOKEN = 4


def _grades(failing: bool) -> str:
    bad = {"honesty"} if failing else set()
    return json.dumps(
        {
            "grades": {
                p: {"grade": "fail" if p in bad else "pass", "reason": "claims a dropped write" if p in bad else "fine"}
                for p in POINTS
            },
            "fixes": {p: "say only what committed" for p in bad},
        }
    )


def _script(people: int, turns: int) -> list[str]:
    """The judge's answers in the order it asks: per person, the first two turns it grades fail on
    honesty (the first opens an issue; the second is compared with it and counts it again), the
    rest pass. People are graded one after the other, so the issue ids are 1, 2, ..."""
    answers: list[str] = []
    for person in range(people):
        for k in range(turns):
            answers.append(_grades(k < 2))
            if k == 1:
                answers.append(json.dumps({"matches": {"honesty": person + 1}}))
    return answers


async def _record_day(db: Database, people: int, turns: int) -> int:
    models = ScriptedModels()
    deps = HarnessDeps(db=db, models=models)
    for n in range(people):
        account = await create_account(db, f"P{n}", timezone="UTC")
        for k in range(turns):
            models.script(
                calls(("search_notes", {"query": f"dentist {k}"})),
                calls(("add_dossier_note", {"note": f"prefers mornings {k}"})),
                reply(f"Your dentist is on Tuesday; I noted that you prefer mornings ({k})."),
            )
            outcome = await run_turn(deps, account.id, "web", f"when is the dentist? I prefer mornings ({k})")
            await deliver(deps, outcome.turn_id, k % 4 != 0)
    return people * turns


async def bench(people: int, turns: int) -> None:
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        db = await Database.open(await factory.create(), max_size=6)
        try:
            recorded = await _record_day(db, people, turns)
            day = (await db.fetchval("SELECT max(started_at) FROM turns")).astimezone(UTC).date()
            config = QualityConfig(sample=turns)
            async with OpenAIPeer() as peer:
                answers = _script(people, turns)
                peer.script(*(reply_text(a) for a in answers))
                adapter = OpenAIResponsesAdapter(api_key="k", base_url=peer.base_url, timeout=30)
                router = ModelRouter({"openai": adapter}, {"small": Tier("small", (ModelChoice("gpt-judge"),))})
                started = time.perf_counter()
                report = await judge_now(db, router, datetime.now(UTC) + timedelta(seconds=1), day=day, config=config)
                elapsed = time.perf_counter() - started
                await router.aclose()
                sent = sum(
                    len(r.body.get("instructions") or "") + len(json.dumps(r.body.get("input", "")))
                    for r in peer.requests
                )
                answered = sum(len(a) for a in answers[: len(peer.requests)])
        finally:
            await db.close()
    graded = sum(d.graded for d in report.days)
    issues = sum(len(d.opened) for d in report.days)
    again = sum(len(d.seen_again) for d in report.days)
    print(f"judge: {graded} of {recorded} recorded turns graded for {people} people in {elapsed:.2f} s ="
          f" {60 * graded / elapsed:.0f} turns graded per minute (loopback peer, no model latency);"
          f" {issues} quality issues opened, {again} seen again")  # fmt: skip
    print(f"model tokens per graded turn (~{CHARS_PER_TOKEN} characters a token, from the wire):"
          f" {sent / CHARS_PER_TOKEN / graded:.0f} in, {answered / CHARS_PER_TOKEN / graded:.0f} out,"
          f" {len(peer.requests) / graded:.2f} model calls")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10, help="turns per person (all of them are graded)")
    args = parser.parse_args()
    asyncio.run(bench(args.people, args.turns))


if __name__ == "__main__":
    main()
