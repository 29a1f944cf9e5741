"""./run-tests' closing line: the style gates, pytest and Avocado added up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memqual.host.cli import testsummary

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="10" failures="1" errors="1" skipped="2"></testsuite></testsuites>
"""


@pytest.fixture
def run(tmp_path: Path) -> Path:
    (tmp_path / "pytest.xml").write_text(JUNIT)
    job = tmp_path / "avocado" / "job-1"
    job.mkdir(parents=True)
    (job / "results.json").write_text(json.dumps({"pass": 5, "errors": 0, "failures": 1, "skip": 1, "cancel": 1}))
    return tmp_path


def test_without_the_gates_the_line_is_pytest_and_avocado(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    testsummary.main([str(run / "pytest.xml"), str(run / "avocado")])
    first, last = capsys.readouterr().out.splitlines()
    assert first.startswith("pytest 6 passed, 2 failed, 2 skipped; avocado 5 passed, 1 failed")
    assert last == "memqual: 11 passed, 3 failed, 4 skipped"


def test_a_failed_gate_is_a_failure(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "lint").write_text("ruff-check 0\nruff-format 1\nmypy 0\n")
    testsummary.main([str(run / "pytest.xml"), str(run / "avocado"), str(run / "lint")])
    first, last = capsys.readouterr().out.splitlines()
    assert first.startswith("lint 2 passed, 1 failed; pytest 6 passed")
    assert last == "memqual: 13 passed, 4 failed, 4 skipped"


def test_gates_that_did_not_run_are_a_failure(run: Path) -> None:
    assert testsummary.lint_counts(run / "missing") == (0, 1, 0)
