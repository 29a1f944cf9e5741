"""Free page reporting's RSS watched in a host under test, on L1's clock
(host/balloon/rss_watch.py, reporting.touch_and_free_on_l1): the
watcher's output parsed, the start-event rule, a deadline that expires,
the scenario over fakes, and the script itself run under this machine's
busybox against a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from busybox_shell import BUSYBOX, BusyboxShell
from fakes import AgentShell, BalloonQmp, FakeBackground, FakeBalloonGuest, FakeClock

from memqual.host.balloon import reporting, rss_watch
from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.ssh import CommandResult

START, TARGET = 700_000, 300_000  # the thresholds the tests hand the watcher (KiB)
AGENT = "/tmp/balloon_agent"


def watched(*lines: str) -> rss_watch.Watch:
    return rss_watch.parse("\n".join(lines) + "\n", START, TARGET)


@pytest.mark.parametrize(
    ("lines", "met", "start_s", "return_s", "last_kib", "polls"),
    [
        # reported: the first fall, then the RSS down past the target
        (
            ("ready 1000 720000 0", "1250 650000 1249 0 0", "1300 500000 1299 0 0", "1340 290000 1339 0 0")
            + ("end met 1340 290000 700 0",),
            True,
            12.50,
            0.90,
            290_000,
            700,
        ),
        # a fall in one poll, past the start and the target at once
        (("ready 1000 720000 0", "1210 250000 1209 0 0", "end met 1210 250000 600 0"), True, 12.10, 0.0, 250_000, 600),
        # the deadline: it fell, but not far enough; the end is a poll no line kept
        (
            ("ready 1000 720000 0", "1250 690000 1249 0 0", "end deadline 4000 689500 1500 0"),
            False,
            12.50,
            None,
            689_500,
            1500,
        ),
        # without reporting: it never moved
        (("ready 1000 720000 0", "end deadline 2000 720100 500 0"), False, None, None, 720_100, 500),
    ],
)
def test_the_watchers_output_parses_into_its_start_and_its_end(
    lines: tuple[str, ...], met: bool, start_s: float | None, return_s: float | None, last_kib: int, polls: int
) -> None:
    watch = watched(*lines)
    assert (watch.met, watch.last.kib, watch.polls) == (met, last_kib, polls)
    assert (watch.start.uptime_s if watch.start else None) == start_s
    assert watch.return_s == pytest.approx(return_s) if return_s is not None else watch.return_s is None
    assert watch.first.uptime_s == 10.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "end met 1 2 3\n",  # no first reading
        "ready 1000 720000 0\n",  # cut short: no end
        "ready 1000 720000 0\nend maybe 1200 100 3 0\n",
        "ready 1000 720000 0\n1100 5000 1099\nend met 1100 5000 3 0\n",  # a reading without its run times
        "ready 1000 720000\nend met 1100 5000 3 0\n",  # a first reading without its run time
        "ready 10.00 720000 0\nend met 1100 5000 3 0\n",  # not centiseconds
        "ready 1000 720000 0\n1100 650000 1099 5 4\ngone 1102\n",  # the QEMU went
        "sh: can't open /proc/1/status\n",
    ],
)
def test_anything_else_is_no_watch(text: str) -> None:
    with pytest.raises(GuestError):
        rss_watch.parse(text, START, TARGET)


@pytest.mark.parametrize(
    ("lines", "start_s", "problem"),
    [
        # the first reading at or below the start threshold is the start
        (("ready 1000 720000 0", "1100 710000 1099 0 0", "1200 700000 1199 0 0", "1300 300000 1299 0 0"), 12.00, ""),
        (("ready 1000 720000 0", "1100 699999 1099 0 0", "1200 300000 1199 0 0"), 11.00, ""),
        # a rise first (QEMU's own allocations) is no start
        (("ready 1000 720000 0", "1100 730000 1099 0 0", "1200 600000 1199 0 0", "1300 300000 1299 0 0"), 12.00, ""),
        # already down at the first reading: a start the watcher did not see
        (("ready 1000 690000 0", "1200 300000 1199 0 0"), None, "already down"),
        (("ready 1000 250000 0",), None, "already down"),
        # never down to the start
        (("ready 1000 720000 0", "1100 701000 1099 0 0"), None, "never fell"),
    ],
)
def test_the_start_is_the_first_fall_below_the_held_peak_that_the_watcher_saw(
    lines: tuple[str, ...], start_s: float | None, problem: str
) -> None:
    last = lines[-1].split()
    end = f"end met {last[1] if last[0] != 'ready' else last[1]} {last[2]} 9 0"
    watch = watched(*lines, end)
    assert (watch.start.uptime_s if watch.start else None) == start_s
    assert any(problem in p for p in watch.problems()) if problem else watch.problems() == []


def test_the_resolution_is_the_widest_gap_at_either_end_and_never_finer_than_uptime() -> None:
    watch = watched("ready 1000 720000 0", "1250 650000 1245 0 0", "1340 290000 1338 0 0", "end met 1340 290000 700 0")
    assert watch.resolution_s == pytest.approx(0.05)
    watch = watched("ready 1000 720000 0", "1250 650000 1250 0 0", "1340 290000 1340 0 0", "end met 1340 290000 700 0")
    assert watch.resolution_s == rss_watch.UPTIME_RESOLUTION_S


@pytest.mark.parametrize(
    ("lines", "passes"),
    [
        # as on L1 (2026-12-07): two passes 2 s apart, the first in two readings
        (
            ("ready 0 754252 0", "204 535116 203 0 0", "205 498252 204 0 0", "406 285260 405 0 0"),
            [(2.04, 256000), (4.06, 212992)],
        ),
        (("ready 0 754252 0", "204 200000 203 0 0"), [(2.04, 554252)]),
        (("ready 0 754252 0",), []),
    ],
)
def test_the_falls_group_into_the_guests_reporting_passes(lines: tuple[str, ...], passes: list[object]) -> None:
    last = lines[-1].split()
    watch = watched(*lines, f"end met {last[1]} {last[2]} 9 0")
    assert watch.passes() == passes


def test_each_pass_s_work_is_the_run_time_from_the_poll_before_its_first_fall_to_its_last() -> None:
    """Two passes 2 s apart: QEMU's run time between them (the guest idle,
    memqual's commands reaching it) is in neither pass, and the work per
    MiB is the passes' run time over what they gave back."""
    watch = watched(
        "ready 0 754252 1000000",
        "204 535116 203 9000000 8000000",  # the first pass starts after 8 ms of run time
        "205 498252 204 15000000 9000000",
        "406 285260 405 40000000 30000000",  # 15 ms ran between the passes: not a pass's
        "end met 406 285260 9 40000000",
    )
    work = watch.pass_work
    assert [(p.at_s, p.fallen_kib, p.cpu_ns) for p in work] == [(2.04, 256000, 7_000_000), (4.06, 212992, 10_000_000)]
    assert watch.cpu_ns_per_mib == pytest.approx(17_000_000 * 1024 / (256000 + 212992))
    assert watched("ready 0 754252 5", "end deadline 2000 754252 9 99").cpu_ns_per_mib is None


def test_a_pass_whose_run_time_went_back_is_a_problem_and_no_figure() -> None:
    """The run time sums the threads alive at each poll: a thread that ended
    inside a pass takes its time with it, and the pass comes out negative."""
    watch = watched(
        "ready 0 754252 1000000",
        "204 535116 203 9000000 8000000",
        "205 498252 204 5000000 9000000",  # a thread gone: less run time than the pass began with
        "end met 205 498252 9 5000000",
    )
    assert [p.cpu_ns for p in watch.pass_work] == [-3_000_000]
    assert watch.cpu_ns_per_mib is None
    assert any("came out negative" in problem for problem in watch.problems())


def test_a_deadline_that_expires_is_not_met_and_says_so() -> None:
    watch = watched("ready 1000 720000 0", "1250 690000 1249 0 0", "end deadline 4000 689500 1500 0")
    assert not watch.met and watch.return_s is None
    assert watch.watched_s == pytest.approx(30.0)
    assert watch.problems() == ["the RSS was not down to 300000 KiB by L1's deadline"]


@pytest.mark.parametrize(
    ("base", "peak", "share", "threshold"),
    [
        (200_000, 200_000 + 512 * 1024, reporting.ON_RETURNED, 200_000 + 512 * 1024 - 419_431),
        (0, 5, 0.8, 1),  # 0.8 x 5 is 4.000000000000001 in floating point: still 4
        (100, 200, reporting.START_RETURNED, 199),
        (100, 100, 0.8, 100),  # no rise: the peak itself
    ],
)
def test_a_threshold_holds_exactly_the_readings_whose_share_is_reached(
    base: int, peak: int, share: float, threshold: int
) -> None:
    assert reporting.at_or_below(base, peak, share) == threshold
    for kib in range(threshold - 3, threshold + 4):
        reached = reporting.returned_share(base, peak, kib) >= share or (peak == base and kib <= peak)
        assert (kib <= threshold) == reached, kib


class _Watcher(FakeBackground):
    """The watcher in L1: its first line, then (once the free is sent) the rest."""

    def __init__(self, lines: list[str], events: list[str], timeout: bool = False) -> None:
        super().__init__(lines)
        self.events, self.timeout = events, timeout

    def wait(self, timeout: float = 0) -> CommandResult:
        self.events.append("watcher waited")
        if self.timeout:
            raise Timeout("still running")
        return super().wait(timeout)

    def kill(self) -> None:
        self.events.append("watcher killed")
        super().kill()


class _L1:
    def __init__(self, watcher: _Watcher) -> None:
        self.watcher = watcher
        self.started: list[list[str]] = []

    def start(self, argv: list[str]) -> _Watcher:
        self.started.append(argv)
        return self.watcher

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None) -> None:
        raise AssertionError("the watcher is one command")


def test_the_watcher_polls_before_the_free_and_is_ended_after() -> None:
    events: list[str] = []
    watcher = _Watcher(
        ["ready 1000 720000 0", "1250 650000 1249 0 0", "1340 290000 1339 0 0", "end met 1340 290000 7 0"], events
    )
    l1 = _L1(watcher)
    watch = rss_watch.watch(l1, 4242, START, TARGET, 30.0, lambda: events.append("freed"))
    assert events == ["freed", "watcher waited", "watcher killed"]
    assert watch.return_s == pytest.approx(0.9)
    # its inputs are argv after the constant script, never in it
    argv = l1.started[0]
    assert argv[argv.index(rss_watch.WATCH) + 1 :] == ["rss-watch", "4242", "700000", "300000", "3000", "1024", "2000"]


def test_a_watcher_that_outlives_this_machines_deadline_is_an_error_and_is_ended() -> None:
    events: list[str] = []
    watcher = _Watcher(["ready 1000 720000 0"], events, timeout=True)
    with pytest.raises(GuestError, match="did not end within"):
        rss_watch.watch(_L1(watcher), 4242, START, TARGET, 30.0, lambda: events.append("freed"))
    assert events == ["freed", "watcher waited", "watcher killed"]


def test_a_watcher_without_a_first_reading_never_frees() -> None:
    events: list[str] = []
    watcher = _Watcher(["gone 1000"], events)
    with pytest.raises(GuestError, match="before its first reading"):
        rss_watch.watch(_L1(watcher), 4242, START, TARGET, 30.0, lambda: events.append("freed"))
    assert "freed" not in events and events[-1] == "watcher killed"


def _on_l1(after: list[str], on: bool) -> reporting.Reporting:
    base, peak = 200_000, 200_000 + 512 * 1024
    hold = FakeBackground(["t=3.0 event=allocated mib=512 touched=1 touch_s=2.5"])
    vm = FakeBalloonGuest(BalloonQmp([1 << 30], FakeClock(0.0)), AgentShell({}, hold))

    def read(_pid: int) -> int:
        held = any(argv[1:3] == ["hold", "512"] for argv in vm.ssh.ran)
        return peak if held else base

    events: list[str] = []
    watcher = _Watcher(["ready 1000 724288 0", *after], events)
    clock = iter(float(t) / 10 for t in range(1000))
    return reporting.touch_and_free_on_l1(
        vm,
        AGENT,
        on,
        _L1(watcher),
        4242,
        read,
        clock_s=lambda: next(clock),
        sleep=lambda _s: None,
    )


def test_on_l1_the_return_is_l1_seconds_from_the_first_fall_under_its_own_name() -> None:
    run = _on_l1(["1250 650000 1249 0 0", "1340 280000 1339 0 0", "end met 1340 280000 700 0"], on=True)
    assert run.met and run.waited_s == pytest.approx(0.9) and run.share > reporting.ON_RETURNED
    record = run.record()
    assert (record.metric, record.samples) == ("rss_return_l1_s", [run.waited_s])
    assert record.variant == {"free_page_reporting": True}
    assert record.extra["l1_to_start_s"] == 2.5 and record.extra["problems"] == []
    assert "L1's /proc/uptime" in record.settings["timed_by"]


def test_on_l1_the_passes_work_is_recorded_per_mib_under_its_own_name() -> None:
    # one pass: two falls 0.2 L1 s apart, 8 ms of QEMU's run time over them
    falls = ["1250 650000 1249 3000000 1000000", "1270 280000 1269 9000000 3000000", "end met 1270 280000 700 9000000"]
    run = _on_l1(falls, on=True)
    work = run.work_record()
    assert work is not None and work.metric == reporting.L1_WORK_METRIC == "report_cpu_l1_ns_per_mib"
    # 8 ms of run time for the 444288 KiB the pass gave back
    assert work.samples == [pytest.approx(8_000_000 * 1024 / (724288 - 280000))]
    assert work.variant == {"free_page_reporting": True} and work.unit == "ns/MiB"
    assert run.record().extra["l1_pass_cpu_ns"] == [8_000_000]
    assert _on_l1(["end deadline 2000 724300 500 0"], on=False).work_record() is None
    assert reporting.Reporting(True, True, 1, 2, True, 1, 0.5, 30.0).work_record() is None


def test_on_l1_without_reporting_the_window_is_watched_and_nothing_returns() -> None:
    run = _on_l1(["end deadline 2000 724300 500 0"], on=False)
    assert not run.met and run.share < reporting.OFF_RETURNED
    assert run.window_s == reporting.OFF_WINDOW_S and run.waited_s == pytest.approx(10.0)
    assert run.record().metric == reporting.L1_METRIC


def test_on_this_machine_the_metric_keeps_its_wall_clock_name() -> None:
    run = reporting.Reporting(True, True, 1, 2, True, 1, 0.5, 30.0)
    assert run.record().metric == reporting.METRIC == "rss_return_s"


# -- the script itself, under this machine's busybox --------------------------

HOLDER = """
import mmap, sys
m = mmap.mmap(-1, 64 << 20)
for i in range(0, 64 << 20, 4096):
    m[i] = 1
print("held", flush=True)
sys.stdin.readline()
m.close()  # 64 MiB unmapped: the RSS falls at once
print("freed", flush=True)
sys.stdin.readline()
"""


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(BUSYBOX is None, reason="no busybox on this machine")
@pytest.mark.parametrize("free", [True, False])
def test_the_script_watches_a_real_process_to_its_target_or_its_deadline(tmp_path: Path, free: bool) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        peak = _rss_kib(holder.pid)
        base = peak - 64 * 1024
        start = reporting.at_or_below(base, peak, reporting.START_RETURNED)
        target = reporting.at_or_below(base, peak, reporting.ON_RETURNED)
        stdin = holder.stdin

        def release() -> None:
            if free:
                stdin.write("\n")
                stdin.flush()

        watch = rss_watch.watch(BusyboxShell(tmp_path / "bin"), holder.pid, start, target, 0.5, release)
    finally:
        holder.kill()
        holder.wait()
    assert watch.first.kib > start
    if free:
        assert watch.met and watch.start is not None and watch.return_s is not None and watch.last.kib <= target
        # the process's own run time, read from its threads' schedstat: the
        # munmap of 64 MiB ran in it, between the first reading and the end
        assert watch.last.cpu_ns > watch.first.cpu_ns > 0
        assert all(p.cpu_ns >= 0 for p in watch.pass_work)
    else:
        # the deadline, on the watcher's clock (this machine's uptime here)
        assert not watch.met and watch.start is None and watch.watched_s >= 0.5
        assert watch.polls > 10
