"""The fault subject's rows in the scenario table (host/core/scenario.py)."""

from __future__ import annotations

import dataclasses

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

# No kernel_paths: the fault path (mm/memory.c, the page allocator, the
# architecture's fault handler and clear_page) is code every guest runs, so
# a patch to it runs every scenario (host/core/scenario.py).
ANON = Scenario(
    "fault.anon",
    ("fault", "ab"),
    ANON_SIZES,
    primaries=("ns_per_page",),
    e2e="test_fault:FaultTest.test_anon",
)

SCENARIOS = (ANON,)
