"""Which metrics a comparison decides on: the one table of primaries
(``PRIMARIES``) and negative controls (``CONTROL_SCENARIOS``); the rest
is exploratory.  Each primary says why it is watched, what reads it on
each clock (its instrument, and ``on_icount`` where the guest's own figure
decides it there), its measured block spreads, its equivalence margin
(about 1 % where the spread allows, else 5 %) and what would decide it
where its spread is too wide.  docs/architecture.md, "Module notes".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

PRIMARY = "primary"
CONTROL = "control"
EXPLORATORY = "exploratory"

# What reads a primary.
GUEST_CLOCK = "guest clock"  # timed in the guest: time on wall, guest instructions on icount
HOST_WALL = "host wall clock"  # timed by the host (QMP polls, /proc reads): wall time on every clock
HOST_CPU = "host CPU time"  # a host thread's CPU time (ksmd): the host's work, on every clock
COUNT = "count"  # pages, MiB, tree nodes: no clock at all

# A margin of about 1 % where the spread allows it, 5 % otherwise.  The
# spread allows 1 % when equivalence there is shown in about 6 blocks
# (alpha 0.01 a side, power 0.8: n = (3.17 sd / margin)^2).
TIGHT_MARGIN = 0.01
WIDE_MARGIN = 0.05
TIGHT_SPREAD_MAX = 0.0075
# Half a percent, for a guest-timed figure that repeats within a few parts
# in 10,000 on icount: there a 1 % change must be called slower, and a
# change is called so only when its estimate is beyond the margin (at a 1 %
# margin a true 1 % change would be, half the time).
FINE_MARGIN = 0.005


@dataclasses.dataclass(frozen=True)
class Spread:
    """A measured block spread: the sd of log(B/A) over ``blocks`` blocks of
    an A/A run, and which run (its command and date are in ``source``)."""

    sd: float
    blocks: int
    source: str


@dataclasses.dataclass(frozen=True)
class Primary:
    """One primary: a scenario's metric, in the variants whose items
    include ``variant`` (empty: every variant), and why it is watched;
    what reads it (``instrument``), the metric that decides it on the
    icount clock where another one does (``on_icount``, read by the guest
    clock), the spreads measured on each clock, its equivalence margin,
    and what would decide it where its spread is too wide (``needs``)."""

    scenario: str
    metric: str
    why: str
    variant: tuple[tuple[str, Any], ...] = ()
    instrument: str = HOST_WALL
    on_icount: str = ""
    spread_wall: Spread | None = None
    spread_icount: Spread | None = None
    margin: float = WIDE_MARGIN
    # The margin on the icount clock where its spread there allows a
    # tighter one than the wall clock's (None: ``margin`` on every clock).
    margin_icount: float | None = None
    needs: str = ""

    def metric_on(self, clock: str = "") -> str:
        """The metric that decides this primary on ``clock`` (a label:
        wall, icount:SHIFT; empty: wall)."""
        return self.on_icount if self.on_icount and clock.startswith("icount") else self.metric

    def instrument_on(self, clock: str = "") -> str:
        return GUEST_CLOCK if self.on_icount and clock.startswith("icount") else self.instrument

    def margin_on(self, clock: str = "") -> float:
        """The equivalence margin it is judged against on ``clock``."""
        if self.margin_icount is not None and clock.startswith("icount"):
            return self.margin_icount
        return self.margin

    def spread_on(self, clock: str = "") -> Spread | None:
        return self.spread_icount if clock.startswith("icount") else self.spread_wall

    def reads(self, clock: str = "") -> str:
        """What the deciding figure counts on ``clock``, in words."""
        instrument = self.instrument_on(clock)
        if instrument == GUEST_CLOCK:
            return "guest instructions (the guest's icount clock)" if clock.startswith("icount") else "guest time"
        if instrument == COUNT:
            return "a count: no clock"
        return f"{instrument}: the host's load is in it on every clock"

    def matches(self, scenario: str, metric: str, variant: Mapping[str, Any] | None, clock: str = "") -> bool:
        if (scenario, metric) != (self.scenario, self.metric_on(clock)):
            return False
        given = variant or {}
        return all(key in given and given[key] == value for key, value in self.variant)


# Where the wall clock's spreads were measured (docs/ab-calibration.md,
# "Block-to-block spread"): A/A runs of 6.1.0-57 on this project's 2-core
# TCG host, load 2-10; the near-deterministic counts from two blocks of
# 6.1 against 6.12.  The icount clock's: the A/As and blocks below.
WALL_AA = "A/A 6.1.0-57, wall clock, docs/ab-calibration.md"
WALL_612 = "6.1 against 6.12 (no A/A), wall clock, docs/ab-calibration.md"
# The icount A/A of the balloon timing test once every icount guest boots
# from fixed inputs (the RTC and a block's RDRAND seed: host/core/clock.py),
# 6 blocks, 2026-12-04 (docs/ab-calibration.md, "Boots that repeat"; the
# 9 blocks of boots the host fed: "The icount A/A"): `memqual run
# --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock
# icount --only balloon-timing --rounds 6 --output OUT`, then block_spread.
ICOUNT_AA_FIXED_BOOTS = "A/A 6.1.0-57, icount:4, boots from fixed inputs, 6 blocks, docs/ab-calibration.md"
# The same on a run's plan, the icount tests of the balloon and the fault,
# 4 blocks, 2026-12-04 (docs/ab-calibration.md, "An A/A on the plan"):
# `memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel
# 6.1.0-57-amd64 --clock auto --only balloon-timing --only balloon-driver
# --only fault --rounds 4 --output OUT`, then block_spread.  The balloon's
# two A/As are pooled (the sd over both, 5 + 3 degrees of freedom).
# The same command again once the plan's icount tests share the host (A
# and B of a block side by side, docs/ab-calibration.md, "Guests that share
# the host on icount"), 4 blocks, and the same tests with `--until-decided
# --budget 10` in place of `--rounds 4` (4 blocks, the request size 2),
# 2026-12-04; all pooled with the above.
ICOUNT_AA_PLAN = "A/A 6.1.0-57, icount:4, on the plan, 4 + 4 + 2 blocks pooled, docs/ab-calibration.md"
ICOUNT_AA_POOLED = (
    "A/A 6.1.0-57, icount:4, boots from fixed inputs, 6 + 4 + 4 + 4 blocks pooled (the last 8 sharing the host), "
    "docs/ab-calibration.md"
)
# Blocks of 6.1 against 6.12 on icount (no A/A: the spread of their
# log(B/A) estimates an A/A's, as WALL_612 does on the wall clock), load
# 7-11 (docs/ab-calibration.md, "A block of every scenario on icount"):
# `memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel
# 6.12.111+deb12-amd64 --clock icount --until-decided --budget 15`, then
# `python -m memqual.lab.block_spread OUT --jobs`; for the request
# size also block 2 of the same run with `--only balloon-driver --rounds 2`.
ICOUNT_612 = "6.1 against 6.12 (no A/A), icount:4, docs/ab-calibration.md"
# The icount A/A of KSM, 2026-12-04 (docs/ab-calibration.md, "The icount
# A/A of KSM"): `memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel
# 6.1.0-57-amd64 --clock icount --only ksm --only memslots --rounds 6
# --output OUT`, stopped when its many-guests test had MANY_GUESTS_BLOCKS
# blocks, then `python -m memqual.lab.block_spread OUT --jobs`.
ICOUNT_AA_KSM = "A/A 6.1.0-57, icount:4, KSM, docs/ab-calibration.md"
# The same for the memslot tests, 6 blocks, its own run (`--only memslots`).
ICOUNT_AA_MEMSLOTS = "A/A 6.1.0-57, icount:4, memslots, docs/ab-calibration.md"
# The anonymous fault's A/As (docs/fault.md, "Its spread"): one fresh
# guest an arm a block, memqual's image kernel, both run by
# `memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64
# --only fault --rounds N [--clock icount]`, then
# `python -m memqual.lab.block_spread OUT --jobs`.
FAULT_AA_WALL = "A/A 6.1.0-57, fault.anon, wall clock, docs/fault.md"
FAULT_AA_ICOUNT = "A/A 6.1.0-57, fault.anon, icount:4, docs/fault.md"
FAULT_WALL_SD, FAULT_WALL_BLOCKS = 0.44, 6
FAULT_ICOUNT_SD, FAULT_ICOUNT_BLOCKS = 0.00011, 6
MANY_GUESTS_SD, MANY_GUESTS_BLOCKS = 0.016, 6
QUIET_OR_KVM = (
    "timed by the host: on a shared TCG host the host's load spreads it on every clock; a quiet host or KVM "
    "would decide it"
)

PRIMARIES: tuple[Primary, ...] = (
    Primary(
        "balloon.inflate",
        "inflate_s",
        "what a host waits for when it takes memory back",
        instrument=HOST_WALL,
        # On icount the guest's own timing of the same inflate, each guest
        # booted from fixed inputs: 0.0045 against the host-timed 0.043 in
        # the same six A/A blocks (0.064 and 0.14 over nine blocks of boots
        # the host's time and random bytes fed), 0.0018 in the plan's four,
        # 0.0025 and 0.0024 in two runs of four sharing the host: pooled 0.0032.
        on_icount="inflate_guest_s",
        spread_wall=Spread(0.26, 4, WALL_AA),
        spread_icount=Spread(0.0032, 18, ICOUNT_AA_POOLED),
        margin_icount=TIGHT_MARGIN,
        needs=QUIET_OR_KVM + "; on icount the guest's own timing decides it, at 0.3 % from block to block",
    ),
    Primary(
        "balloon.deflate",
        "deflate_s",
        "what a guest waits for when it gets memory back",
        instrument=HOST_WALL,
        # On icount the guest's own timing, boots from fixed inputs: 0.0064
        # against the host-timed 0.087 in the same six A/A blocks (0.046
        # and 0.23 over nine blocks of boots fed by the host), and 0.0116
        # in the plan's four, 0.0054 and 0.0063 in two runs of four sharing
        # the host: pooled 0.0076, past what a 1 % margin allows in about 6
        # blocks (TIGHT_SPREAD_MAX), so 5 % on icount too.
        on_icount="deflate_guest_s",
        spread_wall=Spread(0.36, 4, WALL_AA),
        spread_icount=Spread(0.0076, 18, ICOUNT_AA_POOLED),
        margin_icount=WIDE_MARGIN,
        needs=QUIET_OR_KVM + "; on icount the guest's own timing decides it, at 0.8 % from block to block: judged "
        "at 5 % there, just past the 0.75 % a 1 % margin allows (TIGHT_SPREAD_MAX)",
    ),
    Primary(
        "balloon.request_size",
        "per_page_ns",
        "the slope of the request-size curve: the driver's cost per page, which is what a change to "
        "its request handling moves; the per-size times are its points (exploratory)",
        instrument=HOST_WALL,
        # On icount the same fit on the driver's own span, read with the
        # guest's clock: over 3 blocks of 6.1 against 6.12 on a loaded host
        # (boots the host fed) its log(B/A) spread 0.060, the host-timed
        # slope's 0.98; its first icount A/A, on boots from fixed inputs
        # (the plan's four blocks), 0.0029; sharing the host, 0.00037 over
        # four and 0.011 over two (one block's -1.6 %): pooled 0.0047.
        on_icount="driver_per_page_ns",
        spread_wall=Spread(0.28, 2, WALL_612),
        spread_icount=Spread(0.0047, 10, ICOUNT_AA_PLAN),
        margin_icount=TIGHT_MARGIN,
        needs=QUIET_OR_KVM + "; on icount the driver's guest-timed slope decides it, at 0.5 % from block to block "
        "over three A/As (10 blocks)",
    ),
    Primary(
        "balloon.floor",
        "floor_mib",
        "how far a guest can be ballooned down before it stops giving",
        instrument=COUNT,
        spread_wall=Spread(0.008, 3, WALL_AA),
        # Not a clock-free count on icount: the probe stops at a stall
        # window of host wall time (0.6 s), in which a guest taking turns
        # in one host thread gets less done.  log(B/A) 0.002 and -0.087
        # over 2 blocks of 6.1 against 6.12.
        spread_icount=Spread(0.063, 2, ICOUNT_612),
        needs="on icount the probe's stall window is host wall time, so the host's pace moves where it stops "
        "(6 % over 2 icount blocks against 0.8 % over 3 wall ones): decide it on the wall clock",
    ),
    Primary(
        "balloon.free_page_reporting",
        "rss_return_s",
        "how soon reported free pages leave the host; with reporting off the time is the watched "
        "window itself (the RSS must stay up), a check, not a cost",
        variant=(("free_page_reporting", True),),
        instrument=HOST_WALL,
        spread_wall=Spread(0.011, 3, WALL_AA),
        # On icount the guest reports on its own (virtual) clock, which
        # jumps while it idles, and the host watches RSS in wall time:
        # log(B/A) 1.94 and 0.73 over 2 blocks of 6.1 against 6.12.
        spread_icount=Spread(0.85, 2, ICOUNT_612),
        needs=QUIET_OR_KVM + "; on icount it spreads 85 % over 2 blocks against 1.1 % on the wall clock: decide "
        "it on the wall clock; no count decides it on icount: Linux's page reporting and QEMU's device count no "
        "reported pages, and the guest cannot see when the host's RSS falls -- a guest tracepoint at each report "
        "(the guest's clock when its last block went) would",
    ),
    Primary(
        "ksm.volatile_scan",
        "ksmd_cpu_ns_per_page",
        "ksmd's CPU per page covered with smart scan (on by default since Linux 6.7) on 4 KiB pages: "
        "what the guest's pages make the host pay; without smart scan it is the host's own checksum "
        "cost (the in-guest reference), and on THP the host's huge page splits weigh in",
        variant=(("pages", "4k"), ("smart_scan", 1)),
        instrument=HOST_CPU,
        spread_wall=Spread(0.067, 3, WALL_AA),
        spread_icount=Spread(0.114, 6, ICOUNT_AA_KSM),
        needs="the host's ksmd CPU time: a quiet host or KVM would decide it (11 % over 6 icount A/A blocks).  "
        "ksmd's counts (pages_scanned, pages_skipped, full_scans) do not decide it: they are not its cost.  "
        "On icount pages_skipped_per_scan repeated to 0.05 % over the same 6 A/A blocks (the guests' "
        "dirtying is guest instructions there), so a skip count could decide how much smart scan saves, not "
        "what a page costs",
    ),
    Primary(
        "ksm.merge",
        "merged_fraction",
        "identical guest pages merge; with mem-merge=off nothing may merge, a check",
        variant=(("mem_merge", True),),
        instrument=COUNT,
        spread_wall=Spread(0.001, 2, WALL_612),
        spread_icount=Spread(0.0007, 6, ICOUNT_AA_KSM),
        margin=TIGHT_MARGIN,
    ),
    Primary(
        "ksm.guest_merge",
        "merged_fraction",
        "the guest kernel's own ksmd merges its pages",
        instrument=COUNT,
        spread_wall=Spread(0.0, 2, WALL_612),
        spread_icount=Spread(0.0, 6, ICOUNT_AA_KSM),
        margin=TIGHT_MARGIN,
    ),
    Primary(
        "ksm.many_guests",
        "saved_mib",
        "the saving with the scenario's three guests; the one- and two-guest points fit the model",
        variant=(("guests", 3),),
        instrument=COUNT,
        spread_wall=Spread(0.003, 2, WALL_612),
        # On icount the guests are paused while ksmd settles them
        # (host/ksm/sharing.py), and the saving still moved 1.6 % between
        # blocks: too wide for 1 % there.
        spread_icount=Spread(MANY_GUESTS_SD, MANY_GUESTS_BLOCKS, ICOUNT_AA_KSM),
        margin=TIGHT_MARGIN,
        margin_icount=WIDE_MARGIN,
        needs="on icount the saving moved 1.6 % between A/A blocks, though the guests rest while ksmd settles "
        "them: judged at 5 % there; the wall clock's 0.3 % decides it at 1 %",
    ),
    Primary(
        "hugetlbfs.balloon",
        "inflate_s",
        "what a host waits for when it takes memory back from a guest on 2 MiB pages",
        (("backing", "hugetlbfs"),),
        spread_wall=Spread(1.0, 2, "A/A 6.1.0-57, hugetlbfs only, wall clock, load 12-16, docs/hugetlbfs.md"),
        needs=QUIET_OR_KVM,
    ),
    Primary(
        "fault.anon",
        "ns_per_page",
        "the guest kernel's first touch of an anonymous 4 KiB page (the fault, the zeroing, the page table "
        "update): what every guest workload pays, and what a patch to the fault path or the page allocator moves",
        variant=(("pages", "4k"),),
        instrument=GUEST_CLOCK,
        spread_wall=Spread(FAULT_WALL_SD, FAULT_WALL_BLOCKS, FAULT_AA_WALL),
        spread_icount=Spread(FAULT_ICOUNT_SD, FAULT_ICOUNT_BLOCKS, FAULT_AA_ICOUNT),
        margin=FINE_MARGIN,
        needs="on the wall clock the host's load is in the guest's time (multi-threaded TCG): decide it on icount, "
        "where it repeats within a few parts in 10,000",
    ),
    Primary(
        "memslots.trace_mmio",
        "nodes_per_lookup",
        "the guest's MMIO trace through today's memslot tree (rbtree); the other structures replay the "
        "same trace, so they move only when this does",
        variant=(("structure", "rbtree"),),
        instrument=COUNT,
        spread_wall=Spread(0.0, 2, WALL_612),
        spread_icount=Spread(0.0, 6, ICOUNT_AA_MEMSLOTS),
        margin=TIGHT_MARGIN,
    ),
)

# Whole scenarios that run on the host alone (no guest kernel in them).
CONTROL_SCENARIOS: frozenset[str] = frozenset({"memslots.kvm", "memslots.kvm_lookup"})


def role(scenario: str, metric: str, variant: Mapping[str, Any] | None = None, clock: str = "") -> str:
    """PRIMARY, CONTROL or EXPLORATORY, for a record read on ``clock``."""
    if scenario in CONTROL_SCENARIOS:
        return CONTROL
    if primary_of(scenario, metric, variant, clock) is not None:
        return PRIMARY
    return EXPLORATORY


def is_primary(scenario: str, metric: str, variant: Mapping[str, Any] | None = None, clock: str = "") -> bool:
    return role(scenario, metric, variant, clock) == PRIMARY


def primary_of(scenario: str, metric: str, variant: Mapping[str, Any] | None = None, clock: str = "") -> Primary | None:
    """The primary this record's metric decides on ``clock``, if any."""
    return next((p for p in PRIMARIES if p.matches(scenario, metric, variant, clock)), None)


def margin(scenario: str, metric: str, variant: Mapping[str, Any] | None, clock: str, default: float) -> float:
    """The equivalence margin of this metric: its primary's, else ``default``."""
    found = primary_of(scenario, metric, variant, clock)
    return found.margin_on(clock) if found is not None else default


def is_control(scenario: str) -> bool:
    return scenario in CONTROL_SCENARIOS
