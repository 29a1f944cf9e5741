"""How long a boot may take to answer SSH, counted as its QEMU's work.

On the icount clock QEMU runs its guest on one TCG thread and sleep=off
skips the guest's idle time: a boot is a fixed amount of QEMU's work, and
this machine's load stretches only its wall time.  There the timeout is
QEMU's CPU time, within a wall-clock cap (CPU_CAP_FACTOR times it) for a
guest that stopped without spending CPU.  On the wall clock it is wall
time: there QEMU idles with its guest, and its CPU time would let a stuck
boot run on.  docs/architecture.md, "host/core/machine.py", has figures.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

# The wall-clock cap of a boot whose timeout counts CPU time: a boot three
# times slower than alone is a host at load 6 on 2 cores.
CPU_CAP_FACTOR = 3.0


def process_cpu_seconds(pid: int, proc_root: Path = Path("/proc")) -> float:
    """utime + stime of process ``pid`` (its threads together), in
    seconds; OSError when it is gone."""
    text = (proc_root / str(pid) / "stat").read_text()
    # The command name is in parentheses and may hold spaces: the fields
    # after it start with the state (field 3); utime and stime are 14, 15.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class BootDeadline:
    """A boot's deadline: ``timeout_s`` of wall time from ``started``
    (time.monotonic), or, where ``cpu_of`` is given, ``timeout_s`` of the
    CPU time it reads, within a wall-clock cap."""

    started: float
    timeout_s: float
    cpu_of: Callable[[], float] | None = None

    @classmethod
    def for_boot(
        cls, started: float, timeout_s: float, pid: int | None, icount: bool, from_start: bool = True
    ) -> BootDeadline:
        """The deadline of a boot of QEMU ``pid`` begun at ``started``:
        counted in QEMU's CPU time on the icount clock (since the process
        started, or with ``from_start`` False since now: a guest resumed
        after a save), in wall time otherwise (or without a process)."""
        if not icount or pid is None:
            return cls(started, timeout_s)
        spent = 0.0
        if not from_start:
            try:
                spent = process_cpu_seconds(pid)
            except OSError:
                return cls(started, timeout_s)
        return cls(started, timeout_s, lambda: process_cpu_seconds(pid) - spent)

    @property
    def counts_cpu(self) -> bool:
        return self.cpu_of is not None

    @property
    def wall_deadline(self) -> float:
        """The time.monotonic() past which the boot has failed in any case."""
        return self.started + self.timeout_s * (CPU_CAP_FACTOR if self.counts_cpu else 1.0)

    def cpu_spent(self) -> bool:
        """Whether QEMU has spent the timeout's CPU time (never, on the
        wall clock; a QEMU that is gone has spent nothing more: its exit
        ends the boot on its own)."""
        if self.cpu_of is None:
            return False
        try:
            return self.cpu_of() >= self.timeout_s
        except OSError:
            return False

    def describe(self, now: float | None = None) -> str:
        """What ran out, for the timeout's message: the wall time, QEMU's
        CPU time, or the wall-clock cap before QEMU spent its CPU time."""
        if self.cpu_of is None:
            return f"{self.timeout_s:.0f} s"
        wall = (time.monotonic() if now is None else now) - self.started
        try:
            cpu = self.cpu_of()
        except OSError:
            cpu = float("nan")
        if cpu >= self.timeout_s:
            return f"{self.timeout_s:.0f} s of QEMU's CPU time ({wall:.0f} s of wall time)"
        return (
            f"{wall:.0f} s of wall time, its cap, while QEMU spent {cpu:.1f} s of the {self.timeout_s:.0f} s of CPU "
            "time the boot has on the icount clock"
        )
