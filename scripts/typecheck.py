"""Run mypy over the product packages and hold each package's error count to its baseline.

Strict modules (``[[tool.mypy.overrides]]`` in pyproject.toml) must have no error at all; every
other package may have at most the errors ``typecheck-baseline.json`` records for it, so the count
can only fall. When a package does better than its baseline, the run says so: lower the baseline
in the same commit (``--update`` writes the current counts).

Usage: python scripts/typecheck.py [--update]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "typecheck-baseline.json"
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+: error: ")


def strict_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return [m for override in config.get("overrides", []) for m in override["module"]]


def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def main() -> int:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if run.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        sys.stdout.write(run.stdout + run.stderr)
        return 2
    errors = [line for line in run.stdout.splitlines() if ERROR.match(line)]
    strict = set(strict_modules())
    in_strict = [line for line in errors if module_of(ERROR.match(line)["path"]) in strict]  # type: ignore[index]
    counts = Counter(ERROR.match(line)["path"].split("/", 1)[0] for line in errors)  # type: ignore[index]
    if "--update" in sys.argv:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=2) + "\n")
        print(f"typecheck: baseline written ({sum(counts.values())} errors)")
        return 0
    baseline: dict[str, int] = json.loads(BASELINE.read_text())
    failed = False
    for line in in_strict:
        print(line)
    if in_strict:
        print(f"typecheck: {len(in_strict)} errors in strict modules ({', '.join(sorted(strict))})")
        failed = True
    for package in sorted(set(counts) | set(baseline)):
        now, allowed = counts.get(package, 0), baseline.get(package, 0)
        if now > allowed:
            for line in errors:
                if line.startswith(package + "/"):
                    print(line)
            print(f"typecheck: {package} has {now} type errors, its baseline {allowed}: fix the new ones")
            failed = True
        elif now < allowed:
            print(f"typecheck: {package} is down to {now} type errors from {allowed}: lower its baseline"
                  " (python scripts/typecheck.py --update)")  # fmt: skip
    if not failed:
        print(f"typecheck: ok ({sum(counts.values())} errors, none new; strict modules clean)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
