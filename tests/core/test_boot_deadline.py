"""A boot's deadline: wall time, or on icount QEMU's CPU time within a cap."""

from __future__ import annotations

import os
import time

import pytest

from memqual.host.core.boot_deadline import CPU_CAP_FACTOR, BootDeadline, process_cpu_seconds


def gone() -> float:
    raise FileNotFoundError("/proc/1234/stat")


@pytest.mark.parametrize(
    ("cpu", "spent", "says"),
    [
        (None, False, "90 s"),  # the wall clock: the timeout is wall time
        (lambda: 89.9, False, "its cap, while QEMU spent 89.9 s of the 90 s"),
        (lambda: 90.0, True, "90 s of QEMU's CPU time (30 s of wall time)"),
        (gone, False, "spent nan s"),  # QEMU gone: its exit ends the boot, not this
    ],
)
def test_a_boot_on_icount_has_spent_its_time_when_qemu_has_spent_the_cpu(cpu, spent, says) -> None:
    deadline = BootDeadline(started=100.0, timeout_s=90.0, cpu_of=cpu)
    assert deadline.cpu_spent() is spent
    assert says in deadline.describe(now=130.0)
    factor = CPU_CAP_FACTOR if cpu is not None else 1.0
    assert deadline.wall_deadline == 100.0 + 90.0 * factor


@pytest.mark.parametrize(("pid", "icount", "counts_cpu"), [(1, True, True), (1, False, False), (None, True, False)])
def test_only_an_icount_boot_of_a_process_counts_its_cpu(pid, icount, counts_cpu) -> None:
    assert BootDeadline.for_boot(0.0, 90.0, pid, icount).counts_cpu is counts_cpu


def test_a_process_s_cpu_time_is_its_utime_and_stime(tmp_path) -> None:
    # A command name with spaces and a parenthesis, as /proc writes it.
    (tmp_path / "42").mkdir()
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30
    (tmp_path / "42" / "stat").write_text("42 (qemu (x) y) " + " ".join(fields) + "\n")
    assert process_cpu_seconds(42, tmp_path) == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))
    assert process_cpu_seconds(os.getpid()) >= 0


def test_a_resumed_guest_s_cpu_time_counts_from_the_resume() -> None:
    """After a save the same QEMU goes on: the boot it made is not the
    resume's."""
    pid = os.getpid()
    spent = process_cpu_seconds(pid)
    deadline = time.monotonic() + 10
    burnt = 0
    while process_cpu_seconds(pid) < spent + 0.05 and time.monotonic() < deadline:
        burnt += 1  # this process's own CPU stands in for QEMU's
    from_start = BootDeadline.for_boot(0.0, 90.0, pid, icount=True)
    resumed = BootDeadline.for_boot(0.0, 90.0, pid, icount=True, from_start=False)
    assert from_start.cpu_of is not None and resumed.cpu_of is not None
    assert from_start.cpu_of() >= spent + 0.05
    assert resumed.cpu_of() < 0.05
