"""Orchestrator prompt size, and how much of it stays byte-identical across the turns of a day.

One owner's day: 24 text turns from 07:00 to 22:00 (their time), after a previous day of
conversation, run through the real ``run_turn`` on the embedded Postgres with the shipped skills
and every feature area this build has, every account connected (web research included), beside
the same day with only the baseline's areas (the 13 areas before the feature areas of issue 29).
The scripted model answers at once; the first prompt of each turn (the orchestrator's) is
measured as a provider receives it: the tool list, then the system text (stable prefix, then the
memory block), then the messages.

Prints, median and p99:

* prompt tokens per turn (target with every area connected: median <= 6,000);
* the share of each prompt's bytes that is an identical prefix of the previous turn's prompt,
  which is what a provider's prompt cache can reuse (target: median >= 90%);
* the share that is identical in every turn of the day.

Tokens are counted with OpenAI's o200k_base encoding through ``tiktoken`` when its encoding file
is available, else through ``bpe-openai`` (the same encoding, shipped inside the package:
``pip install bpe-openai``); without either, as UTF-8 bytes / 4, and the output says so.

    PYTHONPATH=. .venv/bin/python bench/prompt_size.py [--turns 24] [--show]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from core.conversation import record_inbound, record_outbound
from core.identity import create_account
from core.models.types import Prompt
from core.testing.figures import p99
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, reply
from core.tools.connectors import Connectors
from core.tools.registry import ToolRegistry
from core.tools.starter import starter_registry
from text_loop import HarnessConfig, HarnessDeps, run_turn
from text_loop.skills import SkillCatalog
from text_loop.skills.toolsets import worker_only_areas

# The areas before issue 29's (what the baseline run keeps).
BASELINE_AREAS = frozenset(
    {"answering_inbox", "calendar", "clock", "contacts", "dossier", "email", "feeds", "memory", "notes",
     "reminders", "room", "tasks", "todos"}
)  # fmt: skip
TARGET_TOKENS = 6000
ZONE = "Europe/Paris"
DAY = datetime(2025, 6, 3, tzinfo=ZoneInfo(ZONE))
MESSAGES = [
    "morning! what's on today?",
    "move the dentist to thursday if they have a slot",
    "add milk and coffee filters to my todos",
    "remind me to call mum at 6",
    "did anyone call while I was in the meeting?",
    "what was the name of that ramen place Tom recommended?",
    "draft a reply to Sara saying friday works",
    "note: parking level 3 spot 42",
    "what's left on my list?",
    "tick off the coffee filters",
    "any email from the bank?",
    "plan my afternoon",
    "what time is it in Tokyo?",
    "remember that I'm allergic to penicillin",
    "what did I say about the budget last week?",
    "book a call with Jim tomorrow morning",
    "thanks!",
    "what's tomorrow look like?",
    "set a reminder for the bins on wednesday night",
    "can you summarise the news I follow?",
    "add 'renew passport' to my todos",
    "what was that door code again?",
    "weekly review please",
    "good night",
]
DOSSIER = (
    "Ada Lovelace, software engineer in Paris. Partner: Tom. Mother: Ruth (calls on Sundays). "
    "Prefers short answers, metric units, 24-hour times. Works 9:00-18:00 on weekdays; no meetings on "
    "Friday afternoons. Dentist: Dr Wu. Gym on Tuesdays and Thursdays at 7:00."
)


def token_counter() -> tuple[Callable[[str], int], str]:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")
        return (lambda text: len(enc.encode(text, disallowed_special=()))), "tiktoken o200k_base"
    except Exception:
        pass
    try:
        import bpe_openai

        enc = bpe_openai.get_encoding("o200k_base")
        return (lambda text: len(enc.encode(text))), "bpe-openai o200k_base"
    except Exception:
        pass
    return (lambda text: (len(text.encode()) + 3) // 4), "APPROXIMATION: UTF-8 bytes / 4 (no tokenizer installed)"


def as_sent(prompt: Prompt) -> str:
    """The prompt in the order providers cache it: tools, system (stable, dynamic), messages."""
    tools = json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in prompt.tools],
        separators=(",", ":"),
    )
    messages = "\n".join(f"{m.role}: {m.content}" for m in prompt.messages)
    return "\n\n".join([tools, prompt.system_stable, prompt.system_dynamic, messages])


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


async def run_day(turns: int, keep: frozenset[str] | None = None) -> tuple[list[Prompt], list[str], set[str]]:
    """The orchestrator's first prompt of each turn of one day; also the areas and the tools behind
    workers. ``keep``: only these areas' tools (the baseline); None: every area."""
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        db = await factory.open()
        try:
            account = await create_account(db, "Ada", timezone=ZONE)
            await db.execute("INSERT INTO dossiers (account_id, owner_text) VALUES ($1, $2)", account.id, DOSSIER)
            conversation = await db.fetchval("SELECT id FROM conversations WHERE account_id = $1", account.id)
            yesterday = DAY - timedelta(days=1)
            for i, text in enumerate(MESSAGES[:10]):
                at = yesterday.replace(hour=8) + timedelta(minutes=50 * i)
                for direction, body in (("inbound", text), ("outbound", f"Done: {text[:40]}.")):
                    await db.execute(
                        "INSERT INTO messages (conversation_id, channel, direction, body, created_at)"
                        " VALUES ($1, 'sms', $2, $3, $4)",
                        conversation,
                        direction,
                        body,
                        at.astimezone(UTC),
                    )
            full = starter_registry(Connectors(research_socket="/run/pepper-research.sock"))
            registry = full if keep is None else ToolRegistry(t for t in full.all() if t.area in keep)
            connections = frozenset(t.needs_connection for t in registry.all() if t.needs_connection)
            catalog = SkillCatalog.load_builtin()
            models = ScriptedModels(default=reply("Done."))
            now = {"t": DAY}
            deps = HarnessDeps(
                db=db,
                models=models,
                registry=registry,
                skills=catalog,
                clock=lambda: now["t"],
                config=HarnessConfig(),
            )
            prompts: list[Prompt] = []
            for i in range(turns):
                minutes = int(15 * 60 * i / max(1, turns - 1))
                now["t"] = (DAY.replace(hour=7) + timedelta(minutes=minutes)).astimezone(UTC)
                text = MESSAGES[i % len(MESSAGES)]
                message, _ = await record_inbound(db, account.id, "sms", text, provider_message_id=f"SM{i}")
                models.received.clear()
                outcome = await run_turn(
                    deps, account.id, "sms", text, inbound_message_ids=[message.id], connections=connections
                )
                prompts.append(models.prompts[0])
                await record_outbound(db, conversation, "sms", outcome.reply, turn_id=outcome.turn_id)
        finally:
            await db.close()
    hidden = worker_only_areas(catalog.toolsets)
    return prompts, sorted({t.area for t in registry.all()}), {t.name for t in registry.all() if t.area in hidden}


def report(title: str, prompts: list[Prompt], count: Callable[[str], int]) -> tuple[float, float]:
    sent = [as_sent(p).encode() for p in prompts]
    tokens = [count(s.decode()) for s in sent]
    shared_prev = [common_prefix(sent[i - 1], sent[i]) / len(sent[i]) for i in range(1, len(sent))]
    day_prefix = min(common_prefix(sent[0], s) for s in sent[1:])
    shared_day = [day_prefix / len(s) for s in sent]
    stable_tokens = [count(p.system_stable) for p in prompts]
    memory_tokens = [count(p.system_dynamic) for p in prompts]
    tool_tokens = [count(as_sent(Prompt("", (), tools=p.tools)).split("\n\n")[0]) for p in prompts]
    print(title)
    print(f"  prompt tokens per turn: median {statistics.median(tokens):.0f}, p99 {p99(tokens):.0f}")
    print(
        f"    of which tools median {statistics.median(tool_tokens):.0f}, stable system text "
        f"{statistics.median(stable_tokens):.0f}, memory block {statistics.median(memory_tokens):.0f}"
    )
    print(
        f"  bytes shared with the previous turn's prompt: median {100 * statistics.median(shared_prev):.1f}%, "
        f"p99 (worst) {100 * p99(shared_prev, low=True):.1f}%"
    )
    print(
        f"  bytes identical in every turn of the day: median {100 * statistics.median(shared_day):.1f}%, "
        f"p99 (worst) {100 * p99(shared_day, low=True):.1f}%"
    )
    return statistics.median(tokens), statistics.median(shared_prev)


async def bench(turns: int, show: bool = False) -> None:
    count, how = token_counter()
    base_prompts, base_areas, base_behind = await run_day(turns, BASELINE_AREAS)
    prompts, areas, behind = await run_day(turns)
    print(f"a day of {turns} turns; shipped skills; tokens counted with {how}")
    for title, got, names, hidden in (
        ("baseline (the 13 areas before issue 29)", base_prompts, base_areas, base_behind),
        ("every area connected", prompts, areas, behind),
    ):
        first = got[0]
        print(f"{title}: {len(names)} areas ({', '.join(names)})")
        print(
            f"  orchestrator: {len(first.tools)} tools ({len(hidden)} more behind workers), "
            f"{len(view_names(first))} skills listed"
        )
        med_tokens, med_shared = report("  memory block: summaries, then today's messages", got, count)
    if show:
        print("\n--- the first turn's orchestrator prompt with every area, as sent ---")
        print(as_sent(prompts[0]))
    met = "met" if med_tokens <= TARGET_TOKENS else "NOT met"
    print(f"target median <= {TARGET_TOKENS} tokens with every area: {met}")
    print(f"target median >= 90% stable prefix with every area: {'met' if med_shared >= 0.9 else 'NOT met'}")


def view_names(prompt: Prompt) -> list[str]:
    for spec in prompt.tools:
        if spec.name == "use_skill":
            return list(spec.parameters["properties"]["name"]["enum"])
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--show", action="store_true", help="also print the first prompt with every area")
    args = parser.parse_args()
    asyncio.run(bench(max(2, args.turns), args.show))


if __name__ == "__main__":
    main()
