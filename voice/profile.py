"""What a call is for, apart from the audio: a *profile* the call engine runs.

The engine (:class:`voice.engine.CallEngine`) relays audio, marks and barge-in, reconnects the
model, runs tool calls through the gate and commits staged writes on the mark. A profile says who
the call is for: its tools and their gate, the instructions, the trust of the session, what the
keypad does, where the transcript goes and what is recorded at the end. The owner's profile is
:class:`voice.owner_profile.OwnerProfile`; the answering service's is
``answering_service.profile.AnsweringProfile``.

A profile sees the engine only through :class:`CallControls`, and the engine calls the profile
only through :class:`CallProfile`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from core.persona import runtime_label
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import Tool, ToolRegistry
from core.tools.runner import CallOutcome

LABEL = runtime_label("caller")


def labelled(text: str) -> str:
    return f"{LABEL}\n{text}"


_DIGIT_VALUES = {w: str(n) for n, w in enumerate("zero one two three four five six seven eight nine".split())}
_DIGIT_VALUES["oh"] = "0"
_ONE_DIGIT = re.compile("|".join((*_DIGIT_VALUES, r"\d")), re.IGNORECASE)
_DIGIT_WORDS = f"(?:{_ONE_DIGIT.pattern})"
_DIGIT_RUN = re.compile(rf"\b{_DIGIT_WORDS}(?:[\s,.-]*{_DIGIT_WORDS}){{2,}}\b", re.IGNORECASE)


def withhold_digits(text: str, only: Collection[str] | None = None) -> str:
    """Runs of three or more spoken digits, replaced (a PIN or code said before verification).
    With ``only``, just the runs holding one of those digit strings (a PIN or code the caller used
    is withheld even when said again after verification)."""

    def replace(match: re.Match[str]) -> str:
        if only is None:
            return "[digits withheld]"
        said = "".join(_DIGIT_VALUES.get(d.lower(), d) for d in _ONE_DIGIT.findall(match.group()))
        return "[digits withheld]" if any(secret in said for secret in only) else match.group()

    return _DIGIT_RUN.sub(replace, text)


def spoken_digits(text: str) -> str | None:
    """The digits of the last run of four or more spoken digits in ``text`` (a PIN or code said
    aloud), or None."""
    runs = [m.group() for m in _DIGIT_RUN.finditer(text)]
    for run in reversed(runs):
        digits = "".join(_DIGIT_VALUES.get(d.lower(), d) for d in _ONE_DIGIT.findall(run))
        if len(digits) >= 4:
            return digits
    return None


@dataclass(frozen=True)
class AdmittedCall:
    """The call a media stream was admitted for, from its ``calls`` row (the route's own facts,
    such as an answering call's rules, are its profile's)."""

    call_sid: str
    account_id: UUID
    handle_id: UUID | None
    caller: str | None
    line_number: str | None
    attested: bool = False  # the carrier vouched for the number (SHAKEN/STIR A): voice.verification


class CallControls(Protocol):
    """The engine as a profile sees it."""

    @property
    def call(self) -> AdmittedCall: ...

    @property
    def conversation_id(self) -> UUID | None:
        """The account's conversation (set once the call runs; the turn is in it)."""

    @property
    def turn_id(self) -> UUID | None:
        """The call's turn record (set once the call runs)."""

    @property
    def timezone(self) -> str:
        """The account's time zone (read once the call runs)."""

    @property
    def listening(self) -> bool:
        """The opening notice has played: caller audio goes to the model."""

    @property
    def closing(self) -> str | None:
        """Why the call is ending, once it is (the goodbye may still be playing)."""

    @property
    def transcript(self) -> Sequence[Mapping[str, Any]]:
        """The call so far, a copy: ``role`` (caller, pepper, keypad), ``text`` or ``event``, ``at_ms``."""

    def note(self, role: str, **fields: Any) -> None:
        """Add an entry to the transcript (``fields`` as given, with the time)."""

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` as one of the call's tasks: cancelled when the call ends; one that fails ends the call."""

    async def begin_closing(self, reason: str, instructions: str | None) -> None:
        """End the call once the goodbye asked for with ``instructions`` (if any) has played."""

    def hang_up(self, reason: str = "hangup") -> None:
        """End the call now, with no goodbye (a robocall: nobody to say it to)."""

    async def tell_model(self, note: str, *, respond: bool = False, instructions: str | None = None) -> None:
        """A labelled runtime note to the model; with ``respond``, a response (``instructions``)
        if none runs. Nothing while no model is connected or once the call has ended."""

    async def reconfigure(self) -> None:
        """Send the profile's instructions and tools to the model now."""

    def reconfigure_after_tools(self) -> None:
        """Send them with the next tool results (the trust changed during a tool call)."""

    def end_call_tool(self, area: str) -> Tool:
        """The ``end_call`` control: the call ends once the goodbye of its response has played."""


class CallProfile(ABC):
    """Who a call is for. The engine calls :meth:`attach` once, before anything else."""

    trust: str
    route: str = "owner"  # the call's route, as metrics count calls (owner, answering)
    verified_by: str | None = None  # how the caller proved who they are, if they did
    registry: ToolRegistry  # the call's tools, built in attach
    gate: Gate
    notice: str  # what the model says first, before any caller audio counts
    medium = "Phone call"  # how the call's summary names it

    @abstractmethod
    def attach(self, call: CallControls) -> None:
        """Keep the engine's controls and build the registry."""

    @abstractmethod
    def session_context(self) -> SessionContext:
        """The tool calls' session, as of now."""

    @abstractmethod
    def visible_tools(self) -> list[Tool]:
        """The tools the model is shown (and may call), as of now."""

    @abstractmethod
    async def instructions(self) -> str:
        """The model's instructions, as of now."""

    @abstractmethod
    async def record(self, direction: str, item_id: str, text: str) -> None:
        """Store one transcript line (``in``: the caller's, ``out``: Pepper's), in order."""

    def on_dtmf(self, digit: str) -> None:
        """A key the caller pressed."""
        return None

    def came_back(self) -> None:
        """The caller was put through to the owner (``voice.transfer``), who did not pick up: this
        is the call's second stream, before :meth:`attach`."""
        return None

    async def delegated(self, words: str) -> str | None:
        """A full-duplex model's delegated task (the caller's words) this profile answers itself,
        not as a Pepper turn: the result the model gets, or None (the task runs as a turn)."""
        return None

    async def verify_spoken(self, digits: str) -> bool | None:
        """A PIN or code the caller said, handed over by a full-duplex model's delegation: whether
        it proved who they are; None when this profile verifies no one (the task runs as asked)."""
        return None

    def on_speech_started(self, item_id: str | None) -> None:
        """The caller began speaking (``item_id``: the model's item for that speech)."""
        return None

    def on_listening(self) -> None:
        """The opening notice played: the caller's turn."""
        return None

    def caller_text(self, item_id: str, text: str) -> str:
        """What of the caller's speech goes into the transcript and records: by default, every run
        of digits withheld."""
        return withhold_digits(text)

    def on_caller_words(self, item_id: str, text: str) -> None:
        """One transcribed utterance of the caller, as the records keep it (after :meth:`caller_text`)."""
        return None

    def pepper_text(self, text: str) -> str:
        """What of Pepper's speech goes into the transcript and records."""
        return text

    def tool_result(self, outcome: CallOutcome) -> CallOutcome:
        """The outcome the model gets for a tool call (recorded as it ran)."""
        return outcome

    async def after_resolve(self, ids: list[int], *, commit: bool, records: list[dict[str, Any]]) -> None:
        """Staged writes were committed (``commit``) or dropped; ``records`` are their records."""
        return None

    def stats(self) -> dict[str, Any]:
        """The profile's figures, recorded with the call's."""
        return {}

    def stop(self) -> None:
        """The call is over: stop timers (its tasks are cancelled by the engine)."""
        return None

    async def finish(self, summary: str, end_reason: str | None) -> None:
        """After the call's records are written."""
        return None
