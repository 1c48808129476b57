"""A skill file: a short YAML header and plain-language steps.

::

    ---
    name: github-status
    description: Answer a status question about one pull request or issue.
    toolsets: [github]
    model: medium
    rounds: 6
    required: [github]
    ---
    1. Find the pull request or issue that the user means.
    2. Read its current state.
    3. Answer in one or two sentences.

A skill without ``toolsets`` is *inline*: its steps go to the orchestrator, which follows them with
its own tools; ``model`` may move the rest of the turn to a larger tier and ``rounds`` may raise the
turn's round cap (never lower either). A skill with ``toolsets`` runs as a *worker*: a separate run
of the loop with only those tools, on ``model`` (default: the harness's tier), with ``rounds`` as
its own budget. ``required`` names the steps every run must take, each a tool name or a tool set
name (any tool of the set counts); the detector flags a skipped one in the turn record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.errors import InvalidInput

TIERS: tuple[str, ...] = ("small", "medium", "large")
NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
MAX_STEPS_CHARS = 6000


class SkillError(InvalidInput):
    """A skill file that cannot be used; the message says which file and what is wrong."""

    code = "skill-invalid"


class SkillHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=2, max_length=48, pattern=NAME_PATTERN)
    description: str = Field(min_length=8, max_length=160)
    toolsets: tuple[str, ...] = Field(default=(), max_length=8)
    model: Literal["small", "medium", "large"] | None = None
    rounds: int | None = Field(default=None, ge=1, le=24)
    required: tuple[str, ...] = Field(default=(), max_length=12)
    # A worker's report is the reply when it did the whole job (see ``text_loop.skills.runtime``).
    direct_report: bool = True

    @field_validator("description")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = value.strip()
        if "\n" in value:
            raise ValueError("must be one line")
        return value

    @field_validator("toolsets", "required")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import re

        for item in value:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", item):
                raise ValueError(f"{item!r} is not a tool or tool set name (lower case letters, digits, _)")
        if len(set(value)) != len(value):
            raise ValueError("names a tool set or step twice")
        return value


@dataclass(frozen=True)
class Skill:
    """A parsed skill. ``origin`` is ``builtin`` or ``user``; ``source`` names the file or row."""

    header: SkillHeader
    steps: str
    origin: Literal["builtin", "user"]
    source: str
    text: str

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def description(self) -> str:
        return self.header.description

    @property
    def is_worker(self) -> bool:
        return bool(self.header.toolsets)


def _split(text: str, source: str) -> tuple[str, str]:
    normalised = text.replace("\r\n", "\n").lstrip("\ufeff")
    if not normalised.startswith("---\n"):
        raise SkillError(f"skill {source}: must start with a '---' line and a YAML header")
    end = normalised.find("\n---", 3)
    while end != -1 and normalised[end + 4 : end + 5] not in ("", "\n"):
        end = normalised.find("\n---", end + 4)
    if end == -1:
        raise SkillError(f"skill {source}: the YAML header has no closing '---' line")
    return normalised[4:end], normalised[end + 4 :].strip("\n")


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "header"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = f"unknown field (allowed: {', '.join(SkillHeader.model_fields)})"
    return f"{where}: {message}"


def parse_skill(text: str, *, source: str, origin: Literal["builtin", "user"] = "builtin") -> Skill:
    """Parse one skill file. Raises :class:`SkillError` naming ``source`` and the first problem."""
    header_text, steps = _split(text, source)
    try:
        data = yaml.safe_load(header_text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (header line {mark.line + 1})" if mark is not None else ""
        raise SkillError(f"skill {source}: the header is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise SkillError(f"skill {source}: the header must be a YAML mapping of fields")
    try:
        header = SkillHeader.model_validate(data)
    except ValidationError as exc:
        raise SkillError(f"skill {source}: {_first_error(exc)}") from None
    if not steps.strip():
        raise SkillError(f"skill {source}: has no steps after the header")
    if len(steps) > MAX_STEPS_CHARS:
        raise SkillError(f"skill {source}: the steps are too long ({len(steps)} characters, at most {MAX_STEPS_CHARS})")
    return Skill(header, steps.strip(), origin, source, text)
