"""The repair pass: a small model may remove generation defects from a reply, and nothing else.

Used on channels where a reply cannot be corrected after it is sent (SMS and email by default).
A deterministic check rejects any edit that

* changes the length by more than ``repair_max_length_change`` (a fraction of the original),
* adds more than ``repair_max_added_words`` words that the original does not have, or
* drops a hedge (``might``, ``probably``, ``I think``...) that the original contains.

On any failure (a rejected edit, a model error, an empty answer) the original goes out: a broken
quality fix fails open.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from core.models.errors import ModelError
from core.models.types import ModelService, Prompt
from core.usage.config import generation_usage
from text_loop.config import HarnessConfig
from text_loop.prompt import harness_message

log = logging.getLogger(__name__)

REPAIR_INSTRUCTIONS = """You proofread a reply that an assistant is about to send.
Remove generation defects only: a sentence or phrase repeated by mistake, garbled or run-together
words, stray markup or tokens. Do not rephrase, add, soften or strengthen anything; keep every
hedge and every fact. If nothing is wrong, return the reply exactly as it is.
Answer with the reply text only."""

_WORD = re.compile(r"[\w']+")


@dataclass(frozen=True)
class RepairResult:
    text: str  # what goes out
    changed: bool
    verdict: str  # accepted | unchanged | rejected: <why> | failed: <code>
    model_ms: float = 0.0
    usage: tuple[dict[str, Any], ...] = ()  # the pass's model call, counted toward the person's caps

    def as_record(self) -> dict[str, Any]:
        return {"changed": self.changed, "verdict": self.verdict, "model_ms": round(self.model_ms, 3)}


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _has_phrase(words: list[str], phrase: str) -> bool:
    target = _words(phrase)
    n = len(target)
    return any(words[i : i + n] == target for i in range(len(words) - n + 1))


def check_repair(original: str, edited: str, config: HarnessConfig) -> str | None:
    """Why an edit is not acceptable, or None when it is."""
    if not edited.strip():
        return "empty"
    change = abs(len(edited) - len(original)) / max(1, len(original))
    if change > config.repair_max_length_change:
        return f"length changed by {change:.0%}"
    before, after = _words(original), _words(edited)
    added = sum((Counter(after) - Counter(before)).values())
    if added > config.repair_max_added_words:
        return f"added {added} words"
    for hedge in config.hedges:
        if _has_phrase(before, hedge) and not _has_phrase(after, hedge):
            return f"removed the hedge {hedge!r}"
    return None


async def repair_reply(
    models: ModelService, reply: str, config: HarnessConfig, *, conversation_key: str
) -> RepairResult:
    prompt = Prompt(
        system_stable=REPAIR_INSTRUCTIONS,
        messages=(harness_message("The reply to proofread:\n\n" + reply),),
        max_output_tokens=max(256, len(reply)),
    )
    started = time.perf_counter()
    try:
        generation = await models.generate(prompt, conversation_key=conversation_key, tier=config.repair_tier)
    except ModelError as exc:
        log.warning("repair pass failed; sending the original: code=%s", exc.code)
        return RepairResult(reply, False, f"failed: {exc.code}", (time.perf_counter() - started) * 1000)
    except Exception as exc:  # a broken quality fix fails open; CancelledError still passes
        log.exception("repair pass raised; sending the original")
        return RepairResult(reply, False, f"failed: {type(exc).__name__}", (time.perf_counter() - started) * 1000)
    elapsed = (time.perf_counter() - started) * 1000
    used = (generation_usage(generation),)
    edited = generation.text.strip()
    if edited == reply.strip():
        return RepairResult(reply, False, "unchanged", elapsed, used)
    problem = check_repair(reply, edited, config)
    if problem is not None:
        log.info("repair edit rejected; sending the original: rule=%s", problem.split(" ", 1)[0])
        return RepairResult(reply, False, f"rejected: {problem}", elapsed, used)
    return RepairResult(edited, True, "accepted", elapsed, used)
