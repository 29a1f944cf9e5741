"""hugetlbfs' rows in the scenario table (host/core/scenario.py)."""

from __future__ import annotations

import dataclasses

from memqual.host.core import host_code
from memqual.host.core.primary import L1_AA_READ_IN_L1, MID_MARGIN, QUIET_OR_KVM, Measured, Primary, Spread
from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.qemu import BALLOON_DRIVER_PATHS
from memqual.host.core.scenario import Scenario
from memqual.host.hugetlbfs.pool import KNOBS


@dataclasses.dataclass(frozen=True)
class BalloonSizes:
    """The balloon scenario in one profile."""

    repeats: int  # large inflates per guest (samples inside one guest)
    anon_reference: bool  # the same guest on anonymous memory, for the inflate time beside it
    reporting_control: bool  # a guest with free page reporting: the pool count sees pages come back
    large_requests: bool  # the driver variant's large requests on the same guest: whole pages back


BALLOON_SIZES = {
    QUICK: BalloonSizes(repeats=2, anon_reference=True, reporting_control=True, large_requests=True),
    FULL: BalloonSizes(repeats=5, anon_reference=True, reporting_control=True, large_requests=True),
    # The block is the replicate: one inflate, no reference guest, no
    # control (its checks are quick's).
    AB: BalloonSizes(repeats=1, anon_reference=False, reporting_control=False, large_requests=False),
}

# Two of its four blocks had both arms (block 2's B waited out its 600 s
# for the measurement lock, block 4's B hit a checkout being edited).
AA_WALL = Measured(
    "A/A 6.1.0-57, hugetlbfs only, wall clock, load 12-16 (four other runs on the host)",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --only hugetlbfs --rounds 4",
    "2026-12-03",
    'docs/results/hugetlbfs-runs.md, "In an A/B"',
)

BALLOON = Scenario(
    "hugetlbfs.balloon",
    ("hugetlbfs", "ab"),
    BALLOON_SIZES,
    knobs=(KNOBS,),
    primaries=(
        Primary(
            "inflate_s",
            "what a host waits for when it takes memory back from a guest on 2 MiB pages",
            (("backing", "hugetlbfs"),),
            spread_wall=Spread(1.0, 2, AA_WALL),
            # Under a host under test the pool is L1's and the guest times
            # each inflate on L1's clock, the host's work for it counted in;
            # this machine's events time it to a second there.
            on_host_under_test="inflate_guest_s",
            spread_host_under_test=Spread(
                0.0134,
                6,
                L1_AA_READ_IN_L1,
                how="192 MiB on the stock driver, near 0.248 or 0.253 s a guest (this machine's event-timed "
                "inflate_s spread 14 % over the same blocks)",
            ),
            margin_host_under_test=MID_MARGIN,
            needs=QUIET_OR_KVM,
        ),
    ),
    e2e="test_hugetlbfs:HugetlbfsTest.test_balloon",
    # the guest's balloon driver on host memory of 2 MiB pages: hugetlbfs
    # itself (mm/hugetlb.c, fs/hugetlbfs/) is the host's, which a patched
    # guest kernel does not change
    kernel_paths=BALLOON_DRIVER_PATHS,
    # on the host: the pool's pages given back by QEMU's madvise (hugetlbfs's
    # own), the guest's exits to hand them over
    host_paths=host_code.joined(host_code.KVM, host_code.GIVE_BACK, host_code.HUGETLB),
    on_a_host_under_test=True,  # on L1's pool, reserved at L1's boot (host/hugetlbfs/l1_pool.py)
)
# ksmd over a guest on the pool, which it must leave alone
KSM: Scenario[object] = Scenario(
    "hugetlbfs.ksm",
    ("hugetlbfs", "slow"),
    knobs=(KNOBS,),
    e2e="test_hugetlbfs:HugetlbfsTest.test_ksm_merges_nothing",
    host_paths=host_code.joined(host_code.KSMD, host_code.HUGETLB),
    on_a_host_under_test=True,  # on L1's ksmd over L1's pool (host/ksm/l1_ksm.py, host/hugetlbfs/l1_pool.py)
)

SCENARIOS = (BALLOON, KSM)
