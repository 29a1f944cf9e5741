"""host.ksm.scancost with a simulated ksmd: window arithmetic, ABBA order,
warm-up discarded, the A/B statistics end to end."""

from __future__ import annotations

import pytest

from host import stats
from host.ksm.scancost import ScanWindow, abba_order, alternate_smart_scan, samples
from host.ksm.sysfs import KsmCounters


def counters(t: float, cpu: float, scans: int, scanned: int, skipped: int) -> KsmCounters:
    return KsmCounters(
        taken_s=t, full_scans=scans, pages_shared=0, pages_sharing=0, pages_unshared=0,
        pages_volatile=100, pages_skipped=skipped, pages_scanned=scanned, general_profit=0, ksmd_cpu_s=cpu,
    )


class SimulatedKsmd:
    """Each full scan costs `cost[smart_scan]` CPU seconds; with smart scan
    a scan costs twice as much for the first `warmup` scans after a switch
    (as if the skip budget had to build up)."""

    def __init__(self, cost: dict[int, float], warmup: int = 0, pages: int = 1000) -> None:
        self.cost, self.warmup, self.pages = cost, warmup, pages
        self.t = self.cpu = 0.0
        self.scans = self.scanned = self.skipped = 0
        self.smart = 1
        self.since_switch = 0
        self.knob_log: list[int] = []

    def set(self, **knobs):
        if "smart_scan" in knobs:
            self.smart = int(knobs["smart_scan"])
            self.since_switch = 0
            self.knob_log.append(self.smart)

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.0) -> KsmCounters:
        for _ in range(n):
            cost = self.cost[self.smart] * (2 if self.smart and self.since_switch < self.warmup else 1)
            self.cpu += cost
            self.t += cost / 0.9  # ksmd at 90 % of a CPU
            self.scans += 1
            skipped = int(self.pages * 0.8) if self.smart else 0
            self.skipped += skipped
            self.scanned += self.pages - skipped
            self.since_switch += 1
        return counters(self.t, self.cpu, self.scans, self.scanned, self.skipped)


def test_window_arithmetic() -> None:
    w = ScanWindow.between(counters(10.0, 1.0, 5, 1000, 0), counters(14.0, 3.0, 9, 5000, 800), smart_scan=1)
    assert (w.wall_s, w.cpu_s, w.full_scans) == (4.0, 2.0, 4)
    assert w.cpu_s_per_full_scan == 0.5
    assert w.full_scans_per_s == 1.0
    assert w.pages_scanned_per_cpu_s == 2000.0
    assert w.pages_skipped_per_scan == 200.0
    assert w.ksmd_cpu_share == 0.5
    assert w.to_json()["ksmd_cpu_s_per_full_scan"] == 0.5


def test_window_needs_ksmd_cpu() -> None:
    start = counters(0, 0, 0, 0, 0)
    end = KsmCounters(**{**start.to_json(), "ksmd_cpu_s": None})
    with pytest.raises(ValueError, match="ksmd"):
        ScanWindow.between(start, end, 0)


def test_abba() -> None:
    assert abba_order(3) == [0, 1, 1, 0, 0, 1]
    assert abba_order(5).count(0) == abba_order(5).count(1) == 5


def test_alternation_discards_warmup_and_finds_the_ratio() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    windows = alternate_smart_scan(ksmd, repeats=5, scans_per_window=4, warmup_scans=3, timeout_s=1)
    assert ksmd.knob_log == abba_order(5)
    assert [len(windows[0]), len(windows[1])] == [5, 5]
    off, on = samples(windows[0], "ksmd_cpu_s_per_full_scan"), samples(windows[1], "ksmd_cpu_s_per_full_scan")
    assert off == pytest.approx([0.8] * 5)
    assert on == pytest.approx([0.2] * 5), "warm-up scans (twice as costly) are not in the window"
    assert stats.ratio_of_medians(on, off) == pytest.approx(4.0)
    assert samples(windows[1], "pages_skipped_per_scan") == pytest.approx([800.0] * 5)


def test_without_warmup_the_cost_is_overstated() -> None:
    """The control of the test above: the warm-up matters."""
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    windows = alternate_smart_scan(ksmd, repeats=2, scans_per_window=4, warmup_scans=0, timeout_s=1)
    assert stats.median(samples(windows[1], "ksmd_cpu_s_per_full_scan")) > 0.2
