"""hugetlbfs' rows in the scenario table (host/core/scenario.py)."""

from __future__ import annotations

import dataclasses

from memqual.host.core.profiles import AB, FULL, QUICK
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

BALLOON = Scenario(
    "hugetlbfs.balloon",
    ("hugetlbfs", "ab"),
    BALLOON_SIZES,
    knobs=(KNOBS,),
    primaries=("inflate_s",),
    e2e="test_hugetlbfs:HugetlbfsTest.test_balloon",
    # the guest's balloon driver (balloon's rows name the same files: the
    # subjects import nothing of each other) on host memory of 2 MiB pages:
    # hugetlbfs itself (mm/hugetlb.c, fs/hugetlbfs/) is the host's, which a
    # patched guest kernel does not change
    kernel_paths=(
        "drivers/virtio/virtio_balloon.c",
        "include/uapi/linux/virtio_balloon.h",
        "include/linux/balloon_compaction.h",
        "mm/balloon_compaction.c",
        "mm/page_reporting.c",
        "mm/page_reporting.h",
        "include/linux/page_reporting.h",
    ),
)
KSM: Scenario[object] = Scenario(
    "hugetlbfs.ksm", ("hugetlbfs", "slow"), knobs=(KNOBS,), e2e="test_hugetlbfs:HugetlbfsTest.test_ksm_merges_nothing"
)

SCENARIOS = (BALLOON, KSM)
