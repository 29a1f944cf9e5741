"""``memqual ... | head -1``: a reader that stops reading ends memqual
quietly with 141 (128 + SIGPIPE), whichever way the subcommand prints
(rich's Console, print)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memqual.host.core.paths import REPO_ROOT

MODEL = ["memslots", "model", "--layout", "seed-3", "--workload", "miss"]


def _memqual_into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before memqual writes a byte
    try:
        return subprocess.run(
            [sys.executable, "-m", "memqual.host.cli.main", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [MODEL, [*MODEL, "--json"]], ids=["rich table", "print"])
def test_a_closed_stdout_ends_quietly_with_141(argv):
    done = _memqual_into_a_closed_pipe(*argv)
    assert done.stderr.decode() == ""
    assert done.returncode == 141


def test_help_into_a_closed_stdout_is_quiet_too():
    done = _memqual_into_a_closed_pipe("--help")
    assert done.stderr.decode() == ""
    assert done.returncode == 0  # argparse ignores a failed write of its help itself


def test_a_reader_that_reads_a_line_and_closes_gets_it_and_memqual_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "memqual.host.cli.main", *MODEL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # as head -1 does
    status = proc.wait(timeout=120)
    assert first.startswith(b"memslot lookups")
    # All of the table may have fitted in the pipe before the close: 0 then.
    assert status in (0, 141) and proc.stderr.read() == b""
