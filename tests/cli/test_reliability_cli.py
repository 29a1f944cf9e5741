"""An error memqual did not foresee (a full disk, a failed tool, a bug)
ends ``memqual`` with one line saying what to do and exit status 1; the
traceback only with MEMQUAL_DEBUG=1."""

from __future__ import annotations

import argparse
import errno
import subprocess

import pytest

from memqual.host.cli import main as cli


class _Parser:
    """What main() needs of the parser: a command whose handler raises."""

    def __init__(self, handler: object) -> None:
        self.handler = handler

    def parse_args(self, argv: list[str] | None) -> argparse.Namespace:
        return argparse.Namespace(command="doctor", verbose=False, command_run=self.handler)


def _run_with(handler_error: BaseException, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str]:
    def handler(args: argparse.Namespace) -> int:
        raise handler_error

    monkeypatch.setattr(cli, "build_parser", lambda: _Parser(handler))
    monkeypatch.setattr(cli, "_restore_stale_host_state", lambda command: None)
    monkeypatch.delenv("MEMQUAL_DEBUG", raising=False)
    status = cli.main(["doctor"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "error, words",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/root/.cache/memqual/x"), "free some space"),
        (PermissionError(errno.EACCES, "Permission denied", "/dev/kvm"), "check that path"),
        (subprocess.CalledProcessError(1, ["ldd", "/usr/sbin/dropbear"]), "run it by hand"),
        (subprocess.TimeoutExpired(["dmesg"], 10), "longer than 10 s"),
        (RuntimeError("something\nwith two lines"), "MEMQUAL_DEBUG=1 for the traceback"),
    ],
)
def test_an_unforeseen_error_is_one_line_and_exit_1(error: BaseException, words: str, monkeypatch, capsys) -> None:
    status, err = _run_with(error, monkeypatch, capsys)
    assert status == 1
    assert err.startswith("memqual: error: ") and err.count("\n") == 1
    assert words in err and "Traceback" not in err


def test_memqual_debug_shows_the_traceback(monkeypatch, capsys) -> None:
    def handler(args: argparse.Namespace) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "build_parser", lambda: _Parser(handler))
    monkeypatch.setattr(cli, "_restore_stale_host_state", lambda command: None)
    monkeypatch.setenv("MEMQUAL_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["doctor"])


def test_running_out_of_memory_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    """An input too large for a bound to catch ends as bad input does."""
    status, err = _run_with(MemoryError(), monkeypatch, capsys)
    assert status == 2
    assert err.startswith("memqual: error: out of memory") and err.count("\n") == 1
    assert "Traceback" not in err
