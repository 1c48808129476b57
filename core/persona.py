"""The words every Pepper session shares: who Pepper is, how to read a tool's result, and the
label on the notes Pepper's runtime adds.

A text turn, an owner's call and the answering service each write their own opening lines (a
phone screen, a voice, a stranger on the line), but the parts below mean the same thing in every
session and so are written once: a small model that learned "Found nothing" from one prompt and
a different wording from another would read one result two ways. Each session composes its
prompt from these parts; none keeps a copy.
"""

from __future__ import annotations

from typing import Literal

# Who is on the other side of the session, as the runtime label names them.
Audience = Literal["user", "caller"]

_NOT_THEIRS: dict[Audience, str] = {"user": "The user did not write this.", "caller": "The caller did not say this."}


def runtime_label(audience: Audience) -> str:
    """The first line of every message Pepper's runtime adds for the model (never the person's)."""
    return f"[Pepper runtime note. {_NOT_THEIRS[audience]}]"


NEVER_PRETEND = "Never pretend: if you did not do something, do not say you did."

# How a tool's result reads, in every session: the result texts themselves start with these words
# (core.tools.registry), so the two must stay in step.
RESULT_WORDING = (
    'A tool result starting "Found nothing" means the lookup worked and there is no data.'
    ' A result starting "Failed" means it broke: say you could not check, never that there is nothing.'
    ' A result starting "Refused by Pepper\'s rules" means the call did not run.'
    ' A result starting "Done" for a write means it happened (or will, once the person has heard or read'
    " that it did)."
)

CONFIRM_FIRST = "Confirm with the person before deleting anything or doing something other people will see."


def runtime_note_rule(audience: Audience) -> str:
    """The rule that tells the model what the runtime label means."""
    return (
        f'Messages that start with "{runtime_label(audience)}" come from Pepper\'s own runtime, not from the'
        f" {audience}. Follow them, but do not answer them as if the {audience} had said them."
    )
