"""What a build step prints, read within bounds (host/core/bounded.py)
by both readers of the build user's steps: ``compile_kernel`` (make's
progress) and ``unprivileged.run``.  A silent step ends at its deadline;
an endless line and a flood of output keep a capped amount."""

from __future__ import annotations

import subprocess
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput
from memqual.images import kernel_build as kb
from memqual.images import unprivileged

USER = unprivileged.BuildUser("nobody", 65534, 65534)
FLOOD = 30_000_000  # bytes a step prints


def _as_make(monkeypatch: pytest.MonkeyPatch, script: str) -> list[subprocess.Popen[bytes]]:
    """compile_kernel's make replaced by ``script``, started as
    unprivileged.popen starts a step (its own session, stderr on stdout)."""
    started: list[subprocess.Popen[bytes]] = []

    def popen(user: Any, argv: Any, cwd: Any, home: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        started.append(proc)
        return proc

    monkeypatch.setattr(unprivileged, "popen", popen)
    monkeypatch.setattr(kb, "build_env", lambda user: {})
    return started


def test_a_silent_make_ends_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _as_make(monkeypatch, "sleep 5")
    monkeypatch.setattr(kb, "COMPILE_TIMEOUT_S", 0.2)
    begun = time.monotonic()
    with pytest.raises(BadInput, match="the kernel build did not finish in"):
        kb.compile_kernel(USER, tmp_path, 1, kb.Progress(10, say=lambda _: None))
    assert time.monotonic() - begun < 1.5
    assert started[0].poll() is not None  # ended, not left running


def test_an_endless_line_from_make_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_make(monkeypatch, f"head -c {FLOOD} /dev/zero | tr '\\0' x; exit 2")
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match=r"^the kernel build failed: x{200}$"):
            kb.compile_kernel(USER, tmp_path, 1, kb.Progress(10, say=lambda _: None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tail = capsys.readouterr().err
    assert tail.startswith("x" * bounded.LINE_MAX)
    assert len(tail) < bounded.LINE_MAX + 100
    assert f"[{FLOOD - bounded.LINE_MAX} bytes of this line left out]" in tail
    assert peak < 4 << 20


@pytest.fixture
def as_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build step run as the caller: what is read of it is the point."""
    monkeypatch.setattr(unprivileged, "as_user", lambda uid, gid, argv, confined_to=None: list(argv))


def test_a_step_that_floods_keeps_its_tail(tmp_path: Path, as_caller: None) -> None:
    script = f"head -c {FLOOD} /dev/zero | tr '\\0' x; echo; echo last line; echo oops >&2"
    proc = unprivileged.run(USER, ["sh", "-c", script], tmp_path, tmp_path)
    assert proc.returncode == 0
    assert len(proc.stdout) < bounded.TAIL_MAX + 100 < FLOOD
    assert proc.stdout.endswith("x\nlast line\n")
    assert proc.stdout.startswith(f"[{FLOOD + 11 - bounded.TAIL_MAX} bytes left out]\n")
    assert proc.stderr == "oops\n"


def test_a_silent_step_ends_at_its_deadline(tmp_path: Path, as_caller: None) -> None:
    begun = time.monotonic()
    with pytest.raises(BadInput, match="sleep 5 did not finish in 0.2 s"):
        unprivileged.run(USER, ["sleep", "5"], tmp_path, tmp_path, timeout=0.2)
    assert time.monotonic() - begun < 1.5


def test_a_step_still_gets_its_input(tmp_path: Path, as_caller: None) -> None:
    proc = unprivileged.run(USER, ["wc", "-c"], tmp_path, tmp_path, stdin=b"y" * 3_000_000)
    assert proc.stdout.strip() == "3000000"
