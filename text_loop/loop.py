"""The bounded turn loop: generate, run the requested tools in order, give results back, repeat.

The turn's reply is the first generation with text and no tool calls. Guards:

* a round cap per turn kind; from ``budget_notice_within`` rounds before it, a labelled note tells
  the model how many rounds remain; and a time budget per turn kind: once it is spent, no new
  round with tools starts;
* a round in which every call was an unknown tool or a refusal does not count, at most
  ``free_wasted_rounds`` times per turn;
* an identical call (same tool, same arguments) that already succeeded in this turn does not run
  again: the earlier result is returned, marked as a repeat;
* at either cap, one last generation runs without tools, on a plain-text rewrite of the turn, and
  is told which writes completed and which did not;
* an empty reply is retried once on a plain-text rewrite (recovery); both attempts are recorded;
* a streamed reply cut part way (``StreamInterrupted``: never failed over) is asked for once more,
  unstreamed: the person gets the whole reply once (an open chat replaces the streamed text with
  it). Each failed call of a round (cut, or failed over by the router) is in the round's
  ``failed_attempts`` and charged what its provider reported for it, if anything.

``tier`` and ``round_cap`` may change while the loop runs (an inline skill raises them); each
round records the tier it ran on. ``after_round``, when set, sees each round's outcomes and may
end the loop with ``(status, reply)`` (a worker's direct report, a question for the person).
``progress``, when set, is told what the person could watch: each piece of text as the model
streams it (``"delta"``, text) and each tool as it starts (``"tool"``, its name); it must not block.

Model time is measured separately so the benchmark can report what the harness itself costs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from core.models.errors import ModelError, ModelNotConfigured, StreamInterrupted
from core.models.records import attempt_usage
from core.models.router import failed_attempt
from core.models.types import ChatMessage, Generation, ModelService, Prompt, TextDelta, ToolCall, ToolSpec
from core.tools.runner import CallOutcome
from text_loop.config import HarnessConfig
from text_loop.prompt import canonical_arguments, harness_message, labelled, plain_text_transcript
from text_loop.records import generation_record, message_record

log = logging.getLogger(__name__)


def budget_clock() -> float:
    """The clock a turn's time budget runs on (monotonic seconds); tests move a fake one."""
    return time.monotonic()


NO_MODEL_REPLY = (
    "I can't answer yet: no AI model is configured for Pepper. "
    "Whoever runs this Pepper can set one up (run `pepper doctor` to see what is missing)."
)
MODEL_ERROR_REPLY = "Sorry, I couldn't reach my AI model just now. Please try again in a minute."
EMPTY_REPLY = "Sorry, I couldn't put an answer together just now. Please try again."
REPEAT_MARK = (
    "[Repeated call: it already ran in this turn with the same arguments and did not run again. Earlier result:]"
)

CallRunner = Callable[[ToolCall], Awaitable[CallOutcome]]
USAGE_KEYS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
# Opened once per round of tool calls (a live turn holds one store connection for the round).
ToolRound = Callable[[], AbstractAsyncContextManager[CallRunner]]
# Told ("delta", text) as the reply streams and ("tool", name) as a call starts; never blocks.
Progress = Callable[[str, str], None]
# Called after each round of tool calls; returning (status, reply) ends the loop with that reply.
AfterRound = Callable[[Sequence[CallOutcome]], "tuple[str, str] | None"]


@dataclass
class LoopResult:
    reply: str
    status: str  # replied | capped | recovered | empty | no-model | model-error
    rounds: list[dict[str, Any]] = field(default_factory=list)
    calls: list[CallOutcome] = field(default_factory=list)
    counted_rounds: int = 0
    model: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    model_ms: float = 0.0
    error: str | None = None

    @property
    def capped(self) -> bool:
        return self.status == "capped"

    @property
    def answered(self) -> bool:
        """True when the reply came from the model and may describe the turn's writes."""
        return self.status in ("replied", "capped", "recovered")


class _Stop(Exception):
    def __init__(self, status: str, reply: str, error: str):
        self.status, self.reply, self.error = status, reply, error


class TurnLoop:
    def __init__(
        self,
        models: ModelService,
        config: HarnessConfig,
        *,
        system_stable: str,
        system_dynamic: str,
        tools: Sequence[ToolSpec],
        messages: Sequence[ChatMessage],
        tool_round: ToolRound,
        round_cap: int,
        conversation_key: str,
        tier: str,
        background: bool = False,
        time_budget: float | None = None,
        fallback_tiers: Sequence[str] = (),
    ):
        self.models = models
        self.config = config
        self.system_stable = system_stable
        self.system_dynamic = system_dynamic
        self.tools = tuple(tools)
        self.history: list[ChatMessage] = list(messages)
        self.tool_round = tool_round
        self.round_cap = round_cap
        self.conversation_key = conversation_key
        self.tier = tier
        # Where a model call goes when ``tier`` cannot answer: the rest of the turn's plan
        # (``core.models.select``), walked in order; the loop stays on the tier that answered.
        self.fallback_tiers = tuple(fallback_tiers)
        self.background = background
        self.time_budget = time_budget
        self._deadline: float | None = None  # time.monotonic() at which the budget is spent
        self.result = LoopResult("", "replied")
        self.after_round: AfterRound | None = None
        self.progress: Progress | None = None
        self._recorded_upto = len(self.history)

    async def _generate(
        self, purpose: str, messages: Sequence[ChatMessage], *, tools: bool, counted: bool
    ) -> Generation:
        prompt = Prompt(
            system_stable=self.system_stable,
            system_dynamic=self.system_dynamic,
            messages=tuple(messages),
            tools=self.tools if tools else (),
            max_output_tokens=self.config.max_output_tokens,
        )
        record: dict[str, Any] = {
            "n": len(self.result.rounds) + 1,
            "purpose": purpose,
            "tools_offered": tools,
            "tier": self.tier,
        }
        if purpose in ("recovery", "final"):
            record["request"] = [message_record(m) for m in messages]
        else:
            # The base prompt is in the turn record; each round adds what is new since it.
            record["request_tail"] = [message_record(m) for m in messages[self._recorded_upto :]]
            self._recorded_upto = len(self.history)
        started = time.perf_counter()
        try:
            generation = await self._walk_tiers(prompt, purpose, record)
        except ModelNotConfigured as exc:
            record["error"] = exc.code
            self.result.rounds.append(record)
            raise _Stop("no-model", NO_MODEL_REPLY, exc.code) from exc
        except ModelError as exc:
            log.warning("model call failed: code=%s provider=%s", exc.code, exc.provider)
            record["error"] = exc.code
            if exc.usage is not None:
                self._failed_attempt(record, failed_attempt(exc.model or "", exc))
            self.result.rounds.append(record)
            raise _Stop("model-error", MODEL_ERROR_REPLY, exc.code) from exc
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            self.result.model_ms += elapsed
            record["model_ms"] = round(elapsed, 3)
        record["counted"] = counted
        record["response"] = generation_record(generation)
        if "failed_attempt" in generation.extras:
            self._failed_attempt(record, generation.extras["failed_attempt"])
        self.result.rounds.append(record)
        self.result.model = generation.model
        for key in USAGE_KEYS:
            self.result.usage[key] = self.result.usage.get(key, 0) + getattr(generation.usage, key)
        return generation

    def _failed_attempt(self, record: dict[str, Any], attempt: dict[str, Any]) -> None:
        """A failed call of this round, into its record and the turn's usage (what its provider
        reported for it, which is nothing for most failures)."""
        record.setdefault("failed_attempts", []).append(attempt)
        for key, value in zip(USAGE_KEYS, attempt_usage(attempt), strict=True):
            self.result.usage[key] = self.result.usage.get(key, 0) + value

    async def _walk_tiers(self, prompt: Prompt, purpose: str, record: dict[str, Any]) -> Generation:
        """One generation on the loop's tier, or on the plan's next tiers in turn when it cannot
        answer. A failed call has done nothing (tools run only after a generation), so the same
        call goes again."""
        streamed = purpose == "turn"
        while True:
            try:
                return await self._call_model(prompt, streamed=streamed)
            except StreamInterrupted as exc:
                # The person saw part of the reply; the whole one, asked again unstreamed, replaces it.
                log.warning("model reply cut part way; asking again: provider=%s", exc.provider)
                self._failed_attempt(record, failed_attempt(exc.model or "", exc))
                record["interrupted"] = True
                streamed = False
            except ModelError as exc:  # ModelNotConfigured included
                if not self.fallback_tiers:
                    raise
                failed, self.tier = self.tier, self.fallback_tiers[0]
                self.fallback_tiers = self.fallback_tiers[1:]
                log.warning("model tier could not answer; trying the next: tier=%s next=%s code=%s",
                            failed, self.tier, exc.code)  # fmt: skip
                record.setdefault("tiers_failed", []).append({"tier": failed, "error": exc.code})
                record["tier"] = self.tier

    async def _call_model(self, prompt: Prompt, *, streamed: bool) -> Generation:
        """One generation; streamed (each delta told to ``progress``) when someone is watching."""
        progress = self.progress
        if progress is None or not streamed:
            return await self.models.generate(
                prompt, conversation_key=self.conversation_key, tier=self.tier, background=self.background
            )
        async with contextlib.aclosing(
            self.models.stream(
                prompt, conversation_key=self.conversation_key, tier=self.tier, background=self.background
            )
        ) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    progress("delta", event.text)
                else:
                    return event
        raise ModelError("the model's stream ended without a result")

    async def run(self) -> LoopResult:
        try:
            await self._run()
        except _Stop as stop:
            self.result.status, self.result.reply, self.result.error = stop.status, stop.reply, stop.error
        return self.result

    def time_left(self) -> float | None:
        """Seconds left of the turn's time budget (None: unbounded). A worker's loop inside this
        turn gets what is left, so a skill cannot stretch the turn past its budget."""
        return None if self._deadline is None else max(0.0, self._deadline - budget_clock())

    async def _run(self) -> None:
        counted = 0
        forgiven = 0
        succeeded: dict[tuple[str, str], CallOutcome] = {}
        self._deadline = None if self.time_budget is None else budget_clock() + self.time_budget
        while True:
            remaining = self.round_cap - counted
            if remaining <= 0:
                await self._final(counted)
                return
            # The first round always runs: the budget bounds how long a turn goes on, not whether it starts.
            if self._deadline is not None and self.result.rounds and budget_clock() >= self._deadline:
                await self._final(counted, cap="time")
                return
            messages = list(self.history)
            if remaining <= self.config.budget_notice_within:
                messages.append(harness_message(_budget_note(remaining)))
            generation = await self._generate("turn", messages, tools=True, counted=True)
            if not generation.tool_calls:
                if generation.text.strip():
                    self.result.reply = generation.text.strip()
                    self.result.counted_rounds = counted + 1
                    return
                await self._recover(messages)
                self.result.counted_rounds = counted + 1
                return
            self.history.append(ChatMessage("assistant", generation.text, generation.tool_calls))
            outcomes: list[CallOutcome] = []
            async with self.tool_round() as execute:
                for call in generation.tool_calls:
                    key = (call.name, canonical_arguments(call.arguments))
                    earlier = succeeded.get(key)
                    if earlier is not None:
                        outcome = CallOutcome(
                            call,
                            "repeat",
                            f"{REPEAT_MARK}\n{earlier.content}",
                            earlier.arguments,
                            writes=earlier.writes,
                            repeat_of=earlier.call.id,
                        )
                    else:
                        if self.progress is not None:
                            self.progress("tool", call.name)
                        outcome = await execute(call)
                        if outcome.succeeded:
                            succeeded[key] = outcome
                    outcomes.append(outcome)
                    self.result.calls.append(outcome)
                    self.history.append(ChatMessage("tool", tool_result=outcome.result()))
            wasted = all(o.wasted for o in outcomes)
            if wasted and forgiven < self.config.free_wasted_rounds:
                forgiven += 1
                self.result.rounds[-1]["counted"] = False
                self.result.rounds[-1]["wasted"] = True
            else:
                counted += 1
            self.result.rounds[-1]["calls"] = [o.call.id for o in outcomes]
            end = self.after_round(outcomes) if self.after_round is not None else None
            if end is not None:
                self.result.status, self.result.reply = end
                self.result.counted_rounds = counted
                return

    async def _final(self, counted: int, cap: str = "rounds") -> None:
        """At a cap: one generation without tools, told what was and was not written."""
        self.result.counted_rounds = counted
        note = harness_message(_cap_note(self.result.calls, cap))
        transcript = harness_message("This turn so far, as plain text:\n\n" + plain_text_transcript(self.history))
        generation = await self._generate("final", [transcript, note], tools=False, counted=False)
        self.result.rounds[-1]["cap"] = cap
        if generation.text.strip():
            self.result.status, self.result.reply = "capped", generation.text.strip()
            return
        raise _Stop("empty", EMPTY_REPLY, "empty-reply")

    async def _recover(self, messages: Sequence[ChatMessage]) -> None:
        """An empty reply: ask once more on the turn rewritten as plain text, without tools."""
        log.info("empty reply; retrying once as plain text")
        request = [
            harness_message(
                "This turn so far, as plain text:\n\n"
                + plain_text_transcript(messages)
                + "\n\nYour last answer was empty. Write your reply to the person now, as plain text."
            )
        ]
        generation = await self._generate("recovery", request, tools=False, counted=False)
        if generation.text.strip():
            self.result.status, self.result.reply = "recovered", generation.text.strip()
            return
        raise _Stop("empty", EMPTY_REPLY, "empty-reply")


def _budget_note(remaining: int) -> str:
    if remaining == 1:
        return (
            "Round budget: this is the last round in which tools can run. After it, tools are off. "
            "If you can answer now, answer now."
        )
    return f"Round budget: {remaining} rounds with tools remain in this turn, including this one. Plan to finish."


def _cap_note(calls: Sequence[CallOutcome], cap: str = "rounds") -> str:
    done: list[str] = []
    not_done: list[str] = []
    for outcome in calls:
        if not outcome.writes or outcome.status == "repeat":
            continue
        if outcome.succeeded and outcome.write is not None:
            when = " (saved when this reply is delivered)" if outcome.write.get("staged") else ""
            done.append(f"- {outcome.call.name}: {outcome.write['summary']}{when}")
        elif outcome.succeeded:
            done.append(f"- {outcome.call.name}: nothing needed changing")
        else:
            not_done.append(f"- {outcome.call.name}: {outcome.status}: {outcome.content}")
    lines = [
        ("The time for this turn is up" if cap == "time" else "The round limit for this turn is reached")
        + " and tools are now off.",
        "Reply to the person now, from what you already have. Say plainly what you could not finish.",
    ]
    lines.append("Writes that completed:\n" + ("\n".join(done) if done else "- none"))
    lines.append(
        "Writes that did NOT complete (do not say or imply they happened):\n"
        + ("\n".join(not_done) if not_done else "- none")
    )
    lines.append("Anything else you meant to change but did not call a tool for did not happen either.")
    return "\n\n".join(lines)


__all__ = ["EMPTY_REPLY", "MODEL_ERROR_REPLY", "NO_MODEL_REPLY", "REPEAT_MARK", "LoopResult", "TurnLoop", "labelled"]
