"""The balloon's rows in the scenario table (host/core/scenario.py): their
sizes per profile, their primaries with the spreads measured for them,
and the report section that draws the request-size curve."""

from __future__ import annotations

import dataclasses

from memqual.host.core import host_code
from memqual.host.core.primary import (
    COUNT,
    HOST_WALL,
    L1_AA_GUESTS,
    L1_AA_REPORTING,
    MID_MARGIN,
    QUIET_OR_KVM,
    TIGHT_MARGIN,
    WALL_612,
    WALL_AA,
    WIDE_MARGIN,
    Measured,
    Primary,
    Spread,
)
from memqual.host.core.profiles import AB, FULL, QUICK, SMOKE
from memqual.host.core.qemu import BALLOON_DRIVER_PATHS
from memqual.host.core.scenario import Scenario


@dataclasses.dataclass(frozen=True)
class TimingSizes:
    """Scenario 1 (inflate and deflate timing) in one profile."""

    repeats: int  # timed inflate/deflate cycles per guest (samples inside one guest)
    calibrate: bool  # the smaller inflates that calibrate the transfer-cost model
    large_guests: bool  # scenario 2's 2 and 4 GiB guests


@dataclasses.dataclass(frozen=True)
class DriverSizes:
    """The balloon driver's request-size curve in one profile."""

    guests: int  # fresh guests of the curve
    curve: bool  # every size of the curve, not only the seed's three bitmaps and the stock 256


@dataclasses.dataclass(frozen=True)
class ReportingSizes:
    """Scenario 4 (free page reporting) in one profile."""

    touch_mib: int  # touched, held and freed in the guest: the rise of QEMU's RSS the host watches fall


TIMING = {
    QUICK: TimingSizes(repeats=2, calibrate=True, large_guests=False),
    FULL: TimingSizes(repeats=5, calibrate=True, large_guests=True),
    # A guest's median over 3 timed cycles, not its first alone: the
    # first inflate and deflate of a freshly booted guest scatter most,
    # and a host takes memory back from guests that have run a while.
    # The blocks' sd of log(B/A), 6.1 against 6.12 here, first cycle
    # against the median of 3: 0.21 and 0.24 against 0.105 and 0.109
    # (inflate, deflate; 5 blocks), 0.125 and 0.20 against 0.091 and
    # 0.145 (the until-decided run's 3 blocks): 2x-4x less variance,
    # for 2.2x the time of that test (about 24 s more a guest; 14 %
    # more for a block of every scenario).  docs/balloon.md, "In an A/B".
    AB: TimingSizes(repeats=3, calibrate=False, large_guests=False),
    # ./run-tests: one cycle shows every direction the test asserts (18 s
    # of the ab sizes' 45 s, all of it holding the host alone).
    SMOKE: TimingSizes(repeats=1, calibrate=False, large_guests=False),
}
# On the icount clock the A/B's balloon primaries are the guest's own
# timings, which repeat from cycle to cycle, and each cycle costs 45-75 s of
# wall time at load 6-16 (every vCPU in one host thread): one cycle, a third
# of the test (docs/ab-calibration.md, "What icount costs in wall time here").
TIMING_ON_ICOUNT = {AB: TimingSizes(repeats=1, calibrate=False, large_guests=False)}
DRIVER = {
    QUICK: DriverSizes(guests=3, curve=False),
    FULL: DriverSizes(guests=5, curve=True),
    AB: DriverSizes(guests=1, curve=False),
}
# The A/B's spreads of rss_return_s were measured at 512 MiB (WALL_AA).
# ./run-tests: 256 MiB show both directions (reported pages leave the
# host, and stay without reporting), the touch and its return a few
# seconds shorter, in the test that holds the host alone among them.
REPORTING = {QUICK: ReportingSizes(512), FULL: ReportingSizes(512), AB: ReportingSizes(512), SMOKE: ReportingSizes(256)}
SECTION = "balloon"  # the memqual.report_sections entry point that draws the request-size curve
# The host code every balloon scenario's host side runs (Scenario.host_paths):
# QEMU's madvise of each page given back and its freeing, the guest's exits
# to hand the pages over, and its faults when a deflate gives them back.
BALLOON_HOST_PATHS = host_code.joined(host_code.KVM, host_code.GIVE_BACK, host_code.ANON_FAULT)

# The runs that measured the balloon's icount spreads (and the wall
# clock's: host/core/primary.py's WALL_AA, WALL_612).  Every icount guest
# boots from fixed inputs since 2026-12-04 (the RTC and a block's RDRAND
# seed: host/core/clock.py).
ICOUNT_AA_POOLED = Measured(
    "A/A 6.1.0-57, icount:4, boots from fixed inputs, 6 + 4 + 4 + 4 blocks pooled (the last 8 sharing the host)",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock icount --only balloon-timing "
    "--rounds 6 --output OUT; then --clock auto --only balloon-timing --only balloon-driver --only fault --rounds 4 "
    "three times (the last two sharing the host)",
    "2026-12-04",
    'docs/ab-calibration.md, "Boots that repeat", "An A/A on the plan", "Guests that share the host on icount"',
)
L1_AA_MARK = Measured(
    "A/A 6.1.0-57 as the host under test (L1 on icount:0, THP off in L1), 15 blocks (12 whole: three guests "
    "stopped, the TCG SVM re-delivery), each guest-timed move sent by L1 at the guest tracker's mark",
    "memqual run --host-kernel 6.1.0-57-amd64 --host-kernel 6.1.0-57-amd64 --clock icount "
    "--only balloon-timing --rounds 15",
    "2026-12-07",
    'docs/host-under-test.md, "The moves at the guest\'s mark"',
)
ICOUNT_AA_PLAN = Measured(
    "A/A 6.1.0-57, icount:4, on the plan, 4 + 4 + 2 blocks pooled",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock auto --only balloon-timing "
    "--only balloon-driver --only fault --rounds 4 --output OUT, twice (the second sharing the host), then with "
    "--until-decided --budget 10 for --rounds 4",
    "2026-12-04",
    'docs/ab-calibration.md, "An A/A on the plan", "Guests that share the host on icount"',
)
# Blocks of 6.1 against 6.12 on icount: no A/A, the spread of their
# log(B/A) stands for an A/A's, as WALL_612's does on the wall clock.
ICOUNT_612 = Measured(
    "6.1 against 6.12 (no A/A), icount:4, load 7-11",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.12.111+deb12-amd64 --clock icount "
    "--until-decided --budget 15",
    "2026-12-03",
    'docs/ab-calibration.md, "A block of every scenario on icount"',
)

TIMING_TEST = "test_balloon:BalloonTiming.test_inflate_deflate_1g"
INFLATE = Scenario(
    "balloon.inflate",
    ("balloon", "balloon-timing", "ab"),
    TIMING,
    primaries=(
        Primary(
            "inflate_s",
            "what a host waits for when it takes memory back",
            instrument=HOST_WALL,
            on_icount="inflate_guest_s",
            spread_wall=Spread(0.26, 4, WALL_AA),
            spread_icount=Spread(
                0.0032,
                18,
                ICOUNT_AA_POOLED,
                how="pooled: 0.0045 over the 6 blocks from fixed inputs (the host-timed inflate 0.043 in the same "
                "blocks; 0.064 and 0.14 over 9 blocks of boots the host fed), 0.0018 in the plan's 4, 0.0025 and "
                "0.0024 in two runs of 4 sharing the host",
            ),
            spread_host_under_test=Spread(
                0.0134,
                12,
                L1_AA_MARK,
                how="the guest-timed inflate on L1's clock, sent at the guest's mark; a guest's inflate takes "
                "2.72-2.83 s by how many of its pages L1 faults in inside it (1.38 % over 6 blocks "
                "of 6.12 sent by memqual, 1.46 % over 15 of 6.1)",
            ),
            margin_icount=TIGHT_MARGIN,
            margin_host_under_test=MID_MARGIN,
            needs=QUIET_OR_KVM + "; on icount the guest's own timing decides it, at 0.3 % from block to block "
            "(1.3 % on a host under test: 2 % there)",
        ),
    ),
    e2e=TIMING_TEST,
    icount_sizes=TIMING_ON_ICOUNT,
    kernel_paths=BALLOON_DRIVER_PATHS,
    host_paths=BALLOON_HOST_PATHS,
)
DEFLATE = Scenario(
    "balloon.deflate",
    ("balloon", "balloon-timing", "ab"),
    TIMING,
    primaries=(
        Primary(
            "deflate_s",
            "what a guest waits for when it gets memory back",
            instrument=HOST_WALL,
            on_icount="deflate_guest_s",
            spread_wall=Spread(0.36, 4, WALL_AA),
            # past what a 1 % margin allows in about 6 blocks
            # (TIGHT_SPREAD_MAX), so 5 % on icount too
            spread_icount=Spread(
                0.0076,
                18,
                ICOUNT_AA_POOLED,
                how="pooled: 0.0064 over the 6 blocks from fixed inputs (the host-timed deflate 0.087 in the same "
                "blocks; 0.046 and 0.23 over 9 blocks of boots the host fed), 0.0116 in the plan's 4, 0.0054 and "
                "0.0063 in two runs of 4 sharing the host",
            ),
            spread_host_under_test=Spread(
                0.00174,
                12,
                L1_AA_MARK,
                how="the guest-timed deflate on L1's clock, sent at the guest's mark (0.41 % over 15 blocks of 6.1 "
                "and 1.89 % over 6 of 6.12 sent by memqual)",
            ),
            margin_icount=WIDE_MARGIN,
            # at the guest's mark it repeats well within what a 1 % margin allows
            margin_host_under_test=TIGHT_MARGIN,
            needs=QUIET_OR_KVM + "; on icount the guest's own timing decides it, at 0.8 % from block to block: "
            "judged at 5 % there, just past the 0.75 % a 1 % margin allows (TIGHT_SPREAD_MAX)",
        ),
    ),
    e2e=TIMING_TEST,
    icount_sizes=TIMING_ON_ICOUNT,
    kernel_paths=BALLOON_DRIVER_PATHS,
    host_paths=BALLOON_HOST_PATHS,
)
REQUEST_SIZE = Scenario(
    "balloon.request_size",
    ("balloon", "balloon-driver", "ab"),
    DRIVER,
    section=SECTION,
    primaries=(
        Primary(
            "per_page_ns",
            "the slope of the request-size curve: the driver's cost per page, which is what a change to "
            "its request handling moves; the per-size times are its points (exploratory)",
            instrument=HOST_WALL,
            # the same fit on the driver's own span, read with the guest's clock
            on_icount="driver_per_page_ns",
            spread_wall=Spread(0.28, 2, WALL_612),
            spread_icount=Spread(
                0.0047,
                10,
                ICOUNT_AA_PLAN,
                how="pooled: 0.0029 over the plan's 4 blocks, 0.00037 over 4 sharing the host and 0.011 over 2 "
                "(one block's -1.6 %); over 3 blocks of 6.1 against 6.12 on a loaded host (boots the host fed) "
                "0.060, the host-timed slope's 0.98",
            ),
            spread_host_under_test=Spread(0.00543, 6, L1_AA_GUESTS, how="the guest-timed slope on L1's clock"),
            margin_icount=TIGHT_MARGIN,
            margin_host_under_test=TIGHT_MARGIN,
            needs=QUIET_OR_KVM + "; on icount the driver's guest-timed slope decides it, at 0.5 % from block to "
            "block over three A/As (10 blocks; 0.54 % over 6 on a host under test)",
        ),
    ),
    e2e="test_balloon_driver:BalloonDriver.test_request_size",
    kernel_paths=BALLOON_DRIVER_PATHS,
    host_paths=BALLOON_HOST_PATHS,
)
FLOOR: Scenario[object] = Scenario(
    "balloon.floor",
    ("balloon", "ab"),
    primaries=(
        Primary(
            "floor_mib",
            "how far a guest can be ballooned down before it stops giving",
            instrument=COUNT,
            spread_wall=Spread(0.008, 3, WALL_AA),
            # Not a clock-free count on icount: the probe stops at a stall
            # window of host wall time (0.6 s), in which a guest taking
            # turns in one host thread gets less done.
            spread_icount=Spread(0.063, 2, ICOUNT_612, how="log(B/A) 0.002 and -0.087 over its 2 blocks"),
            needs="on icount the probe's stall window is host wall time, so the host's pace moves where it stops "
            "(6 % over 2 icount blocks against 0.8 % over 3 wall ones): decide it on the wall clock",
        ),
    ),
    e2e="test_balloon:BalloonFloor.test_floor",
    kernel_paths=BALLOON_DRIVER_PATHS,
    host_paths=BALLOON_HOST_PATHS,
    off_a_host_under_test="the floor is the guest's own (its driver's and its reclaim's), and its probe stops at a "
    "stall of this machine's wall clock seen by polls from here, each one L1's work",
)
FREE_PAGE_REPORTING: Scenario[ReportingSizes] = Scenario(
    "balloon.free_page_reporting",
    ("balloon", "ab"),
    sizes=REPORTING,
    primaries=(
        Primary(
            "rss_return_s",
            "how soon reported free pages leave the host; with reporting off the time is the watched "
            "window itself (the RSS must stay up), a check, not a cost",
            variant=(("free_page_reporting", True),),
            instrument=HOST_WALL,
            spread_wall=Spread(0.011, 3, WALL_AA),
            # On icount the guest reports on its own (virtual) clock, which
            # jumps while it idles, and the host watches RSS in wall time.
            spread_icount=Spread(0.85, 2, ICOUNT_612, how="log(B/A) 1.94 and 0.73 over its 2 blocks"),
            # Under a host under test the guest's QEMU and its RSS are L1's,
            # and a watcher in L1 reads them (host/balloon/rss_watch.py):
            # there the host's work on each MiB the guest reports (QEMU's
            # threads' run time over the passes) decides it, where the
            # return's time is mostly the guest's 2 s between passes.
            on_host_under_test="report_cpu_l1_ns_per_mib",
            spread_host_under_test=Spread(
                0.00721,
                6,
                L1_AA_REPORTING,
                how="about 417,000 ns a MiB on 4 KiB pages; the return's time there (rss_return_l1_s, "
                "exploratory) 2.21-2.24 s, 0.60 %",
            ),
            margin_host_under_test=TIGHT_MARGIN,
            needs=QUIET_OR_KVM + "; on icount it spreads 85 % over 2 blocks against 1.1 % on the wall clock: "
            "decide it on the wall clock; no count decides it on icount: Linux's page reporting and QEMU's device "
            "count no reported pages, and the guest cannot see when the host's RSS falls -- a guest tracepoint at "
            "each report (the guest's clock when its last block went) would; on a host under test it is decided "
            "by the host's work a MiB on L1's clock (report_cpu_l1_ns_per_mib)",
        ),
    ),
    e2e="test_balloon:BalloonFreePageReporting.test_reporting_on",
    kernel_paths=BALLOON_DRIVER_PATHS,
    host_paths=BALLOON_HOST_PATHS,
    on_a_host_under_test=True,
)

SCENARIOS = (INFLATE, DEFLATE, REQUEST_SIZE, FLOOR, FREE_PAGE_REPORTING)
