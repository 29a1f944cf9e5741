"""The cost of ksmd's scanning, measured in whole full scans.

Windows that start and end on a full_scans increment, smart_scan
alternated in ABBA order with warm-up scans discarded, one fresh guest a
replicate; the claim metric is ksmd CPU nanoseconds per page covered, and
pages per ksmd CPU-second is the seed's own quantity beside it.  Why so:
docs/ksm.md, "How host/ksm/scancost.py measures the scan cost".
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

from memqual.host.core import descriptive
from memqual.host.ksm.controller import KsmDriver
from memqual.host.ksm.schedule import (
    AnonHuge,
    AwaitMark,
    Mark,
    OwnPages,
    ScanEnds,
    SetKnob,
    Step,
    WholeSchedule,
    steps_of,
)
from memqual.host.ksm.sysfs import KsmCounters


@dataclasses.dataclass(frozen=True)
class ScanWindow:
    """ksmd's work between two readings that both sit on a full-scan end."""

    smart_scan: int
    wall_s: float
    cpu_s: float
    full_scans: int
    pages_scanned: int
    pages_skipped: int
    pages_volatile: int  # at the window's end
    # Pages KSM tracks for the guest under test (QEMU's ksm_rmap_items) at
    # the window's end; None when not read.  Beside the pages a scan covers
    # it says how much of ksmd's work was this guest's and how much other
    # guests' on the host.
    own_pages: int | None = None
    # ksmd's times on a CPU and the host's interrupts in the window, where
    # its readings have them (KsmCounters): what a window's CPU time may
    # hold besides ksmd's own work.
    ksmd_slices: int | None = None
    interrupts: int | None = None

    @classmethod
    def between(cls, start: KsmCounters, end: KsmCounters, smart_scan: int, own_pages: int | None = None) -> ScanWindow:
        if start.ksmd_cpu_s is None or end.ksmd_cpu_s is None:
            raise ValueError("ksmd's CPU time is unknown (ksmd thread not found)")
        return cls(
            smart_scan=smart_scan,
            wall_s=end.taken_s - start.taken_s,
            cpu_s=end.ksmd_cpu_s - start.ksmd_cpu_s,
            full_scans=end.full_scans - start.full_scans,
            pages_scanned=pages_compared(start, end),
            pages_skipped=(end.pages_skipped or 0) - (start.pages_skipped or 0),
            pages_volatile=end.pages_volatile,
            own_pages=own_pages,
            ksmd_slices=_grown(start.ksmd_slices, end.ksmd_slices),
            interrupts=_grown(start.interrupts, end.interrupts),
        )

    @property
    def pages_covered(self) -> int:
        """Pages the window's scans went over: compared or skipped."""
        return self.pages_scanned + self.pages_skipped

    @property
    def cpu_ns_per_page(self) -> float:
        return self.cpu_s * 1e9 / self.pages_covered if self.pages_covered else float("nan")

    @property
    def cpu_s_per_full_scan(self) -> float:
        return self.cpu_s / self.full_scans

    @property
    def full_scans_per_s(self) -> float:
        return self.full_scans / self.wall_s

    @property
    def pages_per_cpu_s(self) -> float:
        """Pages covered per ksmd CPU-second: the seed's scan speed, as a
        saturated ksmd would reach it per wall second."""
        return self.pages_covered / self.cpu_s if self.cpu_s > 0 else float("nan")

    @property
    def pages_per_scan(self) -> float:
        return self.pages_covered / self.full_scans if self.full_scans else float("nan")

    @property
    def own_share(self) -> float | None:
        """The guest under test's share of the pages a scan covered."""
        if self.own_pages is None or not self.pages_covered:
            return None
        return self.own_pages / self.pages_per_scan

    @property
    def pages_scanned_per_cpu_s(self) -> float:
        return self.pages_scanned / self.cpu_s if self.cpu_s > 0 else float("nan")

    @property
    def pages_skipped_per_scan(self) -> float:
        return self.pages_skipped / self.full_scans

    @property
    def ksmd_cpu_share(self) -> float:
        """ksmd's CPU time over wall time: near 1 means ksmd was saturated,
        as in the seed's set-up."""
        return self.cpu_s / self.wall_s

    def to_json(self) -> dict[str, float | int | None]:
        data: dict[str, float | int | None] = dataclasses.asdict(self)
        for name in METRICS:
            data[name] = getattr(self, METRICS[name].attribute)
        data["own_share"] = self.own_share
        return data


def _grown(start: int | None, end: int | None) -> int | None:
    """A counter's growth between two readings; None where either lacks it."""
    return end - start if start is not None and end is not None else None


@dataclasses.dataclass(frozen=True)
class Metric:
    attribute: str
    unit: str
    better: str


# Record metric name -> how it is computed.  The first is the claim's.
METRICS: dict[str, Metric] = {
    "ksmd_cpu_ns_per_page": Metric("cpu_ns_per_page", "ns", "lower"),
    "pages_per_ksmd_cpu_s": Metric("pages_per_cpu_s", "pages/s", "higher"),  # the seed's scan speed
    "ksmd_cpu_s_per_full_scan": Metric("cpu_s_per_full_scan", "s", "lower"),
    "full_scans_per_s": Metric("full_scans_per_s", "1/s", "higher"),
    "pages_scanned_per_ksmd_cpu_s": Metric("pages_scanned_per_cpu_s", "pages/s", "higher"),
    "pages_skipped_per_scan": Metric("pages_skipped_per_scan", "pages", "higher"),
    "ksmd_cpu_share": Metric("ksmd_cpu_share", "", "higher"),
}


def _readings(ksm: KsmDriver, scans: int, timeout_s: float) -> list[KsmCounters]:
    """One reading at each of the next `scans` full-scan ends."""
    return ksm.scan_end_readings(scans, timeout_s)


def covered_per_scan(readings: Sequence[KsmCounters]) -> list[int]:
    """Pages each scan went over, between consecutive full-scan ends: the
    number of mergeable pages on the host at the time."""
    return [
        pages_compared(a, b) + (b.pages_skipped or 0) - (a.pages_skipped or 0) for a, b in itertools.pairwise(readings)
    ]


def pages_compared(start: KsmCounters, end: KsmCounters) -> int:
    """Pages ksmd compared between two readings: pages_scanned's growth
    (Linux 6.5+); before it, the full scans times the pages KSM tracks
    then (shared, sharing, unshared and volatile: one rmap item each, and
    a scan without smart scan visits every one), read at the end."""
    if start.pages_scanned is not None and end.pages_scanned is not None:
        return end.pages_scanned - start.pages_scanned
    tracked = end.pages_shared + end.pages_sharing + end.pages_unshared + end.pages_volatile
    return (end.full_scans - start.full_scans) * tracked


def replicate_first(index: int) -> int:
    """The smart_scan value a guest measures first: 0 for guests 0, 3, 4,
    7, ..., 1 for guests 1, 2, 5, 6, ... (ABBA across guests), so a
    drift over the run and whatever the first window after settling has
    in common fall on both variants alike."""
    return 0 if index % 4 in (0, 3) else 1


def abba_order(repeats: int, variants: Sequence[int] = (0, 1)) -> list[int]:
    """0 1 1 0 0 1 1 0 ...: each variant `repeats` times, balanced against
    a linear drift."""
    a, b = variants
    order: list[int] = []
    for i in range(repeats):
        order += [a, b] if i % 2 == 0 else [b, a]
    return order


@dataclasses.dataclass
class AbRun:
    """The windows of a smart_scan A/B.  `discarded` were thrown away
    because the host's mergeable memory changed under them; once the retry
    budget is spent, disturbed windows are kept and counted in
    `kept_disturbed` (the report then shows a noisier host, not a gap)."""

    windows: dict[int, list[ScanWindow]]
    discarded: list[ScanWindow]
    kept_disturbed: int
    reference_pages: list[int]  # pages per scan after each (re)settle
    # A whole schedule that waited for the guest's mark: when L1 saw it,
    # and the guest QEMU's AnonHugePages (kB) then.
    mark: Mark | None = None
    anon_huge_kib_at_mark: int | None = None


def alternate_smart_scan(
    ksm: KsmDriver,
    repeats: int,
    scans_per_window: int,
    warmup_scans: int,
    timeout_s: float,
    settle_scans: int = 12,
    tolerance: float = 0.01,
    max_retries: int = 3,
    on_window: Callable[[ScanWindow], None] | None = None,
    first: int = 0,
    own_pages: Callable[[], int | None] | None = None,
    reference_scans: int | None = None,
    smart_windows: int = 1,
    has_smart_scan: bool = True,
    start: dict[str, int] | None = None,
    await_mark: bool = False,
) -> AbRun:
    """smart_scan 0 against 1, ABBA, `repeats` turns each, starting with
    smart_scan=`first`.  `own_pages`, when given, is read at the end of
    each turn (the guest under test's tracked pages, ``ScanWindow.own_pages``
    of the turn's windows).

    Other guests on the host come and go (and balloons change their RSS);
    their pages are scanned too, and fresh pages are not skipped by smart
    scan until they have aged (ages grow only in smart_scan=1 scans).  So:
    settle with `settle_scans` smart scans and note the pages per scan; a
    window whose warm-up or scans see that count move by more than
    `tolerance` is thrown away, the host settles again and the window is
    measured again, up to `max_retries` times per run; after that disturbed
    windows are kept (the time a run takes stays bounded).

    `reference_scans`, when given, is the length of a smart_scan=0 window:
    without smart scan every scan covers every page at the same cost, so
    that window needs no whole skip period (`scans_per_window` is for
    smart scan's), and at about 2.7 s a scan here a shorter one is most of
    what a guest of the A/B sizing saves.

    `smart_windows` smart_scan=1 windows are measured back to back at each
    of its turns, each its own ScanWindow (the warm-up comes once, before
    the first: smart_scan does not change between them).  A guest's median
    over them leaves out the windows a burst of other work on the host fell
    on, at one window's scans each.  A disturbed turn costs one retry, and
    is kept in `discarded` as one window over all its measured scans.

    A kernel without smart scan (``has_smart_scan`` False: before 6.7) has
    `repeats` smart_scan=0 windows only, what its ksmd always does: a host
    kernel A/B compares them with the other kernel's.

    `start` are knobs written first (``run=1``: ksmd starts with the
    measurement).  A KSM that runs a whole schedule (a host under test,
    host/ksm/schedule.py) gets all of it as one: its knobs written at scan
    ends, no window measured again (its windows are decided in advance:
    a disturbed one is kept and counted), ``own_pages`` read by the
    schedule itself.  With ``await_mark`` the schedule starts by waiting
    for the guest's mark (its agent's dirtying under way), reads the
    guest QEMU's AnonHugePages, then writes ``start``: ksmd starts at a
    moment of the guest's work, not of memqual's commands."""
    if smart_windows < 1:
        raise ValueError(f"smart_windows must be at least 1, not {smart_windows}")
    if isinstance(ksm, WholeSchedule):
        return _as_one_schedule(
            ksm,
            repeats,
            scans_per_window,
            warmup_scans,
            timeout_s,
            settle_scans,
            tolerance,
            on_window,
            first,
            reference_scans,
            smart_windows,
            has_smart_scan,
            start,
            await_mark,
        )
    if await_mark:
        raise ValueError("only a KSM that runs a whole schedule waits for a guest's mark")
    if start:
        ksm.set(**start)
    run = AbRun(windows={0: [], 1: []}, discarded=[], kept_disturbed=0, reference_pages=[])
    reference = _settle(ksm, settle_scans, timeout_s, has_smart_scan)
    run.reference_pages.append(reference)
    order = _turn_order(repeats, first, has_smart_scan)
    i = 0
    while i < len(order):
        variant = order[i]
        if has_smart_scan:
            ksm.set(smart_scan=variant)
        length = reference_scans if variant == 0 and reference_scans else scans_per_window
        count = smart_windows if variant == 1 else 1
        # The switch lands mid-scan: the first reading only aligns.
        readings = _readings(ksm, 1 + warmup_scans + count * length, timeout_s)
        own = own_pages() if own_pages is not None else None
        ends = [warmup_scans + j * length for j in range(count + 1)]
        windows = [ScanWindow.between(readings[a], readings[b], variant, own) for a, b in itertools.pairwise(ends)]
        counts = covered_per_scan(readings)
        if any(abs(c - reference) > tolerance * reference for c in counts):
            if len(run.discarded) < max_retries:
                run.discarded.append(ScanWindow.between(readings[warmup_scans], readings[-1], variant, own))
                reference = _settle(ksm, settle_scans, timeout_s, has_smart_scan)
                run.reference_pages.append(reference)
                continue
            run.kept_disturbed += len(windows)
        run.windows[variant].extend(windows)
        if on_window is not None:
            for window in windows:
                on_window(window)
        i += 1
    return run


def _turn_order(repeats: int, first: int, has_smart_scan: bool) -> list[int]:
    return abba_order(repeats, (first, 1 - first)) if has_smart_scan else [0] * repeats


def _as_one_schedule(
    ksm: WholeSchedule,
    repeats: int,
    scans_per_window: int,
    warmup_scans: int,
    timeout_s: float,
    settle_scans: int,
    tolerance: float,
    on_window: Callable[[ScanWindow], None] | None,
    first: int,
    reference_scans: int | None,
    smart_windows: int,
    has_smart_scan: bool,
    start: dict[str, int] | None,
    await_mark: bool,
) -> AbRun:
    """``alternate_smart_scan`` as one schedule: the same turns, windows and
    readings, each knob written at the scan end before its turn."""
    parts: list[Step | list[Step]] = [AwaitMark(), AnonHuge()] if await_mark else []
    parts += [SetKnob(name, value) for name, value in (start or {}).items()]
    if has_smart_scan:
        parts.append(SetKnob("smart_scan", 1))
    else:
        settle_scans = min(settle_scans, PLAIN_SETTLE_SCANS)
    parts.append(ScanEnds(max(settle_scans, 1) + 1))
    order = _turn_order(repeats, first, has_smart_scan)
    spans: list[tuple[int, list[int]]] = []
    for variant in order:
        length = reference_scans if variant == 0 and reference_scans else scans_per_window
        count = smart_windows if variant == 1 else 1
        turn: list[Step] = [SetKnob("smart_scan", variant)] if has_smart_scan else []
        parts.append([*turn, ScanEnds(1 + warmup_scans + count * length), OwnPages()])
        spans.append((variant, [warmup_scans + j * length for j in range(count + 1)]))
    schedule = steps_of(parts)
    outcome = ksm.run_schedule(schedule, timeout_s)
    settle, *turns = outcome.scan_ends
    reference = covered_per_scan(settle)[-1]
    run = AbRun(
        windows={0: [], 1: []},
        discarded=[],
        kept_disturbed=0,
        reference_pages=[reference],
        mark=outcome.marks[0] if outcome.marks else None,
        anon_huge_kib_at_mark=outcome.anon_huge_kib[0] if outcome.anon_huge_kib else None,
    )
    for (variant, ends), readings, own in zip(spans, turns, outcome.own_pages, strict=True):
        windows = [ScanWindow.between(readings[a], readings[b], variant, own) for a, b in itertools.pairwise(ends)]
        if any(abs(c - reference) > tolerance * reference for c in covered_per_scan(readings)):
            run.kept_disturbed += len(windows)
        run.windows[variant].extend(windows)
        for window in windows:
            if on_window is not None:
                on_window(window)
    return run


# Without smart scan nothing ages: a page's first scan gives it its
# rmap item and checksum, and from the second on each scan covers every
# page at the same cost (the volatile pages never reach the unstable
# tree), so two scans settle it.
PLAIN_SETTLE_SCANS = 2


def _settle(ksm: KsmDriver, scans: int, timeout_s: float, has_smart_scan: bool = True) -> int:
    """Smart scans until every page has aged (on a kernel without smart
    scan, PLAIN_SETTLE_SCANS plain ones); the pages per scan then."""
    if has_smart_scan:
        ksm.set(smart_scan=1)
    else:
        scans = min(scans, PLAIN_SETTLE_SCANS)
    # The first reading only aligns on a scan end; at least one whole scan.
    readings = _readings(ksm, max(scans, 1) + 1, timeout_s)
    return covered_per_scan(readings)[-1]


def samples(windows: Sequence[ScanWindow], metric: str) -> list[float]:
    attribute = METRICS[metric].attribute
    return [float(getattr(w, attribute)) for w in windows]


def replicates(runs: Sequence[AbRun], variant: int, metric: str) -> list[list[float]]:
    """One list of window samples per guest (independent unit), for
    ``Measurement.replicates``; guests with no window of the variant are
    left out."""
    groups = [samples(run.windows[variant], metric) for run in runs]
    return [g for g in groups if g]


def replicate_ratios(runs: Sequence[AbRun], metric: str) -> list[float]:
    """Per guest: median of the metric with smart_scan=0 over its median
    with smart_scan=1 (for the claim metric, each guest's own speed-up).
    Shown beside the pooled ratio: the spread between guests is what the
    CI has to cover."""
    out = []
    for run in runs:
        off, on = samples(run.windows[0], metric), samples(run.windows[1], metric)
        if off and on:
            out.append(descriptive.ratio_of_medians(on, off))
    return out
