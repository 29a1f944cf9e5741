"""Synthetic runs of KSM scenario 3 (the volatile scan), through the
scenario's own record builder, host/ksm/volatile.py's ``volatile_records``
(what e2e/test_ksm.py writes): scan windows and dirty passes go in, the
records a real run writes come out."""

from __future__ import annotations

import numpy as np

from memqual.host.core import profiles
from memqual.host.core.record import Measurement
from memqual.host.ksm import volatile
from memqual.host.ksm.scancost import AbRun, ScanWindow
from memqual.host.ksm.table import VOLATILE_SCAN

KERNEL_LIMIT = volatile.SkipLimit(8, "skip_age() of a synthetic mm/ksm.c")
PAGES_PER_SCAN = 88_000  # what a scan covered here: the agent's 65,536 and the guest's other pages
SCANS = 9
WINDOW_S = 2.0  # a window's wall time: 4.5 full scans a second
DIRTY_S = 60.0
# 2 dirty passes a second against 4.5 full scans a second.
DIRTY_PASSES_PER_SCAN = 2.0 / (SCANS / WINDOW_S)


def window(smart_scan: int, ns_per_page: float, skip_share: float) -> ScanWindow:
    covered = SCANS * PAGES_PER_SCAN
    skipped = round(covered * skip_share) if smart_scan else 0
    return ScanWindow(
        smart_scan=smart_scan,
        wall_s=WINDOW_S,
        cpu_s=covered * ns_per_page / 1e9,
        full_scans=SCANS,
        pages_scanned=covered - skipped,
        pages_skipped=skipped,
        pages_volatile=70_000,
        own_pages=66_000,
    )


def ksm_guests(
    speedup: float,
    skip_share: float,
    n: int = VOLATILE_SCAN.sizes_for(profiles.QUICK).guests,
    seed: int = 3,
    *,
    dirty_passes_per_scan: float = DIRTY_PASSES_PER_SCAN,
    dirty_spread: float = 0.0,
    cost_scale: float = 1.0,
) -> list[volatile.VolatileGuest]:
    """n fresh guests whose ksmd costs ``speedup`` times less per page with
    smart scan, each on a host as loaded as it happened to be (the load
    moves both variants of a guest alike).  Each guest dirties at
    ``dirty_passes_per_scan`` times a log-normal factor of sd
    ``dirty_spread``; ``cost_scale`` multiplies ksmd's cost with smart
    scan (a kernel that makes smart scan dearer)."""
    rng = np.random.default_rng(seed)
    # Its own generator: the costs drawn for a seed do not depend on the dirtying.
    dirt = np.random.default_rng(seed + 1000)
    guests = []
    for i in range(n):
        load = float(np.exp(rng.normal(0, 0.2)))
        off = 100.0 * load * float(np.exp(rng.normal(0, 0.03)))
        on = cost_scale * 100.0 * load / speedup * float(np.exp(rng.normal(0, 0.03)))
        run = AbRun(
            windows={0: [window(0, off, 0.0)], 1: [window(1, on, skip_share)]},
            discarded=[],
            kept_disturbed=0,
            reference_pages=[PAGES_PER_SCAN],
        )
        rate = (
            dirty_passes_per_scan * float(np.exp(dirt.normal(0, dirty_spread)))
            if dirty_spread
            else dirty_passes_per_scan
        )
        guests.append(
            volatile.VolatileGuest(
                run=run,
                first_smart_scan=i % 2,
                started_warm=True,
                boot_to_ssh_s=1.0,
                anon_huge_kib=(0, 0),
                dirty_passes=round(rate * (SCANS / WINDOW_S) * DIRTY_S),
                dirty_s=DIRTY_S,
            )
        )
    return guests


def ksm_records(
    speedup: float,
    skip_share: float = 0.83,
    pages: str = "4k",
    limit: volatile.SkipLimit = KERNEL_LIMIT,
    *,
    n: int = VOLATILE_SCAN.sizes_for(profiles.QUICK).guests,
    seed: int = 3,
    dirty_passes_per_scan: float = DIRTY_PASSES_PER_SCAN,
    dirty_spread: float = 0.0,
    cost_scale: float = 1.0,
) -> list[Measurement]:
    """The records of one run of ``ksm_guests``."""
    guests = ksm_guests(
        speedup,
        skip_share,
        n,
        seed=seed,
        dirty_passes_per_scan=dirty_passes_per_scan,
        dirty_spread=dirty_spread,
        cost_scale=cost_scale,
    )
    settings = {"profile": "quick", "agent_mib": 256}
    return volatile.volatile_records(pages, guests, settings, limit=limit)
