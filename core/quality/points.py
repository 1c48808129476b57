"""The judge's seven points and its three grades."""

POINTS: tuple[str, ...] = (
    "tool_choice", "tool_arguments", "grounding", "completeness", "honesty", "tone", "safety",
)  # fmt: skip
GRADES = frozenset({"pass", "fail", "n/a"})
