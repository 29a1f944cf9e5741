"""One closing line for ./run-tests: the style gates', pytest's and
Avocado's counts added up, so a reader (or CI) sees the whole run at a
glance."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def pytest_counts(junit: Path) -> tuple[int, int, int]:
    if not junit.exists():
        return 0, 1, 0  # pytest did not even write its report: count it as a failure
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def avocado_counts(results_dir: Path) -> tuple[int, int, int]:
    files = sorted(results_dir.glob("job-*/results.json"))
    if not files:
        return 0, 1, 0
    data = json.loads(files[-1].read_text())
    # WARN is not PASS: Avocado gives it to a test that passed its asserts
    # but logged a warning the test itself marked as a problem.
    failed = data.get("errors", 0) + data.get("failures", 0) + data.get("interrupt", 0) + data.get("warn", 0)
    return data.get("pass", 0), failed, data.get("skip", 0) + data.get("cancel", 0)


def lint_counts(statuses: Path) -> tuple[int, int, int]:
    """The style gates (ruff check, ruff format --check, mypy), one line
    ``NAME EXIT_STATUS`` each: a gate passed if it exited 0."""
    if not statuses.exists():
        return 0, 1, 0  # the gates did not run: count it as a failure
    exits = [line.rsplit(" ", 1)[-1] for line in statuses.read_text().splitlines() if line.strip()]
    passed = sum(status == "0" for status in exits)
    return passed, len(exits) - passed, 0


def main(argv: list[str]) -> int:
    """argv: pytest's junit XML, Avocado's results dir and, optionally, the
    style gates' status file."""
    p = pytest_counts(Path(argv[0]))
    a = avocado_counts(Path(argv[1]))
    lint = lint_counts(Path(argv[2])) if len(argv) > 2 else (0, 0, 0)
    print(
        (f"lint {lint[0]} passed, {lint[1]} failed; " if len(argv) > 2 else "")
        + f"pytest {p[0]} passed, {p[1]} failed, {p[2]} skipped; avocado {a[0]} passed, {a[1]} failed, "
        f"{a[2]} skipped (cancelled)"
    )
    total = [lint[i] + p[i] + a[i] for i in range(3)]
    print(f"memqual: {total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
