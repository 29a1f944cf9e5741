"""memqual.host.ksm.scancost with a simulated ksmd: window arithmetic, ABBA order,
warm-up discarded, replicates grouped by guest, the A/B statistics end to
end; and memqual.host.ksm.agent's finish waiting for the exit status."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from fakes import FakeBackground, FakeShell

from memqual.host.core import descriptive
from memqual.host.judge.stats import intervals
from memqual.host.ksm.agent import StressAgent, StressArgs
from memqual.host.ksm.scancost import (
    METRICS,
    ScanWindow,
    abba_order,
    alternate_smart_scan,
    covered_per_scan,
    replicate_first,
    replicate_ratios,
    replicates,
    samples,
)
from memqual.host.ksm.schedule import Outcome, OwnPages, ScanEnds, Schedule, SetKnob
from memqual.host.ksm.sysfs import KsmCounters


def counters(t: float, cpu: float, scans: int, scanned: int, skipped: int) -> KsmCounters:
    return KsmCounters(
        taken_s=t,
        full_scans=scans,
        pages_shared=0,
        pages_sharing=0,
        pages_unshared=0,
        pages_volatile=100,
        pages_skipped=skipped,
        pages_scanned=scanned,
        general_profit=0,
        ksmd_cpu_s=cpu,
    )


class SimulatedKsmd:
    """Each full scan costs `cost[smart_scan]` CPU seconds; with smart scan
    a scan costs twice as much for the first `warmup` scans after a switch
    (as if the skip budget had to build up)."""

    def __init__(
        self, cost: dict[int, float], warmup: int = 0, pages: int = 1000, extra_pages_between: tuple[int, int] = (0, 0)
    ) -> None:
        self.cost, self.warmup, self.base_pages = cost, warmup, pages
        # (first, last) scan numbers during which another guest's 500 pages exist
        self.extra_between = extra_pages_between
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

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        return [self.wait_full_scans(1, timeout_s) for _ in range(scans)]

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.0) -> KsmCounters:
        for _ in range(n):
            first, last = self.extra_between
            self.pages = self.base_pages + (500 if first <= self.scans < last else 0)
            cost = self.cost[self.smart] * (2 if self.smart and self.since_switch < self.warmup else 1)
            self.cpu += cost
            self.t += cost / 0.9  # ksmd at 90 % of a CPU
            self.scans += 1
            skipped = int(self.pages * 0.8) if self.smart else 0
            self.skipped += skipped
            self.scanned += self.pages - skipped
            self.since_switch += 1
        return self.counters()

    def counters(self) -> KsmCounters:
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
    assert w.pages_covered == 4800
    assert w.cpu_ns_per_page == pytest.approx(2e9 / 4800)
    # The seed's scan speed: every page covered, skipped ones too, per ksmd CPU-second.
    assert w.pages_per_cpu_s == 2400.0
    assert w.to_json()["pages_per_ksmd_cpu_s"] == 2400.0
    assert w.own_share is None and w.to_json()["own_share"] is None


def test_seed_speed_is_the_inverse_of_the_claim_cost() -> None:
    w = ScanWindow(
        smart_scan=1, wall_s=4.0, cpu_s=0.5, full_scans=9, pages_scanned=100, pages_skipped=800, pages_volatile=0
    )
    assert w.pages_per_cpu_s * w.cpu_ns_per_page == pytest.approx(1e9)
    assert METRICS["pages_per_ksmd_cpu_s"].better == "higher"


def test_own_share() -> None:
    """QEMU's tracked pages over the pages one scan covered: how much of
    ksmd's work was the guest under test's."""
    w = ScanWindow.between(counters(0, 0, 0, 0, 0), counters(4, 1, 4, 3000, 1000), smart_scan=1, own_pages=750)
    assert w.pages_per_scan == 1000
    assert w.own_share == pytest.approx(0.75)
    assert w.to_json()["own_share"] == pytest.approx(0.75)


def test_window_needs_ksmd_cpu() -> None:
    start = counters(0, 0, 0, 0, 0)
    end = dataclasses.replace(start, ksmd_cpu_s=None)
    with pytest.raises(ValueError, match="ksmd"):
        ScanWindow.between(start, end, 0)


def test_abba() -> None:
    assert abba_order(3) == [0, 1, 1, 0, 0, 1]
    assert abba_order(5).count(0) == abba_order(5).count(1) == 5
    assert abba_order(2, (1, 0)) == [1, 0, 0, 1]


def test_a_kernel_without_pages_scanned_counts_its_scans_pages_from_the_pages_ksm_tracks() -> None:
    """Before Linux 6.5 (6.1 as a host under test) there is no pages_scanned:
    a window covers its full scans times the pages KSM tracks (one rmap
    item each), so its cost per page is finite and comparable."""
    start = dataclasses.replace(counters(0.0, 1.0, 10, 0, 0), pages_scanned=None, pages_skipped=None)
    end = dataclasses.replace(
        counters(3.0, 2.5, 13, 0, 0),
        pages_scanned=None,
        pages_skipped=None,
        pages_shared=10,
        pages_sharing=90,
        pages_unshared=900,
        pages_volatile=65000,
    )
    w = ScanWindow.between(start, end, smart_scan=0)
    assert w.pages_scanned == 3 * 66000 and w.pages_skipped == 0
    assert w.cpu_ns_per_page == pytest.approx(1.5e9 / (3 * 66000))
    assert covered_per_scan([start, end]) == [3 * 66000]


def test_first_variant_alternates_abba_between_guests() -> None:
    assert [replicate_first(i) for i in range(8)] == [0, 1, 1, 0, 0, 1, 1, 0]


def test_alternation_starts_with_the_given_variant() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2})
    alternate_smart_scan(ksmd, repeats=2, scans_per_window=3, warmup_scans=1, timeout_s=1, settle_scans=2, first=1)
    assert ksmd.knob_log == [1, 1, 0, 0, 1]  # settle, then 1 0 0 1


def test_own_pages_read_at_each_window_end() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2})
    reads = []

    def own() -> int:
        reads.append(ksmd.scans)
        return 600

    run = alternate_smart_scan(
        ksmd, repeats=2, scans_per_window=3, warmup_scans=1, timeout_s=1, settle_scans=2, own_pages=own
    )
    windows = run.windows[0] + run.windows[1]
    assert len(reads) == 4
    assert all(w.own_share == pytest.approx(0.6) for w in windows)


def guest_runs(costs: list[tuple[float, float]], repeats: int = 2):
    """One A/B run per simulated guest, each with its own (smart_scan=0,
    smart_scan=1) cost per scan, the first variant alternating as the
    scenario does."""
    return [
        alternate_smart_scan(
            SimulatedKsmd({0: off, 1: on}),
            repeats=repeats,
            scans_per_window=4,
            warmup_scans=1,
            timeout_s=1,
            settle_scans=2,
            first=replicate_first(i),
        )
        for i, (off, on) in enumerate(costs)
    ]


def test_replicates_group_windows_by_guest() -> None:
    runs = guest_runs([(0.8, 0.2), (1.0, 0.25), (0.9, 0.3)])
    reps = replicates(runs, 1, "ksmd_cpu_s_per_full_scan")
    assert reps == [pytest.approx([0.2, 0.2]), pytest.approx([0.25, 0.25]), pytest.approx([0.3, 0.3])]
    assert [len(g) for g in replicates(runs, 0, "ksmd_cpu_ns_per_page")] == [2, 2, 2]
    assert replicate_ratios(runs, "ksmd_cpu_s_per_full_scan") == pytest.approx([4.0, 4.0, 3.0])


def test_replicates_leave_out_a_guest_without_windows() -> None:
    runs = guest_runs([(0.8, 0.2), (1.0, 0.25)])
    runs[1].windows[1].clear()
    assert len(replicates(runs, 1, "ksmd_cpu_ns_per_page")) == 1
    assert replicate_ratios(runs, "ksmd_cpu_ns_per_page") == pytest.approx([4.0])


def test_speedup_ci_spans_the_guests_not_the_windows() -> None:
    """Windows inside a guest agree to the last digit; guests differ (a
    busier host, another guest's page mix).  The speed-up's CI comes from
    the guests: taken as independent samples, the windows would give an
    interval far narrower than the spread between guests."""
    runs = guest_runs([(0.8, 0.2), (1.2, 0.2), (0.9, 0.3), (1.0, 0.2)])
    on, off = (replicates(runs, v, "ksmd_cpu_ns_per_page") for v in (1, 0))
    nested = intervals.hierarchical_ratio_ci(on, off)
    flat = intervals.hierarchical_ratio_ci([[s] for g in on for s in g], [[s] for g in off for s in g])
    per_guest = replicate_ratios(runs, "ksmd_cpu_ns_per_page")
    assert per_guest == pytest.approx([4.0, 6.0, 3.0, 5.0])
    assert nested[0] > 1.0, "the direction holds on every guest"
    assert len(on) == len(off) == 4
    assert nested[1] - nested[0] > flat[1] - flat[0]


def test_seed_speedup_is_with_over_without() -> None:
    runs = guest_runs([(0.8, 0.2), (1.0, 0.25), (0.9, 0.3)])
    with_smart = replicates(runs, 1, "pages_per_ksmd_cpu_s")
    without = replicates(runs, 0, "pages_per_ksmd_cpu_s")
    assert intervals.pooled_ratio(without, with_smart) == pytest.approx(
        intervals.pooled_ratio(replicates(runs, 1, "ksmd_cpu_ns_per_page"), replicates(runs, 0, "ksmd_cpu_ns_per_page"))
    )


def test_alternation_discards_warmup_and_finds_the_ratio() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    run = alternate_smart_scan(ksmd, repeats=5, scans_per_window=4, warmup_scans=3, timeout_s=1)
    windows = run.windows
    assert ksmd.knob_log[0] == 1, "settles with smart scan first"
    assert ksmd.knob_log[1:] == abba_order(5)
    assert run.discarded == [] and run.kept_disturbed == 0 and run.reference_pages == [1000]
    assert [len(windows[0]), len(windows[1])] == [5, 5]
    off, on = samples(windows[0], "ksmd_cpu_s_per_full_scan"), samples(windows[1], "ksmd_cpu_s_per_full_scan")
    assert off == pytest.approx([0.8] * 5)
    assert on == pytest.approx([0.2] * 5), "warm-up scans (twice as costly) are not in the window"
    assert descriptive.ratio_of_medians(on, off) == pytest.approx(4.0)
    per_page_on = samples(windows[1], "ksmd_cpu_ns_per_page")
    per_page_off = samples(windows[0], "ksmd_cpu_ns_per_page")
    assert descriptive.ratio_of_medians(per_page_on, per_page_off) == pytest.approx(4.0)
    assert samples(windows[1], "pages_skipped_per_scan") == pytest.approx([800.0] * 5)


def test_a_shorter_reference_window_holds_fewer_scans_and_the_same_cost_per_scan() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    run = alternate_smart_scan(ksmd, repeats=2, scans_per_window=9, warmup_scans=3, timeout_s=1, reference_scans=3)
    assert [w.full_scans for w in run.windows[0]] == [3, 3]
    assert [w.full_scans for w in run.windows[1]] == [9, 9], "smart scan's windows keep their length"
    assert samples(run.windows[0], "ksmd_cpu_s_per_full_scan") == pytest.approx([0.8, 0.8])
    assert samples(run.windows[1], "ksmd_cpu_s_per_full_scan") == pytest.approx([0.2, 0.2])


def test_without_warmup_the_cost_is_overstated() -> None:
    """The control of the test above: the warm-up matters."""
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    windows = alternate_smart_scan(
        ksmd, repeats=2, scans_per_window=4, warmup_scans=0, timeout_s=1, settle_scans=0
    ).windows
    assert descriptive.median(samples(windows[1], "ksmd_cpu_s_per_full_scan")) > 0.2


def test_disturbed_window_is_measured_again() -> None:
    """Another guest's pages appear for scans 30..45: the windows that see
    the page count move are thrown away, the host settles, and every kept
    window saw only the settled set."""
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, extra_pages_between=(30, 45))
    run = alternate_smart_scan(ksmd, repeats=4, scans_per_window=4, warmup_scans=2, timeout_s=1, settle_scans=5)
    assert len(run.discarded) >= 1 and run.kept_disturbed == 0
    assert [len(run.windows[0]), len(run.windows[1])] == [4, 4]
    for w in run.windows[0] + run.windows[1]:
        assert w.pages_covered == 4 * 1000, "a kept window covers only the settled pages"


def test_endless_disturbance_keeps_windows_after_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2})
    real = ksmd.wait_full_scans

    def growing(n: int, timeout_s: float, poll_s: float = 0.0) -> KsmCounters:
        ksmd.base_pages += 100  # a guest that keeps faulting memory in
        return real(n, timeout_s, poll_s)

    monkeypatch.setattr(ksmd, "wait_full_scans", growing)
    run = alternate_smart_scan(ksmd, repeats=3, scans_per_window=4, warmup_scans=1, timeout_s=1, max_retries=2)
    assert len(run.discarded) == 2
    assert run.kept_disturbed == 6
    assert [len(run.windows[0]), len(run.windows[1])] == [3, 3]


def test_agent_finish_waits_for_the_exit_status() -> None:
    """finish() returns only once the guest's SSH server reported the
    agent's exit, not at its last line: the next command never overlaps
    the agent's end."""
    # Its output ends before its exit status arrives, as dropbear sends
    # them: stdout's EOF, then the status once it has reaped the process.
    bg = FakeBackground(["t=1 event=start pid=7", "t=2 event=done status=0 elapsed_s=1"])
    ssh = FakeShell(bg)
    with StressAgent(ssh, "/tmp/a", StressArgs(mib=1, phases=["fill"])) as agent:
        assert agent.finish(5) == 0
        assert bg.waited
    assert not bg.killed and not ssh.ran  # a finished agent is not killed; finish opens no channel


class BurstyKsmd(SimulatedKsmd):
    """SimulatedKsmd whose scans numbered in `burst` cost `factor` times as
    much: other work on the host for a moment (ksmd's CPU per page rises
    with the cache and memory traffic beside it)."""

    def __init__(self, cost: dict[int, float], burst: range, factor: float = 2.0, warmup: int = 0) -> None:
        super().__init__(cost, warmup=warmup)
        self.burst, self.factor = burst, factor

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        return [self.wait_full_scans(1, timeout_s) for _ in range(scans)]

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.0) -> KsmCounters:
        for _ in range(n):
            before = self.cpu
            super().wait_full_scans(1, timeout_s, poll_s)
            if self.scans - 1 in self.burst:
                extra = (self.cpu - before) * (self.factor - 1)
                self.cpu += extra
                self.t += extra / 0.9
        return self.counters()


def one_turn(ksmd: SimulatedKsmd, **options: Any) -> Any:
    """One turn each way at the ab profile's window sizes (9 scans, 3 of
    warm-up, a 3-scan reference)."""
    return alternate_smart_scan(
        ksmd, repeats=1, scans_per_window=9, warmup_scans=3, timeout_s=1, reference_scans=3, **options
    )


def test_smart_windows_are_back_to_back_after_one_warmup() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    seen: list[ScanWindow] = []
    run = one_turn(ksmd, smart_windows=3, on_window=seen.append)
    assert ksmd.knob_log == [1, 0, 1], "settle, then one turn each: the extra windows add no switch"
    assert [w.full_scans for w in run.windows[0]] == [3]
    assert [w.full_scans for w in run.windows[1]] == [9, 9, 9]
    assert samples(run.windows[1], "ksmd_cpu_s_per_full_scan") == pytest.approx([0.2] * 3), "no warm-up scan inside"
    # Back to back: each window ends where the next starts, one turn of 1 + 3 + 27 scans.
    assert ksmd.scans == (12 + 1) + (1 + 3 + 3) + (1 + 3 + 27)
    assert seen == run.windows[0] + run.windows[1]


def test_the_median_of_back_to_back_windows_leaves_out_a_burst() -> None:
    """A burst of host work over a few scans of smart scan's turn moves a
    one-window measurement; the guest's median over 5 windows is the steady
    cost.  Settle 13 scans, smart_scan=0's turn 7, smart scan's 1 + 3: its
    first window starts at scan 24."""
    single = BurstyKsmd({0: 0.8, 1: 0.2}, burst=range(24, 27))
    one = one_turn(single)
    assert descriptive.median(samples(one.windows[1], "ksmd_cpu_ns_per_page")) > 1.2 * 0.2e9 / 1000
    five = one_turn(BurstyKsmd({0: 0.8, 1: 0.2}, burst=range(24, 27)), smart_windows=5)
    per_page = samples(five.windows[1], "ksmd_cpu_ns_per_page")
    assert max(per_page) > 1.2 * 0.2e9 / 1000, "the burst is in the record"
    assert descriptive.median(per_page) == pytest.approx(0.2e9 / 1000)


def test_the_median_of_windows_keeps_a_cost_that_lasts() -> None:
    """The control: a dearer ksmd in every scan (another kernel's real
    cost) moves the median of 5 windows as much as one window."""
    steady = one_turn(BurstyKsmd({0: 0.8, 1: 0.2}, burst=range(0, 10_000), factor=1.1), smart_windows=5)
    assert descriptive.median(samples(steady.windows[1], "ksmd_cpu_ns_per_page")) == pytest.approx(1.1 * 0.2e9 / 1000)


def test_a_disturbed_turn_of_smart_windows_costs_one_retry() -> None:
    """Another guest's pages come and go during smart scan's turn: the whole
    turn is measured again, kept in `discarded` as one window over its
    scans, and the kept turn holds every window."""
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, extra_pages_between=(30, 35))
    run = one_turn(ksmd, smart_windows=3)
    assert len(run.discarded) == 1 and run.discarded[0].full_scans == 27
    assert [w.full_scans for w in run.windows[1]] == [9, 9, 9]
    for w in run.windows[1]:
        assert w.pages_covered == 9 * 1000


def test_disturbed_smart_windows_kept_after_the_budget_are_each_counted() -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, extra_pages_between=(25, 10_000))
    run = one_turn(ksmd, smart_windows=3, max_retries=0, first=1)
    assert run.discarded == [] and run.kept_disturbed == 3 + 1, "smart scan's 3 windows, then the reference's"
    assert len(run.windows[1]) == 3


def test_smart_windows_must_be_positive() -> None:
    with pytest.raises(ValueError, match="smart_windows"):
        alternate_smart_scan(SimulatedKsmd({0: 0.8, 1: 0.2}), 1, 9, 3, 1, smart_windows=0)


@pytest.mark.parametrize(
    ("has_smart_scan", "settle_scans", "settled_with"),
    [
        # Smart scan's pages age: the whole settle, in smart scans.
        (True, 12, 12),
        # Plain scans do not age: two settle them, whatever was asked.
        (False, 12, 2),
        (False, 1, 1),
    ],
)
def test_a_kernel_without_smart_scan_settles_in_two_plain_scans(
    has_smart_scan: bool, settle_scans: int, settled_with: int
) -> None:
    ksmd = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    ksmd.smart = int(has_smart_scan)  # a kernel without the knob scans every page
    run = alternate_smart_scan(
        ksmd,
        repeats=1,
        scans_per_window=9,
        warmup_scans=3,
        timeout_s=1,
        settle_scans=settle_scans,
        reference_scans=3,
        has_smart_scan=has_smart_scan,
    )
    assert ksmd.knob_log[:1] == ([1] if has_smart_scan else []), "no smart_scan knob on a kernel without it"
    window_scans = (1 + 3 + 3) if not has_smart_scan else (1 + 3 + 3) + (1 + 3 + 9)
    assert ksmd.scans == (settled_with + 1) + window_scans
    assert samples(run.windows[0], "ksmd_cpu_s_per_full_scan") == pytest.approx([0.8])


def test_a_window_counts_ksmds_times_on_a_cpu_and_the_hosts_interrupts_where_read() -> None:
    start, end = counters(10.0, 1.0, 5, 1000, 0), counters(14.0, 3.0, 9, 5000, 800)
    assert ScanWindow.between(start, end, smart_scan=1).interrupts is None, "this machine's readings lack them"
    start = dataclasses.replace(start, ksmd_slices=100, interrupts=7000)
    end = dataclasses.replace(end, ksmd_slices=160, interrupts=9500)
    window = ScanWindow.between(start, end, smart_scan=1)
    assert (window.ksmd_slices, window.interrupts) == (60, 2500)
    assert window.to_json()["interrupts"] == 2500


class ScheduledKsmd(SimulatedKsmd):
    """The simulated ksmd run as one schedule (a host under test's way),
    each step as the L1 command does it: knobs at once, readings at scan
    ends, the guest's pages."""

    def __init__(self, *args: Any, own: int = 600, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own = own
        self.schedules: list[Schedule] = []
        self.knob_writes: list[tuple[str, int]] = []

    def set(self, **knobs):
        raise AssertionError(f"a knob written outside the schedule: {knobs}")

    def cancel_mark(self) -> None:
        raise AssertionError("no mark awaited")

    def run_schedule(self, schedule: Schedule, timeout_s: float) -> Outcome:
        self.schedules.append(schedule)
        scan_ends, own = [], []
        for step in schedule.steps:
            if isinstance(step, SetKnob):
                self.knob_writes.append((step.name, step.value))
                super().set(**{step.name: step.value})
            elif isinstance(step, ScanEnds):
                scan_ends.append(tuple(self.scan_end_readings(step.count, timeout_s)))
            else:
                own.append(self.own)
        return Outcome(tuple(scan_ends), tuple(own))


@pytest.mark.parametrize(
    ("options", "turns"),
    [
        ({"repeats": 2, "first": 0}, [0, 1, 1, 0]),
        ({"repeats": 2, "first": 1}, [1, 0, 0, 1]),
        ({"repeats": 1, "reference_scans": 3, "smart_windows": 3}, [0, 1]),
        ({"repeats": 3, "has_smart_scan": False}, [0, 0, 0]),
    ],
)
def test_a_whole_schedule_measures_the_same_windows_as_step_by_step(options: dict[str, Any], turns: list[int]) -> None:
    sizes = {"scans_per_window": 9, "warmup_scans": 3, "timeout_s": 1, "settle_scans": 12} | options
    stepwise = SimulatedKsmd({0: 0.8, 1: 0.2}, warmup=3)
    scheduled = ScheduledKsmd({0: 0.8, 1: 0.2}, warmup=3)
    by_steps = alternate_smart_scan(stepwise, own_pages=lambda: 600, **sizes)
    at_once = alternate_smart_scan(scheduled, start={"run": 1}, **sizes)
    assert len(scheduled.schedules) == 1, "one command for the whole measurement"
    assert at_once.windows == by_steps.windows and at_once.reference_pages == by_steps.reference_pages
    assert scheduled.scans == stepwise.scans
    # ksmd started first, then each turn's switch right before its scans
    smart = [v for n, v in scheduled.knob_writes if n == "smart_scan"]
    assert scheduled.knob_writes[0] == ("run", 1)
    assert smart == ([1, *turns] if options.get("has_smart_scan", True) else [])
    steps = scheduled.schedules[0].steps
    for before, step in itertools.pairwise(steps):
        if isinstance(step, SetKnob) and step.name == "smart_scan" and before != SetKnob("run", 1):
            assert isinstance(before, OwnPages | ScanEnds), "a switch follows a reading at a scan end"


def test_a_whole_schedule_keeps_and_counts_a_disturbed_window() -> None:
    # another guest's pages come for scans 20-24: no re-measure in a
    # schedule fixed in advance, the window is kept and counted
    ksmd = ScheduledKsmd({0: 0.8, 1: 0.2}, extra_pages_between=(20, 24))
    run = alternate_smart_scan(ksmd, repeats=2, scans_per_window=4, warmup_scans=1, timeout_s=1, settle_scans=5)
    assert run.discarded == [] and run.kept_disturbed == 1
    assert len(run.windows[0]) + len(run.windows[1]) == 4


def test_a_schedule_reads_something_and_names_knobs_only() -> None:
    with pytest.raises(ValueError, match="reads something"):
        Schedule((SetKnob("run", 1),))
    with pytest.raises(ValueError, match="not a sysfs attribute"):
        SetKnob("../run", 1)
    with pytest.raises(ValueError, match="1 or more"):
        ScanEnds(0)
    with pytest.raises(ValueError, match="readings"):
        Outcome((), ()).check(Schedule((ScanEnds(2),)))
