"""The host-wide measurement lock of the e2e tests: one holder at a time
across processes, a deadline for the waiter, released when its holder dies
(even by SIGKILL), never followed through a symlink; GuestTest takes it
unless a test says it measures nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from memqual.e2e.base import GuestTest, MeasurementLock
from memqual.host.errors import Timeout
from memqual.host.paths import REPO_ROOT

HOLDER = """
import sys, time
from pathlib import Path
from memqual.e2e.base import MeasurementLock
lock = MeasurementLock(Path(sys.argv[1]))
lock.acquire(5)
print("held", flush=True)
time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_taker_waits_until_its_deadline_and_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "measure.lock"
    holder = _holder(path)
    try:
        started = time.monotonic()
        with pytest.raises(Timeout, match=rf"still held by pid {holder.pid} after 1 s"):
            MeasurementLock(path).acquire(deadline_s=1.0, poll_s=0.05)
        assert 1.0 <= time.monotonic() - started < 3
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_free_again_when_its_holder_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "measure.lock"
    holder = _holder(path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = MeasurementLock(path)
    assert lock.acquire(deadline_s=2) < 1
    assert lock.holder() == os.getpid()
    lock.release()


def test_a_symlinked_lock_file_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "measure.lock").symlink_to(victim)
    with pytest.raises(OSError):
        MeasurementLock(tmp_path / "measure.lock").acquire(deadline_s=1)
    assert victim.read_text() == "precious\n"


def test_the_default_lock_sits_beside_the_ksm_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQUAL_STATE_DIR", str(tmp_path / "state"))
    assert MeasurementLock().path == tmp_path / "state" / "measure.lock"


def _test_instance(**fields: str) -> Any:
    """In place of an Avocado test instance: measures() reads at most its
    _testMethodName."""
    from types import SimpleNamespace

    return SimpleNamespace(**fields)


def test_guest_tests_measure_unless_they_say_otherwise() -> None:
    from memqual.e2e.test_cleanup import Cleanup, GuestIsolation

    assert GuestTest.measures(_test_instance())
    assert not GuestIsolation.measures(_test_instance())
    assert Cleanup.measures(_test_instance(_testMethodName="test_sigkill_mid_ksm_then_memqual_restores_the_knobs"))
    assert not Cleanup.measures(_test_instance(_testMethodName="test_ctrl_c_kills_the_guest"))
