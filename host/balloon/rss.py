"""QEMU's resident memory (VmRSS): read it, wait for it to fall or settle.
What free page reporting and a balloon inflate give back to the host."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from memqual.host.core.errors import GuestError
from memqual.host.core.polling import poll
from memqual.host.core.shell import Shell

# A reading in L1 is one short command over its SSH; L1 runs under TCG.
L1_READ_TIMEOUT_S = 30.0


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (QEMU's resident memory)."""
    status = Path(f"/proc/{pid}/status")
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError as exc:
        raise GuestError(f"process {pid} is gone: cannot read its RSS") from exc
    raise GuestError(f"{status} has no VmRSS line")


def parse_vm_rss_kib(status: str, where: str) -> int:
    """The VmRSS of a /proc/PID/status text, in KiB."""
    for line in status.splitlines():
        if line.startswith("VmRSS:") and len(line.split()) >= 2 and line.split()[1].isdigit():
            return int(line.split()[1])
    raise GuestError(f"{where} has no VmRSS line: {status[:200]!r}")


def l1_rss_reader(shell: Shell, pid: int) -> Callable[[], int]:
    """VmRSS of process ``pid`` of a host under test (L1), read over its
    shell: under a host under test the guest's QEMU, whose memory a balloon
    gives back, runs in L1, and this machine's QEMU is L1's."""
    where = f"the host under test's /proc/{pid}/status"

    def read() -> int:
        out = shell.run(["cat", f"/proc/{pid}/status"], timeout=L1_READ_TIMEOUT_S, check=False)
        if out.status != 0:
            raise GuestError(f"process {pid} of the host under test is gone: cannot read its RSS")
        return parse_vm_rss_kib(out.stdout, where)

    return read


def wait_rss(
    pid: int,
    predicate: Callable[[int], bool],
    deadline_s: float,
    period_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    read: Callable[[int], int] = rss_kib,
) -> tuple[bool, int, float]:
    """Poll QEMU's RSS until ``predicate(rss_kib)`` or the deadline.
    Returns (met, last rss KiB, seconds waited)."""
    polled = poll(
        lambda: read(pid),
        deadline_s,
        period_s,
        what="QEMU's RSS",
        until=predicate,
        clock=clock,
        sleep=sleep,
        raise_on_timeout=False,
    )
    return polled.met, polled.value, polled.elapsed_s


def wait_rss_steady(
    pid: int,
    quiet_s: float = 1.0,
    deadline_s: float = 20.0,
    tolerance: float = 0.01,
    period_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    read: Callable[[int], int] = rss_kib,
) -> tuple[bool, int, float]:
    """Poll QEMU's RSS until it has stayed within ``tolerance`` (relative)
    for ``quiet_s``: the baseline a later rise and fall is measured against.
    Returns (steady, last rss KiB, seconds waited); not steady at the deadline
    is the caller's to judge (the RSS is still moving)."""
    anchor: int | None = None
    anchor_t = 0.0

    def steady() -> tuple[bool, int]:
        nonlocal anchor, anchor_t
        rss, now = read(pid), clock()
        if anchor is None or abs(rss - anchor) > tolerance * anchor:
            anchor, anchor_t = rss, now
            return False, rss
        return now - anchor_t >= quiet_s, rss

    polled = poll(
        steady,
        deadline_s,
        period_s,
        what="a steady RSS",
        until=lambda seen: seen[0],
        clock=clock,
        sleep=sleep,
        raise_on_timeout=False,
    )
    return polled.met, polled.value[1], polled.elapsed_s
