"""How big each scenario runs, by profile: one table, one row a profile.

- ``quick``: one kernel, sized for CI and a first look (each claim gets the
  units its verdict needs, docs/claims-calibration.md).
- ``full``: the lab's sizes: more guests, repeats, slot counts.
- ``ab``: the sizing of an interleaved A/B (host/run/blocks.py), the default
  when ``memqual run`` is given two kernels or two QEMUs.  The independent
  unit of an A/B is the block, so each (block, arm) visit boots ONE fresh
  guest and gives each primary one value (where a few samples inside that
  guest steady it, their median: the balloon's 3 cycles, ksmd's 3
  windows): more blocks, not more guests per
  block, buy the decision, and a block of every primary-bearing scenario
  costs minutes rather than half an hour.  Only tests tagged ``ab`` (they
  record a primary or a negative control, host/judge/primaries.py) run in the
  blocks; the boot checks run once per arm; the rest (exploratory metrics,
  the lab-host machinery) are left to ``--profile quick``.

A scenario reads its row at run time (``sizes()``), never at import, so one
process can look at several profiles (tests/) and the row follows
``MEMQUAL_PROFILE`` as set by ``memqual run``.
"""

from __future__ import annotations

import dataclasses

from memqual.host.core import settings
from memqual.host.core.errors import BadInput

ENV_PROFILE = settings.PROFILE
QUICK = "quick"
FULL = "full"
AB = "ab"
PROFILES = (QUICK, FULL, AB)
# The Avocado tag of the tests an A/B runs in blocks.
AB_TAG = "ab"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One profile's row.  Guests are fresh guests (independent units);
    repeats and windows are samples inside one guest."""

    balloon_repeats: int  # timed inflate/deflate cycles per guest (scenario 1)
    balloon_calibrate: bool  # the smaller inflates that calibrate the transfer-cost model
    balloon_large_guests: bool  # scenario 2's 2 and 4 GiB guests
    driver_guests: int  # fresh guests of the balloon driver's request-size curve
    driver_curve: bool  # every size of the curve, not only the seed's three bitmaps and the stock 256
    ksm_volatile_guests: int  # fresh guests per smart-scan variant
    ksm_volatile_windows: int  # measured windows per variant per guest
    ksm_reference_scans: int  # full scans in a smart_scan=0 window (smart scan's hold its 9-scan skip period)
    ksm_smart_windows: int  # smart_scan=1 windows back to back at each of its turns (a guest's median over them)
    ksm_many_guests: int  # guests sharing memory (the saving's n)
    ksm_remerge_repeats: int  # timed re-merges of the settled guests
    kvm_lookup_replicates: int  # fresh VMs per slot count of the /dev/kvm lookup bench
    kvm_lookup_all_slots: bool  # the full slot-count curve, not the quick points
    virtio_mem_full: bool  # 1 GiB and 3/4 of the guest, five cycles; else 256 MiB, two


SIZES: dict[str, Sizes] = {
    QUICK: Sizes(
        balloon_repeats=2,
        balloon_calibrate=True,
        balloon_large_guests=False,
        driver_guests=3,
        driver_curve=False,
        ksm_volatile_guests=4,
        ksm_volatile_windows=1,
        ksm_reference_scans=9,
        ksm_smart_windows=1,
        ksm_many_guests=3,
        ksm_remerge_repeats=3,
        kvm_lookup_replicates=3,
        kvm_lookup_all_slots=False,
        virtio_mem_full=False,
    ),
    FULL: Sizes(
        balloon_repeats=5,
        balloon_calibrate=True,
        balloon_large_guests=True,
        driver_guests=5,
        driver_curve=True,
        ksm_volatile_guests=8,
        ksm_volatile_windows=2,
        ksm_reference_scans=9,
        ksm_smart_windows=1,
        ksm_many_guests=5,
        ksm_remerge_repeats=5,
        kvm_lookup_replicates=6,
        kvm_lookup_all_slots=True,
        virtio_mem_full=True,
    ),
    AB: Sizes(
        # A guest's median over 3 timed cycles, not its first alone: the
        # first inflate and deflate of a freshly booted guest scatter most,
        # and a host takes memory back from guests that have run a while.
        # The blocks' sd of log(B/A), 6.1 against 6.12 here, first cycle
        # against the median of 3: 0.21 and 0.24 against 0.105 and 0.109
        # (inflate, deflate; 5 blocks), 0.125 and 0.20 against 0.091 and
        # 0.145 (the until-decided run's 3 blocks): 2x-4x less variance,
        # for 2.2x the time of that test (about 24 s more a guest; 14 %
        # more for a block of every scenario).  docs/balloon.md, "In an A/B".
        balloon_repeats=3,
        balloon_calibrate=False,
        balloon_large_guests=False,
        driver_guests=1,
        driver_curve=False,
        ksm_volatile_guests=1,
        ksm_volatile_windows=1,
        # The primary is the cost with smart scan; the window without it is
        # the in-guest reference (exploratory), and its scans cost the same
        # every time: 3 of them, not 9, save about 16 s a guest here.
        ksm_reference_scans=3,
        # The primary's one window is 9 scans, 0.2-0.3 s of ksmd CPU, and a
        # burst of other work on the host in it moves it by up to 17 %.  A
        # guest's median over 3 windows back to back cut the variance of
        # the blocks' log(B/A) 1.4x in the same 12 blocks, for about 1 s
        # more a guest on a quiet host; 5 windows gave 1.5x for twice that
        # (docs/ksm.md, "In an A/B: what spreads the blocks").
        ksm_smart_windows=3,
        # The saving's n is part of the metric: the same 3 guests as quick.
        ksm_many_guests=3,
        ksm_remerge_repeats=1,
        kvm_lookup_replicates=1,
        kvm_lookup_all_slots=False,
        virtio_mem_full=False,
    ),
}


def current() -> str:
    """The profile ``memqual run`` set for this process (quick when none)."""
    name = settings.profile() or QUICK
    if name not in SIZES:
        raise BadInput(f"{ENV_PROFILE}={name!r}: use one of {', '.join(PROFILES)}")
    return name


def sizes(name: str | None = None) -> Sizes:
    """A profile's row; the current one's by default."""
    return SIZES[name or current()]


def on_clock(row: Sizes, icount: bool) -> Sizes:
    """``row`` as it runs on the icount clock (host/core/clock.py), when
    ``icount``.  The A/B's three timed balloon cycles a guest are a median
    against the wall clock's noise; under icount the balloon's primaries
    are the guest's own timings, which repeat from cycle to cycle, and each
    cycle costs 45-75 s of wall time at load 6-16 (every vCPU in one host
    thread): one cycle, a third of the test (docs/ab-calibration.md, "What
    icount costs in wall time here")."""
    if not icount or row != SIZES[AB]:
        return row
    return dataclasses.replace(row, balloon_repeats=1)
