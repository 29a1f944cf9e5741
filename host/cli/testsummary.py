"""One closing line for ./run-tests: the style gates', pytest's and
Avocado's counts added up, so a reader (or CI) sees the whole run at a
glance."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from memqual.host.core.errors import BadInput

USAGE = "give pytest's junit XML, Avocado's results directory and, optionally, the style gates' status file"


def _text(path: Path, what: str) -> str:
    """A report that is there must be a readable text file; one that is
    missing is counted by the caller (the step did not run)."""
    if not path.is_file():
        raise BadInput(f"{path}: not a regular file, so no {what}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc})") from exc


def pytest_counts(junit: Path) -> tuple[int, int, int]:
    if not junit.exists():
        return 0, 1, 0  # pytest did not even write its report: count it as a failure
    try:
        root = ET.fromstring(_text(junit, "junit XML"))
    except ET.ParseError as exc:
        raise BadInput(f"{junit}: not junit XML ({exc})") from exc
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def avocado_counts(results_dir: Path) -> tuple[int, int, int]:
    if results_dir.exists() and not results_dir.is_dir():
        raise BadInput(f"{results_dir}: not a directory, so no Avocado results directory")
    files = sorted(results_dir.glob("job-*/results.json"))
    if not files:
        return 0, 1, 0
    try:
        data = json.loads(_text(files[-1], "Avocado results"))
    except ValueError as exc:
        raise BadInput(f"{files[-1]}: not Avocado's results JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise BadInput(f"{files[-1]}: not Avocado's results JSON (no object)")
    # WARN is not PASS: Avocado gives it to a test that passed its asserts
    # but logged a warning the test itself marked as a problem.
    failed = data.get("errors", 0) + data.get("failures", 0) + data.get("interrupt", 0) + data.get("warn", 0)
    return data.get("pass", 0), failed, data.get("skip", 0) + data.get("cancel", 0)


def lint_counts(statuses: Path) -> tuple[int, int, int]:
    """The style gates (ruff check, ruff format --check, lint-imports, mypy), one line
    ``NAME EXIT_STATUS`` each: a gate passed if it exited 0."""
    if not statuses.exists():
        return 0, 1, 0  # the gates did not run: count it as a failure
    lines = [line.strip() for line in _text(statuses, "gate statuses").splitlines() if line.strip()]
    if not lines or not all(re.fullmatch(r"\S+ +\d+", line) for line in lines):
        raise BadInput(f"{statuses}: not the gates' statuses (one 'NAME EXIT_STATUS' line each)")
    exits = [line.rsplit(" ", 1)[-1] for line in lines]
    passed = sum(status == "0" for status in exits)
    return passed, len(exits) - passed, 0


def main(argv: list[str]) -> int:
    """argv: pytest's junit XML, Avocado's results dir and, optionally, the
    style gates' status file."""
    try:
        if not 2 <= len(argv) <= 3:
            raise BadInput(USAGE)
        p = pytest_counts(Path(argv[0]))
        a = avocado_counts(Path(argv[1]))
        lint = lint_counts(Path(argv[2])) if len(argv) > 2 else (0, 0, 0)
    except BadInput as exc:
        print(f"testsummary: error: {exc}", file=sys.stderr)
        return 2
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
