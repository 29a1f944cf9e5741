"""The cost of ksmd's scanning, measured in whole full scans.

A window starts and ends on a full_scans increment, so it holds whole scans
of everything mergeable; its figures are differences of two KsmCounters.
The A/B of smart_scan alternates the variants in ABBA order (a linear drift
of the shared machine then hits both alike), discards warm-up scans after
each switch (smart scan skips a page only once it has failed to merge a few
times: its skip budget needs scans to build up) and repeats.

The claim metric is ksmd CPU seconds per full scan: the seed measured scan
speed with ksmd saturated, and per CPU-second it does not depend on how much
CPU the busy 2-core machine left ksmd.  Speed-up = cost(smart_scan=0) /
cost(smart_scan=1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from host.ksm.sysfs import KsmCounters


class _Driver(Protocol):
    def set(self, **knobs: int | str) -> None: ...
    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = ...) -> KsmCounters: ...


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

    @classmethod
    def between(cls, start: KsmCounters, end: KsmCounters, smart_scan: int) -> "ScanWindow":
        if start.ksmd_cpu_s is None or end.ksmd_cpu_s is None:
            raise ValueError("ksmd's CPU time is unknown (ksmd thread not found)")
        return cls(
            smart_scan=smart_scan,
            wall_s=end.taken_s - start.taken_s,
            cpu_s=end.ksmd_cpu_s - start.ksmd_cpu_s,
            full_scans=end.full_scans - start.full_scans,
            pages_scanned=(end.pages_scanned or 0) - (start.pages_scanned or 0),
            pages_skipped=(end.pages_skipped or 0) - (start.pages_skipped or 0),
            pages_volatile=end.pages_volatile,
        )

    @property
    def cpu_s_per_full_scan(self) -> float:
        return self.cpu_s / self.full_scans

    @property
    def full_scans_per_s(self) -> float:
        return self.full_scans / self.wall_s

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

    def to_json(self) -> dict[str, float | int]:
        data: dict[str, float | int] = dataclasses.asdict(self)
        for name in METRICS:
            data[name] = getattr(self, METRICS[name].attribute)
        return data


@dataclasses.dataclass(frozen=True)
class Metric:
    attribute: str
    unit: str
    better: str


# Record metric name -> how it is computed.  The first is the claim's.
METRICS: dict[str, Metric] = {
    "ksmd_cpu_s_per_full_scan": Metric("cpu_s_per_full_scan", "s", "lower"),
    "full_scans_per_s": Metric("full_scans_per_s", "1/s", "higher"),
    "pages_scanned_per_ksmd_cpu_s": Metric("pages_scanned_per_cpu_s", "pages/s", "higher"),
    "pages_skipped_per_scan": Metric("pages_skipped_per_scan", "pages", "higher"),
    "ksmd_cpu_share": Metric("ksmd_cpu_share", "", "higher"),
}


def measure_window(ksm: _Driver, smart_scan: int, scans: int, timeout_s: float) -> ScanWindow:
    """Align on the next full-scan end, then measure `scans` whole scans."""
    start = ksm.wait_full_scans(1, timeout_s)
    end = ksm.wait_full_scans(scans, timeout_s)
    return ScanWindow.between(start, end, smart_scan)


def abba_order(repeats: int, variants: Sequence[int] = (0, 1)) -> list[int]:
    """0 1 1 0 0 1 1 0 ...: each variant `repeats` times, balanced against
    a linear drift."""
    a, b = variants
    order: list[int] = []
    for i in range(repeats):
        order += [a, b] if i % 2 == 0 else [b, a]
    return order


def alternate_smart_scan(
    ksm: _Driver,
    repeats: int,
    scans_per_window: int,
    warmup_scans: int,
    timeout_s: float,
    on_window: Callable[[ScanWindow], None] | None = None,
) -> dict[int, list[ScanWindow]]:
    """smart_scan 0 against 1, ABBA, `repeats` windows each."""
    windows: dict[int, list[ScanWindow]] = {0: [], 1: []}
    for variant in abba_order(repeats):
        ksm.set(smart_scan=variant)
        if warmup_scans:
            ksm.wait_full_scans(warmup_scans, timeout_s)
        window = measure_window(ksm, variant, scans_per_window, timeout_s)
        windows[variant].append(window)
        if on_window is not None:
            on_window(window)
    return windows


def samples(windows: Sequence[ScanWindow], metric: str) -> list[float]:
    attribute = METRICS[metric].attribute
    return [float(getattr(w, attribute)) for w in windows]
