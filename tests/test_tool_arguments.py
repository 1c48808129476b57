"""Tool arguments are checked against the tool's whole JSON Schema before the gate sees them."""

from __future__ import annotations

import pytest

from core.tools.registry import check_arguments

SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
        "when": {"type": "object", "properties": {"start": {"type": "string"}}, "required": ["start"],
                 "additionalProperties": False},
        "count": {"type": "integer", "minimum": 1},
        "mode": {"enum": ["draft", "send"]},
    },
    "required": ["to"],
    "additionalProperties": False,
}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ("not an object", "arguments must be a JSON object"),
        ({}, "missing required argument 'to'"),
        ({"to": [], "bcc": ["x@evil.example"]}, "unknown argument 'bcc'"),
        # Inside nested values too: the hand-written check before jsonschema looked at the top level only.
        ({"to": ["a@example.org", 7]}, "argument 'to.1': 7 is not of type 'string'"),
        ({"to": ["a", "b", "c", "d"]}, "argument 'to': ['a', 'b', 'c', 'd'] is too long"),
        ({"to": [], "when": {"start": "9", "attendees": ["x"]}}, "unknown argument 'when.attendees'"),
        ({"to": [], "when": {}}, "missing required argument 'when.start'"),
        ({"to": [], "count": True}, "argument 'count': True is not of type 'integer'"),
        ({"to": [], "mode": "broadcast"}, "argument 'mode': 'broadcast' is not one of ['draft', 'send']"),
    ],
)
def test_arguments_that_break_the_schema_are_refused_with_the_reason(args, reason):
    assert check_arguments(SCHEMA, args) == reason


def test_arguments_that_fit_pass_and_a_long_reason_is_cut():
    assert check_arguments(SCHEMA, {"to": ("a@example.org",), "when": {"start": "9"}, "count": 2}) is None
    reason = check_arguments(SCHEMA, {"to": ["x" * 500]})
    assert reason is not None and len(reason) <= 160 and reason.endswith("...")
