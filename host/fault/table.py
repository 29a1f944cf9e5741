"""The fault subject's rows in the scenario table (host/core/scenario.py)."""

from __future__ import annotations

import dataclasses

from memqual.host.core import host_code
from memqual.host.core.primary import FINE_MARGIN, GUEST_CLOCK, L1_AA_GUESTS, Measured, Primary, Spread
from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.scenario import Scenario


@dataclasses.dataclass(frozen=True)
class AnonSizes:
    """The anonymous fault scenario in one profile."""

    guests: int  # fresh guests (the replicates)
    runs: int  # timed runs a guest; its figure is the least of them
    mib: int  # memory touched a run


ANON_SIZES = {
    QUICK: AnonSizes(guests=2, runs=2, mib=64),
    FULL: AnonSizes(guests=5, runs=3, mib=64),
    # The block is the replicate: one guest.
    AB: AnonSizes(guests=1, runs=2, mib=64),
}

# Its A/As: one fresh guest an arm a block, memqual's image kernel.
AA_WALL = Measured(
    "A/A 6.1.0-57, fault.anon, wall clock, a kernel build beside it (load 2.6-3.7)",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --only fault --rounds 6 --output OUT",
    "2026-12-04",
    'docs/results/fault-runs.md, "Its spread"',
)
AA_ICOUNT = Measured(
    "A/A 6.1.0-57, fault.anon, icount:4, a kernel build beside it (load 2.6-3.7)",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock icount --only fault "
    "--rounds 6 --output OUT",
    "2026-12-04",
    'docs/results/fault-runs.md, "Its spread"',
)

# No kernel_paths: the fault path (mm/memory.c, the page allocator, the
# architecture's fault handler and clear_page) is code every guest runs, so
# a patch to it runs every scenario (host/core/scenario.py).  Its host
# paths: under a host under test every first touch is a nested page fault
# that L1's KVM resolves (its memslot search, its MMU), faulting in and
# zeroing a page of QEMU's memory in L1.
ANON = Scenario(
    "fault.anon",
    ("fault", "ab"),
    ANON_SIZES,
    primaries=(
        Primary(
            "ns_per_page",
            "the guest kernel's first touch of an anonymous 4 KiB page (the fault, the zeroing, the page table "
            "update): what every guest workload pays, and what a patch to the fault path or the page allocator "
            "moves",
            variant=(("pages", "4k"),),
            instrument=GUEST_CLOCK,
            spread_wall=Spread(0.44, 6, AA_WALL),
            spread_icount=Spread(0.00011, 6, AA_ICOUNT),
            # Too few blocks for a margin of its own there (two of the
            # twelve guests froze: docs/host-under-test.md, "A guest that
            # froze"): judged at its 0.5 % on a host under test too.
            spread_host_under_test=Spread(
                0.00149, 4, L1_AA_GUESTS, how="4 of 6 blocks: one guest of block 1 and one of block 6 froze"
            ),
            margin=FINE_MARGIN,
            needs="on the wall clock the host's load is in the guest's time (multi-threaded TCG): decide it on "
            "icount, where it repeats within a few parts in 10,000",
        ),
    ),
    e2e="test_fault:FaultTest.test_anon",
    host_paths=host_code.joined(host_code.KVM, host_code.ANON_FAULT),
)

SCENARIOS = (ANON,)
