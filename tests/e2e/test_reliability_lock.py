"""The host-wide measurement lock of the e2e tests: one exclusive holder
or any number of shared ones at a time across processes, a deadline for the
waiter, released when its holder dies (even by SIGKILL), never followed
through a symlink; GuestTest takes it exclusive unless a test says it
measures nothing, then shared."""

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
from memqual.host.core.errors import Timeout
from memqual.host.core.paths import REPO_ROOT

HOLDER = """
import sys, time
from pathlib import Path
from memqual.e2e.base import MeasurementLock
lock = MeasurementLock(Path(sys.argv[1]))
lock.acquire(5, exclusive=sys.argv[2] == "exclusive")
print("held", flush=True)
time.sleep(600)
"""


def _holder(path: Path, mode: str = "exclusive") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), mode], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
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


@pytest.mark.parametrize(("held", "wanted"), [("exclusive", False), ("shared", True), ("exclusive", True)])
def test_a_measuring_test_never_overlaps_another_test(tmp_path: Path, held: str, wanted: bool) -> None:
    path = tmp_path / "measure.lock"
    holder = _holder(path, held)
    try:
        with pytest.raises(Timeout, match=rf"still held by pid {holder.pid}"):
            MeasurementLock(path).acquire(deadline_s=0.3, poll_s=0.05, exclusive=wanted)
    finally:
        holder.kill()
        holder.wait()


def test_tests_that_measure_nothing_share_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "measure.lock"
    holder = _holder(path, "shared")
    lock = MeasurementLock(path)
    try:
        assert lock.acquire(deadline_s=2, exclusive=False) < 1
    finally:
        lock.release()
        holder.kill()
        holder.wait()
    # Both gone: an exclusive taker gets it at once.
    assert lock.acquire(deadline_s=2) < 1
    lock.release()


def _test_instance(cls: type, name: str) -> Any:
    """In place of an Avocado test instance of ``cls`` running ``name``:
    measures() reads its _testMethodName and that method."""
    from types import SimpleNamespace

    return SimpleNamespace(_testMethodName=name, **{name: getattr(cls, name)})


def test_guest_tests_measure_unless_they_say_otherwise() -> None:
    from memqual.e2e.test_boot import Boot
    from memqual.e2e.test_cleanup import Cleanup, GuestIsolation

    assert GuestTest.measures(_test_instance(Boot, "test_guest_clock_runs_at_the_hosts_rate"))
    assert not GuestTest.measures(_test_instance(Boot, "test_guest_kernel_is_the_image_kernel"))
    assert not GuestTest.measures(_test_instance(GuestIsolation, "test_guest_cannot_reach_a_host_loopback_port"))
    assert GuestTest.measures(_test_instance(Cleanup, "test_sigkill_mid_ksm_then_memqual_restores_the_knobs"))
    assert not GuestTest.measures(_test_instance(Cleanup, "test_ctrl_c_kills_the_guest"))
