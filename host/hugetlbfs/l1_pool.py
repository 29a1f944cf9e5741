"""The huge page pool of a host under test (L1, host/core/nested.py): the
pages reserved at L1's boot, the mount guest/rc.host makes on them, and
the pool's counters read from L1's sysfs over its SSH.

At L1's boot, not later: rc.host starts the guest's QEMU as soon as L1 is
up, and QEMU maps all guest RAM from the mount at once, so the pages must
be there before it starts (``hugepages=N`` on L1's command line, a boot
knob of ``HostUnderTest``).  No knob to put back and no lock: L1 ends
with its guest.  docs/host-under-test.md, "The hugetlbfs balloon on L1's
pool"."""

from __future__ import annotations

from pathlib import Path

from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.nested import L1_OVERHEAD_MIB
from memqual.host.core.shell import Shell
from memqual.host.hugetlbfs.pool import PAGE_KIB, PoolCounts, Reservation, pages_for

# Where guest/rc.host mounts hugetlbfs when L1 booted with a pool (the
# script names the same path).
L1_MOUNT = Path("/dev/hugepages")
POOL_DIR = "/sys/kernel/mm/hugepages/hugepages-2048kB"
COUNTERS = ("nr_hugepages", "free_hugepages", "resv_hugepages", "surplus_hugepages")
COMMAND_TIMEOUT_S = 60.0
# One reading, one command: each counter of the directory $1 as "name value".
_READ = 'cd "$1" && shift && for f in "$@"; do read -r v <"$f" && echo "$f $v"; done'


def boot_knob(guest_mib: int, pages: int) -> str:
    """L1's command-line word that reserves ``pages`` 2 MiB pages for a
    guest of ``guest_mib``.  L1 has the guest's memory and
    L1_OVERHEAD_MIB for itself (its initramfs, the guest's QEMU, its
    kernel): the pool takes the guest's share, never L1's own, else L1
    runs out of memory under its guest.  BadInput when it would not fit."""
    if pages < 1:
        raise BadInput(f"a huge page pool in L1 of {pages} pages: give at least one")
    fits = pages_for(guest_mib)
    if pages > fits:
        raise BadInput(
            f"a huge page pool of {pages} 2 MiB pages ({pages * PAGE_KIB // 1024} MiB) does not fit L1: it has "
            f"{guest_mib} MiB for its guest beside its own {L1_OVERHEAD_MIB} MiB; give at most {fits} pages"
        )
    return f"hugepages={pages}"


def reservation(guest_mib: int) -> Reservation:
    """What L1's boot reserves for a guest of ``guest_mib`` on hugetlbfs:
    its RAM in whole pages, on L1_MOUNT, L1 having had no pool before."""
    return Reservation(pages_for(guest_mib), L1_MOUNT, PoolCounts(0, 0, 0, 0))


class L1Pool:
    """L1's pool as the scenarios read it (the ``HugePool`` Protocol)."""

    def __init__(self, shell: Shell, root: str = POOL_DIR) -> None:
        self.shell = shell
        self.root = root

    def read_pool(self) -> PoolCounts:
        out = self.shell.run(["sh", "-c", _READ, "pool", self.root, *COUNTERS], timeout=COMMAND_TIMEOUT_S, check=False)
        return parse_pool(out.stdout)

    def free_pages(self) -> int:
        # One file, no shell: the reading between a touch and an inflate
        # costs L1 as little as it can.
        out = self.shell.run(["cat", f"{self.root}/free_hugepages"], timeout=COMMAND_TIMEOUT_S, check=False)
        text = out.stdout.strip()
        if out.status != 0 or not text.isdigit():
            raise GuestError(f"the host under test's free huge pages: not a count: {text[:100]!r}")
        return int(text)


def parse_pool(text: str) -> PoolCounts:
    """One reading of ``_READ``'s output; GuestError, naming what came back,
    unless every counter is there."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[name] = int(value)
    missing = [c for c in COUNTERS if c not in values]
    if missing:
        raise GuestError(f"not a reading of the host under test's huge page pool (no {missing[0]}): {text[:200]!r}")
    return PoolCounts(*(values[c] for c in COUNTERS))
