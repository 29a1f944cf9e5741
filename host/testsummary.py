"""One closing line for ./run-tests: pytest's and Avocado's counts added
up, so a reader (or CI) sees the whole run at a glance."""

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


def main(argv: list[str]) -> int:
    p = pytest_counts(Path(argv[0]))
    a = avocado_counts(Path(argv[1]))
    print(
        f"pytest {p[0]} passed, {p[1]} failed, {p[2]} skipped; avocado {a[0]} passed, {a[1]} failed, "
        f"{a[2]} skipped (cancelled)"
    )
    print(f"memqual: {p[0] + a[0]} passed, {p[1] + a[1]} failed, {p[2] + a[2]} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
