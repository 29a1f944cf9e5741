"""Reading and writing the host's KSM and THP knobs in sysfs.

The roots are parameters so tests drive a fake tree (the real ones are
memqual.host.core.environment.KSM_ROOT and THP_ROOT).  A "knob" is a file the
owner may write (mode has u+w): discovered, not listed, so the snapshot of a
newer kernel's knobs is complete without code changes.  Multiple-choice knobs
("[none] scan-time", "always [madvise] never") are read as their selected
word, which is also what they accept when written.
"""

from __future__ import annotations

import dataclasses

# THP files a scenario may touch; the rest of THP stays out of the snapshot.
THP_KNOBS = ("enabled", "defrag")

# Order of writes.  advisor_mode comes first because switching it resets
# pages_to_scan to its default; run comes last so ksmd starts (or stays
# stopped) only once every other knob is in place.
_FIRST = ("advisor_mode",)
_LAST = ("run",)


def write_order(names: list[str]) -> list[str]:
    first = [n for n in _FIRST if n in names]
    last = [n for n in _LAST if n in names]
    middle = sorted(n for n in names if n not in _FIRST and n not in _LAST)
    return first + middle + last


@dataclasses.dataclass(frozen=True)
class KsmCounters:
    """One reading of the global KSM counters plus ksmd's CPU time.

    Counters a kernel lacks (pages_skipped before 6.7, general_profit before
    6.1, pages_scanned before 6.5) are None."""

    taken_s: float  # time.monotonic() at the reading
    full_scans: int
    pages_shared: int
    pages_sharing: int
    pages_unshared: int
    pages_volatile: int
    pages_skipped: int | None
    pages_scanned: int | None
    general_profit: int | None
    ksmd_cpu_s: float | None  # None when ksmd's pid is not found
    # What else runs on ksmd's CPU time, where read (a host under test's
    # readings): the times ksmd was put on a CPU (schedstat's third
    # field), and the interrupts the host took (/proc/stat's intr): without
    # IRQ_TIME_ACCOUNTING (Debian's kernels) an interrupt that lands while
    # ksmd runs is counted as ksmd's CPU time.
    ksmd_slices: int | None = None
    interrupts: int | None = None
    # Knobs ksmd sets itself, read with the counters where asked
    # (pages_to_scan under the advisor): (name, value) pairs, so the
    # counters stay hashable as a frozen record should.
    knobs: tuple[tuple[str, int], ...] = ()

    def knob(self, name: str) -> int:
        """A knob read with these counters; KeyError when it was not asked."""
        return dict(self.knobs)[name]

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


COUNTERS = (
    "full_scans",
    "pages_shared",
    "pages_sharing",
    "pages_unshared",
    "pages_volatile",
    "pages_skipped",
    "pages_scanned",
    "general_profit",
)
