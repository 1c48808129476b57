"""Provider faults on text turns (issue 31, suite 3): each text provider's SDK (openai, anthropic,
google-genai) against its loopback peer, a web chat turn (streamed) per case, through the real
router, adapters and harness.

For each provider as the tier's model, with the next one as its alternate:

* ``5xx``: the provider answers 503: one hop to the alternate, before anything streamed;
* ``timeout``: the provider holds the request past the SDK's timeout: the same;
* ``cut-before``: the stream drops before the first token: the same;
* ``cut-after``: the stream drops after the first token: no failover (the person saw part of
  it); the turn asks the same model again, unstreamed, and replies once, whole;
* ``write``: a staged write, then a 503 on the next round: the alternate answers, the write runs
  once and commits once when the reply is delivered.

Each case checks the reply (one, whole), who was asked (one request each, no bounce), the
``failed_over`` counter, and the charge: the person's usage for the day (``usage_days``) and the
turn record hold the answering calls' tokens once, plus what the provider reported for the failed
call (Anthropic names the input tokens in ``message_start``; a 5xx, a timeout and the other
streams report nothing), never more. A charge above that is a double charge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.identity import create_account
from core.models.adapters.anthropic import AnthropicAdapter
from core.models.adapters.google import GoogleAdapter
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.router import ModelChoice, ModelRouter, Tier
from core.store import Database
from core.testing.peers import (
    AnthropicPeer,
    GooglePeer,
    LoopbackPeer,
    OpenAIPeer,
    Reply,
    fault,
    reply_text,
    reply_tools,
)
from core.testing.provider_faults import Case, failed_overs, notes_saved, turn_tokens
from core.usage.ledger import day_usage
from text_loop import HarnessConfig, HarnessDeps, deliver, run_turn

# The SDKs' timeout in these cases, and how long a "timeout" peer holds its answer back.
TIMEOUT = 1.0
HELD = TIMEOUT + 1.0
PROVIDERS = ("openai", "anthropic", "google")
MODELS = {"openai": "gpt-x-mini", "anthropic": "claude-x-haiku", "google": "gemini-x-flash"}
ALTERNATE = {"openai": "anthropic", "anthropic": "google", "google": "openai"}
FAULTS = ("5xx", "timeout", "cut-before", "cut-after", "write")
# Stream events sent before the cut: the last before the first text, and the one carrying it.
CUT_BEFORE = {"openai": 2, "anthropic": 3, "google": 0}  # OpenAI: created, item added; Anthropic: start, ping, block
CUT_AFTER = {"openai": 3, "anthropic": 4, "google": 1}
PRIMARY_TOKENS, ALTERNATE_TOKENS = (120, 9), (60, 4)
REPLY = "Here is the whole answer, once."
NOTE = "Prefers mornings"


@dataclass
class TextFaults:
    db: Database
    peers: dict[str, LoopbackPeer]
    router: ModelRouter
    deps: HarnessDeps

    async def run(self, providers: tuple[str, ...] = PROVIDERS, faults: tuple[str, ...] = FAULTS) -> list[Case]:
        return [await self.case(p, f) for p in providers for f in faults]

    async def case(self, provider: str, fault_kind: str) -> Case:
        case = Case(f"text {provider} {fault_kind}")
        primary, alternate = self.peers[provider], self.peers[ALTERNATE[provider]]
        before = {name: len(peer.requests) for name, peer in self.peers.items()}
        failed_over_before = failed_overs(provider)
        ok = Reply(text=REPLY, input_tokens=PRIMARY_TOKENS[0], output_tokens=PRIMARY_TOKENS[1])
        alt = Reply(text=REPLY, input_tokens=ALTERNATE_TOKENS[0], output_tokens=ALTERNATE_TOKENS[1])
        expected = sum(ALTERNATE_TOKENS)  # the tokens charged when all goes as promised
        asked = {provider: 1, ALTERNATE[provider]: 1}
        if fault_kind == "5xx":
            primary.script(fault(503, "upstream overloaded"))
            alternate.script(alt)
        elif fault_kind == "timeout":
            primary.script(reply_text("too late", delay=HELD))
            alternate.script(alt)
        elif fault_kind == "cut-before":
            primary.script(reply_text("never seen", cut_after=CUT_BEFORE[provider], input_tokens=PRIMARY_TOKENS[0]))
            alternate.script(alt)
            if provider == "anthropic":  # message_start went out: it named the input (and 1 output) tokens
                expected += PRIMARY_TOKENS[0] + 1
        elif fault_kind == "cut-after":
            primary.script(reply_text(REPLY, cut_after=CUT_AFTER[provider], input_tokens=PRIMARY_TOKENS[0]), ok)
            expected = sum(PRIMARY_TOKENS) + (PRIMARY_TOKENS[0] + 1 if provider == "anthropic" else 0)
            asked = {provider: 2}
        else:  # write
            primary.script(
                reply_tools(("add_dossier_note", {"note": NOTE}), input_tokens=30, output_tokens=2),
                fault(503, "upstream overloaded"),
            )
            alternate.script(alt)
            expected += 32
            asked = {provider: 2, ALTERNATE[provider]: 1}

        account = await create_account(self.db, f"Fault {provider} {fault_kind}")
        streamed: list[str] = []

        def progress(item: dict[str, str]) -> None:
            if item["kind"] == "delta":
                streamed.append(item["text"])

        outcome = await run_turn(self.deps, account.id, "web", "what's the answer?", tier=provider, progress=progress)
        case.turn_id = outcome.turn_id
        case.check(outcome.status == "replied", f"the turn ended {outcome.status}")
        case.check(outcome.reply == REPLY, f"the reply was {outcome.reply!r}, not the whole answer once")
        for name, peer in self.peers.items():
            want = asked.get(name, 0)
            got = len(peer.requests) - before[name]
            case.check(got == want, f"{name} was asked {got} times, not {want}")
        hops = failed_overs(provider) - failed_over_before
        want_hops = 0 if fault_kind == "cut-after" else 1
        case.check(hops == want_hops, f"pepper_model_calls{{outcome=failed_over}} rose by {hops}, not {want_hops}")
        if fault_kind == "cut-after":
            case.check(bool(streamed), "nothing streamed before the cut")

        tokens = (await day_usage(self.db, account.id, datetime.now(UTC).date())).tokens
        case.check(tokens == expected, f"charged {tokens} tokens, not {expected}")
        case.double_charges = int(tokens > expected)
        recorded = await turn_tokens(self.db, outcome.turn_id)
        case.check(recorded == expected, f"the turn record holds {recorded} tokens, not {expected}")
        if fault_kind == "write":
            case.check(outcome.staged_writes == 1, f"{outcome.staged_writes} writes staged, not 1")
            writes = await deliver(self.deps, outcome.turn_id, True, detail={"provider_status": "delivered"})
            case.check([w.status for w in writes] == ["committed"], f"the writes ended {[w.status for w in writes]}")
            notes = await notes_saved(self.db, account.id, NOTE)
            case.check(notes == 1, f"the note was saved {notes} times, not once")
        for name, peer in self.peers.items():
            case.check(peer.pending == 0, f"{name} still holds {peer.pending} scripted replies")
            peer.clear_script()
        return case


async def timeouts_bounded() -> Case:
    """Every built-in adapter ``ModelRouter.from_settings`` makes gives its SDK client the
    configured timeout (``models.timeout``, finite): a provider that holds a request cannot hold
    the turn past it."""
    from core.settings import Settings

    case = Case("text adapters' timeouts bounded")
    settings = Settings(openai_api_key="k", anthropic_api_key="k", gemini_api_key="k",
                        models={"compatible_base_url": "http://127.0.0.1:9/v1"})  # fmt: skip
    router = ModelRouter.from_settings(settings)
    want = settings.models.timeout
    case.check(len(router.adapters) == 4, f"{len(router.adapters)} adapters, not 4")
    for name, adapter in router.adapters.items():
        client = adapter._client  # type: ignore[attr-defined]
        http = getattr(getattr(client, "_api_client", None), "_http_options", None)  # google-genai: ms
        got = http.timeout / 1000 if http is not None and http.timeout is not None else getattr(client, "timeout", None)
        case.check(isinstance(got, int | float) and got == want, f"{name}'s SDK timeout is {got!r}, not {want}")
    await router.aclose()
    return case


@asynccontextmanager
async def text_faults(db: Database) -> AsyncIterator[TextFaults]:
    """The three providers' peers, the router over their SDKs (``TIMEOUT`` seconds each) with one
    tier per provider (named after it, failing over to the next), and the harness on ``db``."""
    async with AsyncExitStack() as stack:
        openai_peer = await stack.enter_async_context(OpenAIPeer())
        anthropic_peer = await stack.enter_async_context(AnthropicPeer())
        google_peer = await stack.enter_async_context(GooglePeer())
        adapters: dict[str, Any] = {
            "openai": OpenAIResponsesAdapter(api_key="sk-test", base_url=openai_peer.base_url, timeout=TIMEOUT),
            "anthropic": AnthropicAdapter(api_key="sk-ant-test", base_url=anthropic_peer.base_url, timeout=TIMEOUT),
            "google": GoogleAdapter(api_key="g-test", base_url=google_peer.base_url, timeout=TIMEOUT),
        }
        tiers = {p: Tier(p, (ModelChoice(MODELS[p]),), ModelChoice(MODELS[ALTERNATE[p]])) for p in PROVIDERS}
        router = ModelRouter(adapters, tiers)
        stack.push_async_callback(router.aclose)
        deps = HarnessDeps(db=db, models=router, config=HarnessConfig(), clock=lambda: datetime.now(UTC))
        peers: dict[str, LoopbackPeer] = {"openai": openai_peer, "anthropic": anthropic_peer, "google": google_peer}
        yield TextFaults(db, peers, router, deps)
