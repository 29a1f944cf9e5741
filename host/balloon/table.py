"""The balloon's rows in the scenario table (host/core/scenario.py): their
sizes per profile, their primaries (whose reasons are in
host/judge/primaries.py) and the report section they share."""

from __future__ import annotations

import dataclasses

from memqual.host.core.profiles import AB, FULL, QUICK
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
SECTION = "balloon"  # its memqual.report_sections entry point
# The guest code every balloon scenario runs (Scenario.kernel_paths): the
# driver, its page migration and free page reporting, which the driver
# starts in every guest that negotiates it.
BALLOON_PATHS = (
    "drivers/virtio/virtio_balloon.c",
    "include/uapi/linux/virtio_balloon.h",
    "include/linux/balloon_compaction.h",
    "mm/balloon_compaction.c",
    "mm/page_reporting.c",
    "mm/page_reporting.h",
    "include/linux/page_reporting.h",
)

TIMING_TEST = "test_balloon:BalloonTiming.test_inflate_deflate_1g"
INFLATE = Scenario(
    "balloon.inflate",
    ("balloon", "ab"),
    TIMING,
    section=SECTION,
    primaries=("inflate_s",),
    e2e=TIMING_TEST,
    icount_sizes=TIMING_ON_ICOUNT,
    kernel_paths=BALLOON_PATHS,
)
DEFLATE = Scenario(
    "balloon.deflate",
    ("balloon", "ab"),
    TIMING,
    section=SECTION,
    primaries=("deflate_s",),
    e2e=TIMING_TEST,
    icount_sizes=TIMING_ON_ICOUNT,
    kernel_paths=BALLOON_PATHS,
)
REQUEST_SIZE = Scenario(
    "balloon.request_size",
    ("balloon", "balloon-driver", "ab"),
    DRIVER,
    section=SECTION,
    primaries=("per_page_ns",),
    e2e="test_balloon_driver:BalloonDriver.test_request_size",
    kernel_paths=BALLOON_PATHS,
)
FLOOR: Scenario[object] = Scenario(
    "balloon.floor",
    ("balloon", "ab"),
    section=SECTION,
    primaries=("floor_mib",),
    e2e="test_balloon:BalloonFloor.test_floor",
    kernel_paths=BALLOON_PATHS,
)
FREE_PAGE_REPORTING: Scenario[object] = Scenario(
    "balloon.free_page_reporting",
    ("balloon", "ab"),
    section=SECTION,
    primaries=("rss_return_s",),
    e2e="test_balloon:BalloonFreePageReporting.test_reporting_on",
    kernel_paths=BALLOON_PATHS,
)

SCENARIOS = (INFLATE, DEFLATE, REQUEST_SIZE, FLOOR, FREE_PAGE_REPORTING)
