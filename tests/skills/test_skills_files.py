"""Every shipped skill parses and names only real tool sets; bad files get one clear error."""

from __future__ import annotations

import pytest

from core.tools import ToolRegistry
from core.tools.starter import starter_registry
from text_loop.skills import TOOLSETS, SkillCatalog, SkillError, SkillLimits, limit_problem, parse_skill
from text_loop.skills.catalog import shipped_skill_files


def test_every_shipped_skill_parses_and_names_known_tool_sets():
    files = shipped_skill_files()
    assert len(files) >= 12
    catalog = SkillCatalog.load_builtin()
    assert catalog.problems == []
    assert len(catalog.builtins) == len(files)
    for name, _ in files:
        skill = catalog.get(name.removesuffix(".md"))
        assert skill is not None, f"{name}: the file name must be the skill's name"
        assert limit_problem(skill, catalog.limits) is None, name
        for step in skill.header.required:
            assert step in TOOLSETS, f"{name}: required steps of shipped skills name tool sets, not tools"


def test_the_shipped_skills_cover_the_feature_areas_and_the_voice_product():
    catalog = SkillCatalog.load_builtin()
    names = set(catalog.builtins)
    expected = {
        "morning-brief", "plan-my-day", "book-appointment", "reschedule", "inbox-triage", "draft-reply",
        "answering-follow-up", "add-reminder", "weekly-review", "find-conversation",
    }  # fmt: skip
    assert expected <= names
    used = {t for s in catalog.builtins.values() for t in (*s.header.toolsets, *s.header.required)}
    assert {"calendar", "email", "todos", "contacts", "feeds", "reminders", "memory", "answering", "tasks"} <= used
    assert any(not s.is_worker for s in catalog.builtins.values()) and any(
        s.is_worker for s in catalog.builtins.values()
    )


def test_shipped_skills_whose_tool_sets_are_missing_are_reported_not_dropped_silently():
    catalog = SkillCatalog.load_builtin()
    registry = ToolRegistry([t for t in starter_registry().all() if t.area != "calendar"])  # no calendar area
    report = {p.skill: p.problem for p in catalog.report(registry)}
    assert report["book-appointment"] == "the calendar tool set is not installed (no tools of area calendar)"
    view = catalog.view(registry)
    assert "book-appointment" not in view.skills
    assert any(p.skill == "book-appointment" for p in view.problems)
    assert "remember-this" in view.skills  # its dossier step can be taken here


GOOD = "---\nname: tidy\ndescription: Tidy up the todo list.\ntoolsets: [todos]\nmodel: medium\n---\n1. List.\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: tidy\n1. List.", "must start with a '---' line"),
        ("---\nname: tidy\n1. List.\n", "the YAML header has no closing '---' line"),
        ("---\nname: [tidy\n---\n1. List.\n", "the header is not valid YAML (header line 1)"),
        ("---\n- a\n---\n1. List.\n", "the header must be a YAML mapping of fields"),
        ("---\nname: tidy\ndescription: Tidy up the todo list.\n---\n", "has no steps after the header"),
        ("---\nname: Tidy Up\ndescription: Tidy up the todo list.\n---\n1. x\n", "name: String should match"),
        ("---\nname: tidy\ndescription: x\n---\n1. x\n", "description: String should have at least 8"),
        (
            "---\nname: tidy\ndescription: |\n  Tidy up the list.\n  More.\n---\n1. x\n",
            "description: Value error, must be one line",
        ),
        ("---\nname: tidy\ndescription: Tidy up the list.\nmodel: huge\n---\n1. x\n", "model: Input should be"),
        ("---\nname: tidy\ndescription: Tidy up the list.\nrounds: 0\n---\n1. x\n", "rounds: Input should be"),
        ("---\nname: tidy\ndescription: Tidy up the list.\ntools: [a]\n---\n1. x\n", "tools: unknown field"),
        ("---\nname: tidy\ndescription: Tidy up the list.\nrequired: [a, a]\n---\n1. x\n", "twice"),
    ],
)
def test_a_bad_skill_file_gets_one_clear_error(text, message):
    with pytest.raises(SkillError) as caught:
        parse_skill(text, source="tidy.md")
    assert caught.value.message.startswith("skill tidy.md: ")
    assert message in caught.value.message


def test_a_good_file_parses_with_its_header_and_steps():
    skill = parse_skill(GOOD.replace("\n", "\r\n"), source="tidy.md")
    assert (skill.name, skill.header.toolsets, skill.header.model, skill.steps) == (
        "tidy",
        ("todos",),
        "medium",
        "1. List.",
    )
    assert skill.is_worker and skill.header.direct_report


def test_user_skills_get_fewer_tool_sets_and_less_than_shipped_ones():
    limits = SkillLimits()
    three = "---\nname: big\ndescription: Three tool sets at once.\ntoolsets: [todos, notes, calendar]\n---\n1. x\n"
    assert limit_problem(parse_skill(three, source="a", origin="builtin"), limits) is None
    assert "at most 2" in limit_problem(parse_skill(three, source="a", origin="user"), limits)
    email = "---\nname: mail\ndescription: Read the mail for me.\ntoolsets: [email]\n---\n1. x\n"
    assert limit_problem(parse_skill(email, source="a", origin="user"), limits) == (
        "a skill you write may not use the email tool set"
    )
    large = "---\nname: think\ndescription: Think very hard.\nmodel: large\n---\n1. x\n"
    assert "up to medium" in limit_problem(parse_skill(large, source="a", origin="user"), limits)
    unknown = "---\nname: gh\ndescription: GitLab things here.\ntoolsets: [gitlab]\n---\n1. x\n"
    assert "does not exist: 'gitlab'" in limit_problem(parse_skill(unknown, source="a"), limits)
