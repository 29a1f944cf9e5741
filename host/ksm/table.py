"""KSM's rows in the scenario table (host/core/scenario.py): their sizes
per profile, the host knobs they change (host/ksm/state.py's set: KSM and
THP), their primaries with the spreads measured for them, and the regime
the volatile scan's metrics compare under."""

from __future__ import annotations

import dataclasses

from memqual.host.core import host_code
from memqual.host.core.primary import (
    COUNT,
    HOST_CPU,
    L1_AA_GUESTS,
    TIGHT_MARGIN,
    WALL_612,
    WALL_AA,
    WIDE_MARGIN,
    Measured,
    Primary,
    Regime,
    Spread,
)
from memqual.host.core.profiles import AB, FULL, QUICK, SMOKE
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
    # ./run-tests: one smart_scan=1 window shows every direction the test
    # asserts; the other two steadied only the A/B's primary (about 1.5 s
    # of each volatile test, all of it holding the host alone).
    SMOKE: VolatileSizes(guests=1, windows=1, reference_scans=3, smart_windows=1),
}


def volatile_sizes(sizes: VolatileSizes, on_a_host_under_test: bool) -> VolatileSizes:
    """The volatile scan's sizes where it runs: ``sizes`` (the profile's),
    with one smart_scan=1 window a turn on a host under test.  The median
    over windows back to back leaves out bursts of this machine's other
    work; in L1 nothing else runs, and one guest's windows repeat within
    0.02-0.14 % of L1's clock (docs/host-under-test.md, "KSM on L1's
    ksmd") while fresh L1s differ by 1.8 %: two more windows add about
    90 s of wall time a guest and take nothing off the blocks' spread."""
    if not on_a_host_under_test or sizes.smart_windows == 1:
        return sizes
    return dataclasses.replace(sizes, smart_windows=1)


MANY_GUESTS = {
    QUICK: ManyGuestsSizes(guests=3, remerge_repeats=3),
    FULL: ManyGuestsSizes(guests=5, remerge_repeats=5),
    # The saving's n is part of the metric: the same 3 guests as quick.
    AB: ManyGuestsSizes(guests=3, remerge_repeats=1),
}

# The icount A/A of KSM (stopped once the many-guests test had 6 blocks;
# the first tests booted as the host fed them, the many-guests test from
# fixed inputs).
ICOUNT_AA_KSM = Measured(
    "A/A 6.1.0-57, icount:4, KSM, 6 blocks",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock icount --only ksm "
    "--only memslots --rounds 6 --output OUT",
    "2026-12-04",
    'docs/ab-calibration.md, "The icount A/A of KSM"',
)
# The volatile scan alone, both variants' cost a primary (the A/A that
# measured the smart_scan=0 cost's spread on the wall clock).
WALL_AA_VOLATILE = Measured(
    "A/A 6.1.0-57, wall clock, the volatile scan, 6 blocks, load 2-4",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock wall --only ksm-volatile "
    "--rounds 6 --output OUT",
    "2026-12-07",
    'docs/ksm.md, "Without smart scan: the host kernel\'s own scan cost, a second primary"',
)
# ksmd's cost on a host under test: its CPU time is L1's instructions.
L1_AA_KSM = Measured(
    "A/A 6.12.111 as the host under test (L1 on icount:0, THP off in L1), 6 blocks, one smart window a turn, "
    "the measurement one command in L1 started by the agent's mark",
    "memqual run --host-kernel 6.12.111+deb12-amd64 --host-kernel 6.12.111+deb12-amd64 --clock icount "
    "--only ksm-volatile --rounds 6 --output OUT; python -m memqual.lab.block_spread OUT",
    "2026-12-07",
    'docs/host-under-test.md, "One command a measurement, started by the guest\'s mark"',
)
# Two sides' dirtying rates match when the larger is at most this many
# times the smaller: the 95 % range of the ratio of two runs' geometric
# means over 4 guests each (the quick profile) when every guest's rate
# comes from one distribution, exp(1.96 x sigma x sqrt(1/4 + 1/4)) = 1.94,
# rounded up.  sigma = 0.48, the guests' log spread within a run pooled
# over three measured runs (docs/ksm.md, "Comparing runs").  With more
# guests a side the same factor is a looser test, never a stricter one.
DIRTY_RATE_TOLERANCE = 2.0


@dataclasses.dataclass(frozen=True)
class AdvisorSizes:
    """The KSM advisor (advisor_mode scan-time, Linux 6.8+) in one profile."""

    guest_mib: int
    fill_mib: int  # the agent's pages, held while ksmd scans: the scan's size beside the guest's own
    target_s: int  # advisor_target_scan_time: whole seconds, 1 at least
    start_pages: int  # advisor_min_pages_to_scan: the pages_to_scan the advisor starts from
    sleep_ms: int  # sleep_millisecs: ksmd's pause between batches, which the advisor leaves alone
    after_scans: int  # full scans watched once one took the target or less
    timeout_s: float  # for the whole watch


# At 100 pages a batch and 8 ms between batches (2 jiffies at HZ=250)
# the first full scan is slower than a 1 s target wherever the guest's RAM
# is there: QEMU asks for huge pages for it, so with THP always or madvise
# a touched 4 KiB brings its 2 MiB; 128 MiB took 3.8 s here (host 6.18,
# THP madvise, 2026-12-06).  Without THP the agent's pages keep some there
# (40 MiB: what a 128 MiB guest has free).  The advisor's first step after
# it is switched on counts ksmd's CPU time since boot as that scan's
# (mm/ksm.c zeroes its context, cpu_time too), which on a host whose ksmd
# has worked caps pages_to_scan at advisor_max_cpu (70): starting at 100
# keeps that drop, and the slower scan after it, small; the guest's size
# keeps both to seconds (docs/ksm.md, "The KSM advisor").
ADVISOR_SIZES = {
    QUICK: AdvisorSizes(
        guest_mib=512, fill_mib=256, target_s=1, start_pages=100, sleep_ms=8, after_scans=3, timeout_s=120.0
    ),
    FULL: AdvisorSizes(
        guest_mib=1024, fill_mib=512, target_s=2, start_pages=100, sleep_ms=20, after_scans=5, timeout_s=400.0
    ),
    AB: AdvisorSizes(
        guest_mib=128, fill_mib=40, target_s=1, start_pages=100, sleep_ms=8, after_scans=1, timeout_s=60.0
    ),
}

MERGE: Scenario[object] = Scenario(
    "ksm.merge",
    ("ksm", "ksm-merge", "ab"),
    knobs=(KNOBS,),
    primaries=(
        Primary(
            "merged_fraction",
            "identical guest pages merge; with mem-merge=off nothing may merge, a check",
            variant=(("mem_merge", True),),
            instrument=COUNT,
            spread_wall=Spread(0.001, 2, WALL_612),
            spread_icount=Spread(0.0007, 6, ICOUNT_AA_KSM),
            spread_host_under_test=Spread(0.00064, 6, L1_AA_GUESTS, how="L1's ksmd merging the guest's pages"),
            margin=TIGHT_MARGIN,
        ),
    ),
    e2e="test_ksm:KsmTest.test_merge",
    host_paths=host_code.KSMD,
    on_a_host_under_test=True,  # on L1's ksmd (host/ksm/l1_ksm.py)
)
INTEGRITY: Scenario[object] = Scenario(
    "ksm.integrity",
    ("ksm",),
    knobs=(KNOBS,),
    e2e="test_ksm:KsmTest.test_integrity",
    host_paths=host_code.KSMD,
    on_a_host_under_test=True,  # on L1's ksmd (host/ksm/l1_ksm.py)
)
VOLATILE_SCAN = Scenario(
    "ksm.volatile_scan",
    ("ksm", "ksm-volatile", "ab"),
    VOLATILE,
    knobs=(KNOBS,),
    primaries=(
        Primary(
            "ksmd_cpu_ns_per_page",
            "ksmd's CPU per page covered with smart scan (on by default since Linux 6.7) on 4 KiB pages: "
            "what the guest's pages make the host pay; without smart scan it is the host's own checksum "
            "cost (the in-guest reference), and on THP the host's huge page splits weigh in",
            variant=(("pages", "4k"), ("smart_scan", 1)),
            instrument=HOST_CPU,
            spread_wall=Spread(0.067, 3, WALL_AA),
            spread_icount=Spread(0.114, 6, ICOUNT_AA_KSM),
            spread_host_under_test=Spread(
                0.00423, 6, L1_AA_KSM, how="ksmd's CPU time on L1's clock (1.02 % paced from this machine)"
            ),
            margin_host_under_test=TIGHT_MARGIN,
            needs="the host's ksmd CPU time: a quiet host or KVM would decide it (11 % over 6 icount A/A blocks).  "
            "ksmd's counts (pages_scanned, pages_skipped, full_scans) do not decide it: they are not its cost.  "
            "On icount pages_skipped_per_scan repeated to 0.05 % over the same 6 A/A blocks (the guests' "
            "dirtying is guest instructions there), so a skip count could decide how much smart scan saves, not "
            "what a page costs",
        ),
        Primary(
            "ksmd_cpu_ns_per_page",
            "ksmd's CPU per page without smart scan: the host kernel's own checksum-and-compare cost, which "
            "every kernel has (smart scan came in 6.7), so an A/B of host kernels from either side of it "
            "decides the host's work per page here",
            variant=(("pages", "4k"), ("smart_scan", 0)),
            instrument=HOST_CPU,
            spread_wall=Spread(0.0565, 6, WALL_AA_VOLATILE),
            spread_host_under_test=Spread(
                0.00142, 6, L1_AA_KSM, how="ksmd's CPU time on L1's clock (1.40 % paced from this machine)"
            ),
            margin_host_under_test=TIGHT_MARGIN,
            needs="the host's ksmd CPU time: a host under test's ksmd on its icount clock (L1's instructions, "
            "docs/host-under-test.md), or a quiet host or KVM",
        ),
    ),
    e2e="test_ksm:KsmTest.test_volatile_scan_4k",
    host_paths=host_code.KSMD,
    on_a_host_under_test=True,  # on L1's ksmd (host/ksm/l1_ksm.py)
    regime=Regime(
        "dirty_passes_per_scan",
        "dirtying rate",
        "dirty passes per ksmd full scan",
        DIRTY_RATE_TOLERANCE,
        free_keys=("smart_scan",),
    ),
)
# The guest's own ksmd (Scenario.kernel_paths).  The other rows' ksmd is
# the host's: a patched guest kernel changes no line of it, and the guest
# code they run is its memory management at large, which no row names.
# No host paths here: the merging is the guest's, the host only runs it.
GUEST_MERGE: Scenario[object] = Scenario(
    "ksm.guest_merge",
    ("ksm", "ksm-merge", "ab"),
    primaries=(
        Primary(
            "merged_fraction",
            "the guest kernel's own ksmd merges its pages",
            instrument=COUNT,
            spread_wall=Spread(0.0, 2, WALL_612),
            spread_icount=Spread(0.0, 6, ICOUNT_AA_KSM),
            spread_host_under_test=Spread(0.0, 5, L1_AA_GUESTS, how="5 of 6 blocks: one guest of block 4 froze"),
            margin=TIGHT_MARGIN,
        ),
    ),
    e2e="test_ksm:KsmTest.test_guest_ksm",
    kernel_paths=("mm/ksm.c", "include/linux/ksm.h"),
    on_a_host_under_test=True,  # its guest's own ksmd: it reads its guest alone
)
MANY = Scenario(
    "ksm.many_guests",
    ("ksm", "ab"),
    MANY_GUESTS,
    knobs=(KNOBS,),
    primaries=(
        Primary(
            "saved_mib",
            "the saving with the scenario's three guests; the one- and two-guest points fit the model",
            variant=(("guests", 3),),
            instrument=COUNT,
            spread_wall=Spread(0.003, 2, WALL_612),
            # On icount the guests are paused while ksmd settles them
            # (host/ksm/sharing.py), and the saving still moved 1.6 %
            # between blocks: too wide for 1 % there.
            spread_icount=Spread(0.016, 6, ICOUNT_AA_KSM),
            margin=TIGHT_MARGIN,
            margin_icount=WIDE_MARGIN,
            needs="on icount the saving moved 1.6 % between A/A blocks, though the guests rest while ksmd settles "
            "them: judged at 5 % there; the wall clock's 0.3 % decides it at 1 %",
        ),
    ),
    e2e="test_ksm:KsmTest.test_many_guests",
    host_paths=host_code.KSMD,
    off_a_host_under_test="it shares one host's ksmd among three guests, and a host under test runs one",
)

# The host's own ksmd: no guest kernel path, and no primary (its spread
# from block to block is unmeasured; what it records is exploratory).
ADVISOR = Scenario(
    "ksm.advisor",
    ("ksm", "ksm-advisor"),
    ADVISOR_SIZES,
    knobs=(KNOBS,),
    e2e="test_ksm_advisor:KsmAdvisorTest.test_advisor",
    host_paths=host_code.KSMD,
    on_a_host_under_test=True,  # on L1's ksmd, watched in L1 (host/ksm/advisor.py run_advisor_whole)
)

SCENARIOS = (MERGE, INTEGRITY, VOLATILE_SCAN, GUEST_MERGE, MANY, ADVISOR)
