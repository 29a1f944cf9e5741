"""KSM's rows in the scenario table (host/core/scenario.py): their sizes
per profile, the host knobs they change (host/ksm/state.py's set: KSM and
THP) and their primaries (whose reasons are in host/judge/primaries.py)."""

from __future__ import annotations

import dataclasses

from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.scenario import Scenario
from memqual.host.ksm.state import KNOBS


@dataclasses.dataclass(frozen=True)
class VolatileSizes:
    """Scenario 3 (volatile scan cost) in one profile."""

    guests: int  # fresh guests per smart-scan variant
    windows: int  # measured windows per variant per guest
    reference_scans: int  # full scans in a smart_scan=0 window (smart scan's hold its 9-scan skip period)
    smart_windows: int  # smart_scan=1 windows back to back at each of its turns (a guest's median over them)


@dataclasses.dataclass(frozen=True)
class ManyGuestsSizes:
    """Scenario 5 (many guests) in one profile."""

    guests: int  # guests sharing memory (the saving's n)
    remerge_repeats: int  # timed re-merges of the settled guests


VOLATILE = {
    QUICK: VolatileSizes(guests=4, windows=1, reference_scans=9, smart_windows=1),
    FULL: VolatileSizes(guests=8, windows=2, reference_scans=9, smart_windows=1),
    AB: VolatileSizes(
        guests=1,
        windows=1,
        # The primary is the cost with smart scan; the window without it is
        # the in-guest reference (exploratory), and its scans cost the same
        # every time: 3 of them, not 9, save about 16 s a guest here.
        reference_scans=3,
        # The primary's one window is 9 scans, 0.2-0.3 s of ksmd CPU, and a
        # burst of other work on the host in it moves it by up to 17 %.  A
        # guest's median over 3 windows back to back cut the variance of
        # the blocks' log(B/A) 1.4x in the same 12 blocks, for about 1 s
        # more a guest on a quiet host; 5 windows gave 1.5x for twice that
        # (docs/ksm.md, "In an A/B: what spreads the blocks").
        smart_windows=3,
    ),
}
MANY_GUESTS = {
    QUICK: ManyGuestsSizes(guests=3, remerge_repeats=3),
    FULL: ManyGuestsSizes(guests=5, remerge_repeats=5),
    # The saving's n is part of the metric: the same 3 guests as quick.
    AB: ManyGuestsSizes(guests=3, remerge_repeats=1),
}

MERGE: Scenario[object] = Scenario(
    "ksm.merge", ("ksm", "ab"), knobs=(KNOBS,), primaries=("merged_fraction",), e2e="test_ksm:KsmTest.test_merge"
)
INTEGRITY: Scenario[object] = Scenario("ksm.integrity", ("ksm",), knobs=(KNOBS,), e2e="test_ksm:KsmTest.test_integrity")
VOLATILE_SCAN = Scenario(
    "ksm.volatile_scan",
    ("ksm", "ab"),
    VOLATILE,
    knobs=(KNOBS,),
    primaries=("ksmd_cpu_ns_per_page",),
    e2e="test_ksm:KsmTest.test_volatile_scan_4k",
)
# The guest's own ksmd (Scenario.kernel_paths).  The other rows' ksmd is
# the host's: a patched guest kernel changes no line of it, and the guest
# code they run is its memory management at large, which no row names.
GUEST_MERGE: Scenario[object] = Scenario(
    "ksm.guest_merge",
    ("ksm", "ab"),
    primaries=("merged_fraction",),
    e2e="test_ksm:KsmTest.test_guest_ksm",
    kernel_paths=("mm/ksm.c", "include/linux/ksm.h"),
)
MANY = Scenario(
    "ksm.many_guests",
    ("ksm", "ab"),
    MANY_GUESTS,
    knobs=(KNOBS,),
    primaries=("saved_mib",),
    e2e="test_ksm:KsmTest.test_many_guests",
)

SCENARIOS = (MERGE, INTEGRITY, VOLATILE_SCAN, GUEST_MERGE, MANY)
