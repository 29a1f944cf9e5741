"""How a test checks bad input: one line on stderr, exit status 2, nothing
left running; and a command run in-process for errors found before
anything starts."""

from __future__ import annotations

import pytest

from memqual.host.cli import main as cli


def assert_one_line_error(result: dict, *fragments: str) -> str:
    assert result["left"] == [], f"left running: {result['left']}"
    assert result["status"] == 2, result
    assert "Traceback" not in result["stderr"]
    lines = result["stderr"].splitlines()
    assert len(lines) == 1, result["stderr"]
    (line,) = lines
    assert line.startswith("memqual: error: ")
    for fragment in fragments:
        assert fragment in line
    return line


def in_process(
    args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict:
    """The same checks without a subprocess, for errors found before
    anything is started (faster: no interpreter start-up)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MEMQUAL_DEBUG", raising=False)
    try:
        status = cli.main(args)
    except SystemExit as exc:  # argparse
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return {"status": status, "stderr": captured.err, "stdout": captured.out, "left": []}
