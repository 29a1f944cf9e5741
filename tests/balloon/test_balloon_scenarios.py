"""The balloon scenarios' procedures (host/balloon/: floor, correctness,
reporting, stats_interval) on a canned QMP machine and a scripted guest
shell: what each returns for the e2e test to assert, both ways."""

from __future__ import annotations

import pytest
from fakes import AgentShell, BalloonQmp, FakeBackground, FakeBalloonGuest, FakeClock

from memqual.host.balloon import reporting, stats_interval
from memqual.host.balloon.correctness import run_correctness
from memqual.host.balloon.device import BalloonController, GuestStats
from memqual.host.balloon.floor import PRESSURE_MIB, run_deflate_on_oom, run_floor
from memqual.host.balloon.scenarios import ScenarioFailed
from memqual.host.balloon.table import FREE_PAGE_REPORTING
from memqual.host.core import profiles

MIB = 1 << 20
RAM = 1024 * MIB
AGENT = "/tmp/balloon_agent"
STAT = f"t=1.0 event=stat mem_total_kib={RAM // 1024} mem_available_kib=900000 balloon_inflate=0 balloon_deflate=5\n"
DRAINED = "percpu_drain cpu=1 offline=1 online=1\npercpu_drain done\n"


def guest(
    actuals: list[int], answers: dict[str, str | list[str]], background: FakeBackground | None = None
) -> tuple[FakeBalloonGuest, BalloonController, BalloonQmp]:
    clock = FakeClock(100.0)
    machine = BalloonQmp(actuals, clock)
    ctl = BalloonController(machine, clock=clock, sleep=clock.sleep, poll_pause_s=0.0005, far_pause_s=0.0005)
    return FakeBalloonGuest(machine, AgentShell({"stat": STAT, **answers}, background)), ctl, machine


def script_floor(machine: BalloonQmp, floor: int) -> None:
    """Two probes that agree at ``floor``, each backed off by 64 MiB, then back to RAM."""
    safe = floor + 64 * MIB
    machine.after_balloon[1 << 20] = [[RAM, RAM - 500 * MIB, floor], [safe, floor]]
    machine.after_balloon[safe] = [[floor + 10 * MIB, safe]]
    machine.after_balloon[RAM] = [[safe, RAM]]


def test_floor_drains_before_every_probe_and_records_the_floor() -> None:
    vm, ctl, machine = guest([RAM], {"sh": DRAINED, "echo": "alive\n", "dmesg": ""})
    script_floor(machine, 171 * MIB)
    run = run_floor(vm, ctl, AGENT)
    assert run.floor.floor_bytes == 171 * MIB and len(run.drains) == len(run.floor.probes) == 2
    assert run.answered == "alive" and run.oom_kills == [] and run.deflated and run.gave_back_everything
    record = run.record()
    assert (record.scenario, record.metric, record.samples) == ("balloon.floor", "floor_mib", [171.0])
    assert record.extra["probes_mib"] == [171.0, 171.0]


def test_floor_reports_an_oom_kill_and_memory_not_given_back() -> None:
    shrunk = STAT.replace(f"mem_total_kib={RAM // 1024}", f"mem_total_kib={RAM // 1024 - 8}")
    vm, ctl, machine = guest(
        [RAM], {"sh": DRAINED, "echo": "", "dmesg": "[1.0] Killed process 77 (dropbear)\n", "stat": [STAT, shrunk]}
    )
    script_floor(machine, 171 * MIB)
    run = run_floor(vm, ctl, AGENT)
    assert run.oom_kills == ["[1.0] Killed process 77 (dropbear)"]
    assert run.answered == "" and not run.gave_back_everything


def test_deflate_on_oom_counts_what_the_balloon_gave_under_pressure() -> None:
    progress = [f"t=2.{i} event=progress balloon_deflate={5 + 256 * i}" for i in range(1, 4)]
    lines = [*progress, f"t=3.0 event=allocated mib={PRESSURE_MIB}"]
    vm, ctl, machine = guest([RAM], {"dmesg": ""}, background=FakeBackground(lines))
    script_floor(machine, 171 * MIB)
    run = run_deflate_on_oom(vm, ctl, AGENT)
    assert (run.status, run.allocated_mib, run.deflated_pages) == (0, PRESSURE_MIB, 3 * 256)
    assert run.deflated and run.record().samples == [3.0]
    # The agent that never got its memory: nothing deflated, nothing allocated.
    vm, ctl, machine = guest(
        [RAM], {"dmesg": ""}, background=FakeBackground(["t=2.0 event=progress balloon_deflate=5"], 1)
    )
    script_floor(machine, 171 * MIB)
    failed = run_deflate_on_oom(vm, ctl, AGENT)
    assert (failed.status, failed.allocated_mib, failed.deflated_pages) == (1, 0, 0)


def test_correctness_sees_odd_targets_refused_and_the_device_come_back() -> None:
    answers: dict[str, str | list[str]] = {
        "unload": "t=1 event=unload status=0\n",
        "load": "t=1 event=load module_loaded=1\n",
        "ls": "",
    }
    vm, ctl, machine = guest([RAM], answers)
    # The second half-RAM move is followed by the unload's return to RAM.
    machine.after_balloon[RAM // 2] = [[RAM, RAM // 2], [RAM, RAM // 2, RAM], [RAM, RAM // 2], [RAM, RAM // 2]]
    machine.after_balloon[2 * RAM] = [[RAM // 2, RAM]]
    machine.after_balloon[RAM] = [[RAM], [RAM // 2, RAM]]
    run = run_correctness(vm, ctl, AGENT)
    assert run.memqual_refused == {"0": True, "-4096": True, "ram+page": True}
    assert all(not a.accepted and "expects a size" in a.error for a in run.qemu_answers.values())
    assert run.clamped.actual_bytes == RAM and run.total_back_after_unload and run.readd.reached
    assert run.still_bound == []
    assert run.record().extra["qemu_answers"]["2*ram"].startswith("accepted")
    # A driver that will not unload stops the scenario.
    vm, ctl, machine = guest([RAM], {**answers, "unload": "t=1 event=unload status=1\n"})
    machine.after_balloon[RAM // 2] = [[RAM, RAM // 2]]
    machine.after_balloon[2 * RAM] = [[RAM // 2, RAM]]
    with pytest.raises(ScenarioFailed, match="did not unload"):
        run_correctness(vm, ctl, AGENT)


def rss_run(
    before: list[int],
    after: list[int],
    on: bool,
    hold: FakeBackground | None = None,
    touch_mib: int = reporting.TOUCH_MIB,
) -> tuple[reporting.Reporting, list[bool]]:
    """QEMU's RSS walks ``before`` until the agent touches its ``touch_mib``,
    then ``after`` (each list's last value repeating); also whether the
    agent was still holding at each read after the touch."""
    clock = FakeClock(0.0)
    hold = hold or FakeBackground([f"t=3.0 event=allocated mib={touch_mib} touched=1 touch_s=2.5"])
    vm, _, _ = guest([RAM], {}, background=hold)
    feeds = iter(before), iter(after)
    last = [before[0]]
    held: list[bool] = []

    def read(pid: int) -> int:
        touched = any(argv[1:3] == ["hold", str(touch_mib)] for argv in vm.ssh.ran)
        if touched:
            held.append(not hold.killed)
        last[0] = next(feeds[touched], last[0])
        return last[0]

    run = reporting.touch_and_free(vm, AGENT, on, read=read, clock_s=clock, sleep=clock.sleep, touch_mib=touch_mib)
    return run, held


def test_reporting_on_sees_the_rise_given_back() -> None:
    base, peak = 200_000, 200_000 + 512 * 1024
    run, held = rss_run([base], [peak, peak, 500_000, 300_000, 220_000], on=True)
    assert run.settled and run.met and run.share > reporting.ON_RETURNED
    # The peak is read while the agent holds the memory, then it is ended.
    assert run.peak_kib == peak and held[0] and not any(held[1:])
    assert run.record().variant == {"free_page_reporting": True}


def test_the_touch_is_the_profile_s_and_its_record_says_so() -> None:
    """./run-tests' smoke profile touches half the A/B's 512 MiB."""
    touch = FREE_PAGE_REPORTING.sizes_for(profiles.SMOKE, icount=False).touch_mib
    assert (touch, FREE_PAGE_REPORTING.sizes_for(profiles.AB, icount=False).touch_mib) == (256, reporting.TOUCH_MIB)
    base, peak = 200_000, 200_000 + touch * 1024
    run, _ = rss_run([base], [peak, 260_000, 210_000], on=True, touch_mib=touch)
    # The fake's RSS rises only once the agent holds ``touch`` MiB.
    assert run.peak_kib == peak and run.met
    assert run.touched_mib == touch and run.record().settings["touched_mib"] == touch


def test_reporting_off_watches_the_whole_window() -> None:
    base, peak = 200_000, 200_000 + 512 * 1024
    run, _ = rss_run([base], [peak], on=False)
    assert run.settled and not run.met and run.share == 0.0
    assert run.waited_s >= reporting.OFF_WINDOW_S


def test_reporting_reports_a_baseline_that_never_settles() -> None:
    run, _ = rss_run(list(range(100_000, 10_000_000, 10_000)), [20_000_000], on=True)
    assert not run.settled


def test_reporting_stops_when_the_agent_never_holds_its_memory() -> None:
    hold = FakeBackground(["t=1.0 event=error call=mmap errno=12 mib=512"], 4)
    with pytest.raises(ScenarioFailed, match="ended before it held 512 MiB"):
        rss_run([200_000], [200_000], on=True, hold=hold)
    assert hold.killed


def test_stats_refusals_and_a_qemu_that_updates_too_often() -> None:
    _, ctl, machine = guest([RAM], {})
    run = stats_interval.measure_stats(ctl)
    assert run.memqual_refused == {"-1": True, str(2**32): True}
    # The fake QEMU, like 7.2, refuses a negative interval and takes a huge one.
    assert "greater than zero" in run.qemu_refusals["-1"] and run.qemu_refusals[str(2**32)] == ""
    assert [u.read_back for u in run.intervals] == [1, 2] and machine.interval == 0
    # It updates every third read, far sooner than the interval: caught.
    assert all("faster" in u.problems()[0] for u in run.intervals)
    assert run.intervals[0].unset() == ["stat-total-memory", "stat-available-memory"]
    record = run.record()
    assert record.metric == "stats_update_period_s" and len(record.samples) == stats_interval.UPDATES - 1


def test_stats_periods_within_the_interval_pass_and_late_ones_do_not() -> None:
    stats = GuestStats(1, {key: 1 for key in stats_interval.SET_FIELDS})
    on_time = stats_interval.IntervalUpdates(1, 1, [(0.0, 0.02), (1.0, 1.02), (2.01, 2.03)], stats)
    assert on_time.problems() == [] and on_time.unset() == []
    late = stats_interval.IntervalUpdates(1, 1, [(0.0, 0.02), (2.5, 2.52)], stats)
    assert "slower" in late.problems()[0]
