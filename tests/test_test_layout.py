"""The test tree's own rule: test modules are imported by their file name alone (pytest's default
``prepend`` mode, no ``__init__.py``), so two with the same name in different folders stop the
whole run at collection. A subset run does not notice; this does."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_module_and_helper_has_its_own_name():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert [name for name, count in names.items() if count > 1] == []
