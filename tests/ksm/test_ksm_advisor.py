"""host/ksm/advisor.py on a fake sysfs tree: the advisor switched on from a
known start through host KSM's saved knobs (put back after), its series
read at each full scan's end until a scan takes the target, and what the
series says; ksmd is a model of mm/ksm.c's scan_time_advisor, its clock
the fake one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import FakeClock

from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.knobs import Sysfs
from memqual.host.ksm import advisor as adv
from memqual.host.ksm.controller import KsmController
from memqual.host.ksm.scenarios import ScenarioFailed
from memqual.host.ksm.schedule import Now, Outcome, ScanEnds, Schedule, SetKnob
from memqual.host.ksm.sysfs import KsmCounters
from memqual.host.ksm.table import ADVISOR, AdvisorSizes

KNOBS = {
    "run": "0",
    "pages_to_scan": "100",
    "sleep_millisecs": "20",
    "smart_scan": "1",
    "advisor_mode": "[none] scan-time",
    "advisor_target_scan_time": "200",
    "advisor_min_pages_to_scan": "500",
    "advisor_max_pages_to_scan": "30000",
    "advisor_max_cpu": "70",
}
SIZES = AdvisorSizes(guest_mib=256, fill_mib=48, target_s=1, start_pages=100, sleep_ms=20, after_scans=2, timeout_s=60)


def make_tree(root: Path, knobs: dict[str, str] = KNOBS) -> Path:
    ksm = root / "ksm"
    ksm.mkdir(parents=True)
    (root / "thp").mkdir()
    for name, value in {**knobs, "full_scans": "7"}.items():
        (ksm / name).write_text(value + "\n")
        (ksm / name).chmod(0o644 if name in knobs else 0o444)
    return ksm


def controller(root: Path) -> KsmController:
    return KsmController(
        root / "ksm", root / "thp", root / "state", lock_timeout_s=2.0, euid=lambda: 0, install_signal_handlers=False
    )


def advise(pages: int, scan_s: float, cpu_s: float, before: tuple[int, int], target: int) -> tuple[int, int, int]:
    """mm/ksm.c's scan_time_advisor (6.8+) in integers: the next
    pages_to_scan, its smoothed change and the scan's whole seconds, from
    (last scan's seconds, last change), both 0 right after the switch-on."""
    scan_time = adv.kernel_seconds(scan_s)
    cpu_percent = max(1, int(cpu_s * 1000) * 100 // (scan_time * 1000))
    last_scan, last_change = before
    factor = max(1, target * 100 // scan_time)
    change = max(1, scan_time * 100 // (last_scan or scan_time))
    change = (70 * last_change + 30 * change) // 100
    new = pages * 100 // factor * change // 100
    per_page_cost = max(1, pages // cpu_percent)
    new = max(min(new, per_page_cost * 70), per_page_cost * 10)
    return min(new, 30000), change, scan_time


def ksmd(ksm: Path, clock: FakeClock, pages: int, lifetime_cpu_s: float = 0.0) -> Callable[[float], None]:
    """A sleep that moves the fake clock and, while run=1, scans ``pages``
    at pages_to_scan a batch and a batch a sleep_millisecs (2 us of CPU a
    page), adapting pages_to_scan at each full scan's end.  Its first
    step counts ``lifetime_cpu_s`` as the advisor's zeroed context does."""
    fs = Sysfs(ksm)
    state = {"left": float(pages), "scan_s": 0.0, "cpu_s": lifetime_cpu_s}
    last = [(0, 0)]  # the last scan's whole seconds and change

    def sleep(dt: float) -> None:
        clock.sleep(dt)
        if fs.read("run") != "1":
            return
        batch, pause = fs.read_int("pages_to_scan"), fs.read_int("sleep_millisecs") / 1000
        state["scan_s"] += dt
        state["left"] -= batch * dt / pause
        state["cpu_s"] += batch * dt / pause * 2e-6
        if state["left"] > 0:
            return
        new, change, seconds = advise(
            batch, state["scan_s"], state["cpu_s"], last[0], fs.read_int("advisor_target_scan_time")
        )
        state.update(left=float(pages), scan_s=0.0, cpu_s=0.0)
        last[0] = (seconds, change)
        (ksm / "pages_to_scan").write_text(f"{new}\n")
        (ksm / "full_scans").write_text(f"{fs.read_int('full_scans') + 1}\n")

    return sleep


def test_the_advisor_adapts_from_a_slow_start_and_its_knobs_come_back(tmp_path: Path) -> None:
    ksm, clock = make_tree(tmp_path), FakeClock()
    before = Sysfs(ksm).knobs()
    with controller(tmp_path) as host:
        # the advisor's start as the kernel sets it when the mode goes on
        (ksm / "pages_to_scan").write_text(f"{SIZES.start_pages}\n")
        run = adv.run_advisor(host, SIZES, 12288, clock=clock, sleep=ksmd(ksm, clock, 16384, 240.0))
        during = Sysfs(ksm).knobs()
    assert during["advisor_mode"] == "scan-time" and during["advisor_min_pages_to_scan"] == "100"
    assert during["smart_scan"] == "0" and during["advisor_target_scan_time"] == "1"
    assert Sysfs(ksm).knobs() == {**before, "pages_to_scan": "100"}  # put back
    assert run.slow_start and run.start_pages == 100
    # the first step reads ksmd's CPU since boot: pages_to_scan drops under advisor_max_cpu
    assert run.readings[0].pages_to_scan <= 70
    assert run.rise > 1 and run.reached is not None
    assert run.reached.reading.full_scans <= 3 and 5 < run.reached.reading.at_s < 15
    assert run.readings[-1].full_scans - run.reached.reading.full_scans >= SIZES.after_scans


def R(at_s: float, full_scans: int, pages: int) -> adv.Reading:
    return adv.Reading(at_s, full_scans, pages)


@pytest.mark.parametrize(
    ("readings", "slow_start", "reached_at", "rise"),
    [
        # the lab's shape: slow first scans, a drop, then a rise to the target
        ((R(3.3, 1, 70), R(8.0, 2, 700), R(8.5, 3, 3000), R(8.7, 4, 3000)), True, 8.5, 30.0),
        ((R(0.5, 1, 600),), False, 0.5, 6.0),  # on target from the first scan: 0.5 s counts as 1
        ((R(2.5, 1, 60), R(5.0, 2, 60)), True, None, 0.6),  # never there, and below its start
        ((R(4.0, 1, 200), R(5.8, 3, 400)), True, 5.8, 4.0),  # two scans between readings: 0.9 s each
        ((R(1.99, 1, 100),), False, 1.99, 1.0),  # 1.99 s is 1 whole second: on a 1 s target
    ],
)
def test_what_a_series_says(readings, slow_start, reached_at, rise) -> None:
    run = adv.AdvisorRun(1, 100, 20, readings, 12288)
    assert run.slow_start is slow_start
    assert (run.reached.reading.at_s if run.reached else None) == reached_at
    assert run.rise == pytest.approx(rise)


def test_a_run_records_its_time_to_the_target_and_its_rise_under_its_row() -> None:
    run = adv.AdvisorRun(1, 100, 20, (R(3.3, 1, 70), R(8.0, 2, 700), R(8.5, 3, 3000)), 12288)
    seconds, rise = run.records()
    assert (seconds.scenario, seconds.metric, seconds.samples) == (ADVISOR.name, "seconds_to_target", [8.5])
    assert (rise.metric, rise.samples, rise.better) == ("pages_to_scan_rise", [30.0], "higher")
    assert seconds.settings == {"target_s": 1, "start_pages": 100, "sleep_ms": 20, "timed_by": run.timed_by}
    assert seconds.extra["pages_to_scan_at_target"] == 3000 and seconds.extra["first_step_pages"] == 70
    assert [s["kernel_s"] for s in seconds.extra["scans"]] == [3, 4, 1]
    with pytest.raises(ValueError, match="never reached"):
        adv.AdvisorRun(1, 100, 20, (R(2.5, 1, 60),), 1).records()


def test_a_watch_that_never_reaches_the_target_fails_at_its_deadline(tmp_path: Path) -> None:
    ksm, clock = make_tree(tmp_path), FakeClock()
    sizes = dataclasses.replace(SIZES, timeout_s=10.0)
    with controller(tmp_path) as host, pytest.raises(ScenarioFailed, match="did not bring a full scan to 1 s"):
        # far too many pages for 10 s at 100 pages a batch
        adv.run_advisor(host, sizes, 1, clock=clock, sleep=ksmd(ksm, clock, 10**9))
    assert clock() == pytest.approx(sizes.timeout_s, abs=0.1)


def test_a_kernel_without_the_advisor_is_a_skip_with_its_reason_and_changes_nothing(tmp_path: Path) -> None:
    ksm = make_tree(tmp_path, {k: v for k, v in KNOBS.items() if not k.startswith("advisor_")})
    before = Sysfs(ksm).knobs()
    with controller(tmp_path) as host, pytest.raises(CapabilityMissing, match="advisor_mode.*Linux 6.8"):
        adv.run_advisor(host, SIZES, 1, clock=FakeClock(), sleep=lambda _: None)
    assert Sysfs(ksm).knobs() == before


@pytest.mark.parametrize(("seconds", "counted"), [(0.0, 1), (0.4, 1), (1.0, 1), (1.99, 1), (2.0, 2), (13.7, 13)])
def test_a_scan_is_counted_in_whole_seconds_at_least_one(seconds: float, counted: int) -> None:
    assert adv.kernel_seconds(seconds) == counted


class _WholeHost:
    """The controller's knobs on the fake tree, and a watch run as one
    command that returns ``series`` ((L1 uptime, full_scans, pages_to_scan)
    at each scan end) from ``started``, as L1's schedule would."""

    def __init__(self, host: KsmController, started: float, series: list[tuple[float, int, int]]) -> None:
        self.host, self.started, self.series = host, started, series
        self.asked: list[tuple[Schedule, tuple[str, ...]]] = []

    @property
    def fs(self) -> Sysfs:
        return self.host.fs

    def set(self, **knobs: int | str) -> None:
        self.host.set(**knobs)

    def unmerge(self) -> None:
        self.host.unmerge()

    def run_schedule(self, schedule: Schedule, timeout_s: float, knobs: tuple[str, ...] = ()) -> Outcome:
        self.asked.append((schedule, knobs))
        ends = tuple(
            KsmCounters(at, scans, 0, 0, 0, 0, None, None, None, None, knobs=(("pages_to_scan", pages),))
            for at, scans, pages in self.series[: schedule.scans]
        )
        return Outcome((ends,), (), now_s=(self.started,))


def test_on_a_host_under_test_the_watch_is_one_command_timed_from_run_on_its_clock(tmp_path: Path) -> None:
    ksm = make_tree(tmp_path)
    # full_scans is 7 before the switch: the series counts from there
    series = [(103.3, 8, 70), (108.0, 9, 700), (108.5, 10, 3000), (108.7, 11, 3000), (109.0, 12, 2900)]
    with controller(tmp_path) as host:
        whole = _WholeHost(host, 100.0, series)
        run = adv.run_advisor_whole(whole, SIZES, 12288, scans=5)
        during = Sysfs(ksm).knobs()
    ((schedule, knobs),) = whole.asked
    assert schedule.steps == (Now(), SetKnob("run", 1), ScanEnds(5)) and knobs == ("pages_to_scan",)
    assert during["advisor_mode"] == "scan-time" and during["smart_scan"] == "0"
    assert [(r.at_s, r.full_scans, r.pages_to_scan) for r in run.readings][:3] == [
        (3.3, 1, 70),
        (8.0, 2, 700),
        (8.5, 3, 3000),
    ]
    assert run.reached is not None and run.reached.reading.at_s == 8.5 and run.slow_start
    # its records say which clock timed it: L1's
    assert run.records()[0].settings["timed_by"] == adv.L1_TIMED_BY


def test_on_a_host_under_test_a_watch_short_of_its_target_fails_with_its_series(tmp_path: Path) -> None:
    make_tree(tmp_path)
    never = [(102.5, 8, 60), (105.0, 9, 60), (107.5, 10, 60)]
    barely = [(103.3, 8, 70), (108.5, 9, 3000)]  # there at the last scan: no after_scans watched
    for series in (never, barely):
        with controller(tmp_path) as host, pytest.raises(ScenarioFailed, match="within 3 scans"):
            adv.run_advisor_whole(_WholeHost(host, 100.0, series), SIZES, 1, scans=3)
