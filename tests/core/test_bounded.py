"""host/core/bounded.py, fed what each bound is for: an input file larger
than its cap (or one that is no file), a child that prints nothing past
its deadline, a line that never ends and more output than is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput


def test_an_oversize_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as out:
        out.truncate(64 << 20)  # sparse: costs no disk
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match=r"big.json: 67108864 bytes, more than a results file may have \(1 MiB\)"):
            bounded.read_file(big, 1 << 20, "results file", "give a smaller one")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing of it was read


def test_a_file_within_its_cap_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert bounded.read_file(path, 1000, "file", "fix it") == b"x" * 1000
    assert bounded.read_head(path, 10, "file", "fix it") == b"x" * 10


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_what_is_no_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a plain open would block for ever
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(BadInput, match=r"not a regular file|is a directory|no such") as caught:
        bounded.read_file(path, 1 << 20, "file", "fix it")
    assert "\n" not in str(caught.value)


def test_a_file_with_no_size_is_still_read_only_to_its_cap() -> None:
    # /proc files say 0 bytes and give more: the read stops at the cap + 1
    with pytest.raises(BadInput, match="more than a file may have"):
        bounded.read_file("/proc/self/maps", 16, "file", "fix it")


def _child(code: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def test_the_deadline_holds_while_the_child_is_silent() -> None:
    proc = _child("import time; time.sleep(30)")
    started = time.monotonic()
    try:
        with pytest.raises(bounded.Overdue):
            bounded.collect(proc, time.monotonic() + 0.2)
        assert time.monotonic() - started < 1.0
    finally:
        proc.kill()
        proc.wait()


def test_an_endless_line_keeps_line_max_bytes() -> None:
    # 20 MB with no newline: a line reader would hold all of it
    proc = _child("import sys; [sys.stdout.buffer.write(b'x' * 65536) for _ in range(320)]")
    lines: list[str] = []
    done = bounded.collect(proc, time.monotonic() + 30, on_line=lines.append, keep=4096)
    assert done.returncode == 0
    (line,) = lines
    assert line.startswith("x" * bounded.LINE_MAX) and len(line) < bounded.LINE_MAX + 100
    assert line.endswith(f"[{320 * 65536 - bounded.LINE_MAX} bytes of this line left out]")
    assert len(done.stdout) < 4096 + 100 and done.stdout.startswith(f"[{320 * 65536 - 4096} bytes left out]\n")


def test_each_stream_keeps_its_tail_and_stdin_is_fed() -> None:
    code = (
        "import sys; data = sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(b'a' * 3_000_000 + b'END'); sys.stderr.write(str(len(data)))"
    )
    proc = _child(code, stdin=subprocess.PIPE)
    done = bounded.collect(proc, time.monotonic() + 30, input=b"i" * 1_000_000, keep=1000)
    assert done.stdout.endswith("a" * 997 + "END") and len(done.stdout) < 1100
    assert done.stderr == "1000000"


def test_lines_come_whole_across_chunks() -> None:
    lines = bounded.Lines(line_max=8)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"c\nde") == ["abc"]
    assert lines.feed(b"fghijklmn\nz") == ["defghijk [3 bytes of this line left out]"]
    assert lines.end() == ["z"]
