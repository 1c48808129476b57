"""The shared session words: the prompt's description of tool results must match what the runner
actually writes, and every session's prompt carries the one wording."""

from core import persona
from core.tools.runner import render_denied, render_empty, render_failed
from text_loop import prompt


def _opening(result: str) -> str:
    return result.split(":", 1)[0]


def test_the_result_wording_names_the_words_results_really_start_with():
    for result in (render_empty("no notes"), render_failed("timeout"), render_denied("not allowed")):
        assert f'"{_opening(result)}"' in persona.RESULT_WORDING, result


def test_the_text_turn_prompt_carries_the_shared_wording_and_label():
    assert persona.RESULT_WORDING in prompt.RULES
    assert persona.runtime_note_rule("user") in prompt.RULES
    assert prompt.LABEL == persona.runtime_label("user")
    assert persona.runtime_label("caller") != persona.runtime_label("user")


def test_every_call_prompt_carries_the_same_wording_and_the_callers_label():
    from answering_service.profile import PROFILE_TEXT
    from voice import owner_profile, profile

    answering = PROFILE_TEXT.format(owner="Ada", booking="", booking_short="")
    for text in (owner_profile.PERSONA, answering):
        assert persona.RESULT_WORDING in text
        assert persona.NEVER_PRETEND in text
        assert persona.runtime_note_rule("caller") in text
    assert profile.LABEL == persona.runtime_label("caller")
