"""The balloon controller (host/balloon/device.py), its guest agent's
output, QEMU's RSS and ``memqual balloon model`` against a canned QMP machine."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any

import pytest
from fakes import BalloonQmp, FakeBackground, FakeClock, FakeShell
from local_shell import LocalShell

from memqual.host.balloon import percpu, rss
from memqual.host.balloon.agent import GuestTiming, GuestTracker, agent_records, agent_stat, parse_agent_line
from memqual.host.balloon.device import (
    EVENT_STALL_S,
    STATS_INTERVAL_MAX,
    BalloonController,
    BalloonResult,
    QemuAnswer,
    expected_actual,
    find_floor,
    wait_actual,
)
from memqual.host.balloon.percpu import drain_percpu_lists, parse_drain
from memqual.host.balloon.rss import rss_kib, wait_rss, wait_rss_steady
from memqual.host.balloon.timed_move import DEADLINE_S, TRACK_PERIOD_US, BalloonMover
from memqual.host.cli import balloon as balloon_cli
from memqual.host.cli.command import parser_for, run_command
from memqual.host.cli.commands import COMMANDS
from memqual.host.core.errors import BadInput, GuestError, MemqualError, Timeout

MIB = 1 << 20
RAM = 1024 * MIB


def controller(actuals: list[int], **kw: Any) -> tuple[BalloonController, BalloonQmp, FakeClock]:
    clock = FakeClock(100.0)
    machine = BalloonQmp(actuals, clock, **{k: v for k, v in kw.items() if k == "balloon"})
    ctl = BalloonController(
        machine, clock=clock, sleep=clock.sleep, poll_pause_s=0.0005, far_pause_s=kw.get("far", 0.0005)
    )
    return ctl, machine, clock


def test_reaches_target_and_times_it():
    target = 256 * MIB
    ctl, machine, _ = controller([RAM, RAM, RAM - 100 * MIB, RAM - 500 * MIB, target])
    r = ctl.reach(target)
    assert r.reached and not r.stalled
    assert r.actual_bytes == target and r.start_bytes == RAM
    assert r.pages == 768 * MIB // 4096
    # 4 polls after the command: 4 round trips + 3 pauses + the command itself
    assert r.polls == 4
    assert r.seconds == pytest.approx(5 * 0.0002 + 3 * 0.0005)
    assert r.resolution_s == pytest.approx(0.0007)  # one pause + one round trip: well under 1 ms
    assert r.gbps == pytest.approx(768 * MIB / r.seconds / 1e9)
    assert ("balloon", {"value": target}) in machine.sent


def test_polls_far_then_tightly_near_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 MiB per poll towards a target 400 MiB away: far polls every 10 ms,
    # tight (0.5 ms) once the average rate says the end is within 50 ms
    target = RAM - 400 * MIB
    ctl, machine, clock = controller([RAM] + [RAM - k * MIB for k in range(1, 401)], far=0.01)
    pauses: list[float] = []
    real_sleep = clock.sleep

    def sleep(dt: float) -> None:
        pauses.append(dt)
        real_sleep(dt)

    monkeypatch.setattr(ctl, "sleep", sleep)
    r = ctl.reach(target)
    assert r.reached and r.polls == 400
    assert pauses[0] == 0.01 and pauses[-1] == 0.0005
    assert 0 < pauses.count(0.0005) < 20  # only the last few polls are tight
    assert r.resolution_s == pytest.approx(0.0007)


def test_target_rounded_to_pages_like_qemu():
    assert expected_actual(RAM, 256 * MIB + 100) == 256 * MIB + 4096
    assert expected_actual(RAM, 2 * RAM) == RAM  # QEMU clamps above RAM


def test_stall_reports_the_floor():
    floor = 150 * MIB
    ctl, _, clock = controller([RAM, RAM - 400 * MIB, floor])
    t0 = clock.t
    r = ctl.reach(128 * MIB, deadline_s=30, stall_s=1.0)
    assert r.stalled and not r.reached
    assert r.actual_bytes == floor
    assert r.seconds < 0.01  # the time the floor was first seen, not the stall wait
    assert clock.t - t0 >= 1.0  # it did wait stall_s before giving up


def test_never_moves_is_a_deadline_error():
    ctl, _, clock = controller([RAM])
    t0 = clock.t
    with pytest.raises(Timeout, match="never moved"):
        ctl.reach(512 * MIB, deadline_s=2.0, stall_s=0.5)
    assert 2.0 <= clock.t - t0 < 2.1


def test_bad_targets_refused_before_qemu():
    ctl, machine, _ = controller([RAM])
    for bad, words in [(0, "<= 0"), (-4096, "<= 0"), (RAM + 1, "above guest RAM"), (1.5, "whole number")]:
        with pytest.raises(BadInput, match="refused by memqual|whole number") as err:
            ctl.set_target(bad)  # type: ignore[arg-type]  # 1.5: a wrong type on purpose, refused at run time
        assert words in str(err.value)
    assert not [c for c, _ in machine.sent if c == "balloon"]  # QEMU never asked


def test_qemu_behaviour_surfaced_unchecked():
    ctl, _, _ = controller([RAM])
    assert ctl.qemu_balloon(0) == QemuAnswer(False, "Parameter 'target' expects a size")
    assert ctl.qemu_balloon(-1).accepted is False
    assert ctl.qemu_balloon(RAM * 4).accepted  # QEMU clamps silently
    with pytest.raises(BadInput, match="QEMU refused balloon target 0: Parameter 'target'"):
        ctl.reach(0, checked=False)


def test_no_balloon_device_is_bad_input():
    ctl, _, _ = controller([RAM], balloon=False)
    with pytest.raises(BadInput, match="No balloon device"):
        ctl.set_target(512 * MIB)


def test_stats_interval_and_update():
    ctl, machine, _ = controller([RAM])
    assert ctl.qom_path() == "/machine/peripheral/balloon0"
    ctl.set_stats_interval(2)
    assert ctl.stats_interval() == 2
    first = ctl.guest_stats()
    assert first.unset == ["stat-swap-in"]
    newer = ctl.wait_stats_update(first.last_update, deadline_s=5)
    assert newer.last_update > first.last_update
    for bad in (-1, STATS_INTERVAL_MAX + 1, 1.5):
        with pytest.raises(BadInput, match="refused by memqual"):
            ctl.set_stats_interval(bad)  # type: ignore[arg-type]  # 1.5: a wrong type on purpose, refused at run time
    with pytest.raises(BadInput, match="timer value must be greater than zero"):
        ctl.qemu_set_stats_interval(-1)
    assert machine.interval == 2


def test_stats_update_deadline():
    ctl, machine, clock = controller([RAM])
    machine.stats_updates = -(10**9)  # last-update never grows past 'after'
    with pytest.raises(Timeout, match="not updated"):
        ctl.wait_stats_update(after=10**9, deadline_s=0.3)


def test_qom_path_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    ctl, _, _ = controller([RAM])
    ctl.device_id = "nope"

    def qmp(command: str, **arguments: object) -> object:
        raise GuestError("not found")

    monkeypatch.setattr(ctl.machine, "qmp", qmp)
    with pytest.raises(MemqualError, match="no virtio-balloon device"):
        ctl.qom_path()


def test_rss_of_this_process_and_wait_rss():
    pid = os.getpid()
    assert rss_kib(pid) > 1000
    met, rss, _ = wait_rss(pid, lambda kib: kib > 0, deadline_s=1)
    assert met and rss > 0
    clock = FakeClock(100.0)
    met, _, waited = wait_rss(pid, lambda kib: kib < 0, deadline_s=0.5, clock=clock, sleep=clock.sleep)
    assert not met and waited >= 0.5
    with pytest.raises(GuestError, match="gone"):
        rss_kib(2**22 + 12345)


def test_wait_rss_steady_waits_for_a_quiet_second():
    clock = FakeClock(100.0)
    # Falls for 1 s (10 polls of 0.1 s), then holds with 0.5% jitter.
    values = iter([1000 - 50 * i for i in range(10)] + [500, 502, 499, 501] * 20)
    steady, rss, waited = wait_rss_steady(
        1, quiet_s=1.0, deadline_s=10, clock=clock, sleep=clock.sleep, read=lambda pid: next(values)
    )
    assert steady and 495 <= rss <= 505
    assert 1.9 <= waited <= 2.3  # 1 s falling, then 1 s quiet


def test_wait_rss_steady_reports_a_moving_rss_at_the_deadline():
    clock = FakeClock(100.0)
    values = iter(range(1000, 100000, 100))  # always more than 1% up
    steady, _, waited = wait_rss_steady(
        1, quiet_s=1.0, deadline_s=3, clock=clock, sleep=clock.sleep, read=lambda pid: next(values)
    )
    assert not steady and waited >= 3


def test_parse_agent_line():
    d = parse_agent_line("t=12.000000001 event=stat mem_total_kib=1000 buddy_free_per_order=1,2,3")
    assert d == {"t": "12.000000001", "event": "stat", "mem_total_kib": "1000", "buddy_free_per_order": "1,2,3"}


def run_cli(argv: list[str]) -> int:
    """Our subcommand through a parser of its own (the other subjects'
    modules need not exist for this test), with memqual.host.cli.main's error handling."""
    args = parser_for(balloon_cli.COMMAND).parse_args(argv)
    try:
        return run_command(args)
    except MemqualError as exc:
        return exc.exit_status


def test_cli_model(capsys):
    assert balloon_cli.COMMAND in COMMANDS
    assert run_cli(["balloon", "model", "--per-page-us", "4"]) == 0
    out = capsys.readouterr().out
    assert "2031" in out and "1237" in out and "15360 requests" in out
    assert run_cli(["balloon", "model", "--per-page-us", "-1"]) == 2


def test_find_floor_backs_off_at_once_and_confirms():
    floor = 171 * MIB
    safe = floor + 64 * MIB
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, RAM - 500 * MIB, floor], [safe, floor + 2 * MIB]]
    machine.after_balloon[safe] = [[floor + 10 * MIB, safe]]
    machine.after_balloon[floor + 2 * MIB + 64 * MIB] = [[floor + 66 * MIB]]
    f = find_floor(ctl, margin_bytes=64 * MIB, stall_s=0.5)
    assert f.probes == [floor, floor + 2 * MIB]  # two probes agree within 8 MiB
    assert f.floor_bytes == floor + 2 * MIB and f.safe_bytes == floor + 66 * MIB
    assert f.probe.stalled and f.backoff.reached
    # nothing but QMP between each probe and its backoff
    balloons = [a["value"] for c, a in machine.sent if c == "balloon"]
    assert balloons == [1 << 20, safe, 1 << 20, floor + 66 * MIB]


def test_find_floor_sees_through_a_false_stall():
    floor = 150 * MIB
    ctl, machine, _ = controller([RAM])
    # first probe pauses at 767 MiB (a starved vCPU), the next ones reach the floor
    machine.after_balloon[1 << 20] = [[RAM, 767 * MIB], [831 * MIB, floor], [214 * MIB, floor]]
    for start in (767, 150):
        machine.after_balloon[(start + 64) * MIB] = [[(start + 64) * MIB]]
    f = find_floor(ctl, margin_bytes=64 * MIB, stall_s=0.5)
    assert f.probes == [767 * MIB, floor, floor]
    assert f.floor_bytes == floor


def test_find_floor_gives_up_when_probes_disagree():
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, (900 - 100 * i) * MIB] for i in range(5)]
    for i in range(5):
        machine.after_balloon[(964 - 100 * i) * MIB] = [[(964 - 100 * i) * MIB]]
    with pytest.raises(GuestError, match="probes disagree"):
        find_floor(ctl, stall_s=0.5, max_probes=3)


def test_find_floor_fails_if_backoff_stalls():
    floor = 171 * MIB
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, floor]]
    machine.after_balloon[floor + 64 * MIB] = [[floor, floor + MIB]]  # moves a little, then sticks
    with pytest.raises(GuestError, match="did not deflate"):
        find_floor(ctl, stall_s=0.5)


def test_find_floor_waits_out_a_pause_in_the_backoff():
    """A deflate has no floor: a guest that stops giving for 3 s at its min
    watermark (a probe's stall is 0.5 s here) is waited for, not failed."""
    floor = 171 * MIB
    safe = floor + 64 * MIB
    # about 0.7 ms of fake time a poll: 4300 polls is a 3 s pause
    paused = [floor, floor + MIB, *[floor + MIB] * 4300, safe]
    ctl, machine, clock = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, floor], [safe, floor]]
    machine.after_balloon[safe] = [[floor + 10 * MIB, safe], paused]
    started = clock.t
    f = find_floor(ctl, stall_s=0.5)
    assert f.probes == [floor, floor] and f.backoff.reached and f.safe_bytes == safe
    assert f.backoff.seconds > 2.5 and clock.t - started < 10
    # Told to give up after 0.5 s like a probe, the same pause fails it.
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, floor]]
    machine.after_balloon[safe] = [paused]
    with pytest.raises(GuestError, match="did not deflate"):
        find_floor(ctl, stall_s=0.5, backoff_stall_s=0.5)


def test_wait_actual():
    ctl, _, _ = controller([512 * MIB, 600 * MIB, RAM])
    value, waited = wait_actual(ctl, lambda v: v == RAM, deadline_s=5)
    assert value == RAM and waited > 0
    ctl2, _, _ = controller([512 * MIB])
    with pytest.raises(Timeout, match="stayed at"):
        wait_actual(ctl2, lambda v: v == RAM, deadline_s=0.2)


def test_agent_stat_parsing():
    out = (
        "t=1.0 event=buddy node=0 zone=DMA free_per_order=0,1\n"
        "t=1.1 event=stat mem_total_kib=983496 balloon_inflate=-1 module_loaded=1 buddy_free_per_order=1,2\n"
        "t=2.0 event=allocated mib=64 touched=1 touch_s=0.1\n"
        "t=2.1 event=stat mem_total_kib=983400 balloon_inflate=5 module_loaded=1 buddy_free_per_order=1,2\n"
    )
    assert agent_stat(out) == {"mem_total_kib": 983400, "balloon_inflate": 5, "module_loaded": 1}
    assert [r["mib"] for r in agent_records(out, "allocated")] == ["64"]
    with pytest.raises(GuestError, match="no stat line"):
        agent_stat("t=1 event=load status=0\n")


def test_cli_model_from_a_record(tmp_path, capsys):
    from memqual.host.balloon import model as transfer_model
    from memqual.host.core.record import Measurement, write

    cal = transfer_model.calibrate(
        [transfer_model.Observation.of_array_inflate(p, 0.1 + p * 1e-5) for p in (50000, 100000, 200000)]
    )
    path = write(
        Measurement(
            scenario="balloon.inflate",
            metric="inflate_s",
            unit="s",
            better="lower",
            samples=[2.0],
            extra={"model": transfer_model.predict_seed(cal)},
        ),
        tmp_path,
    )
    assert run_cli(["balloon", "model", "--record", str(path)]) == 0
    out = capsys.readouterr().out
    assert "10.00 us/page" in out and "not identifiable" in out and "2031" in out
    bare = write(
        Measurement(scenario="balloon.deflate", metric="deflate_s", unit="s", better="lower", samples=[1.0]), tmp_path
    )
    assert run_cli(["balloon", "model", "--record", str(bare)]) == 2
    assert run_cli(["balloon", "model", "--record", str(tmp_path / "missing.json")]) == 2


TRACKED = (
    "t=10.000000000 event=tracking counter=balloon_inflate base=0 pages=100 period_us=1000\n"
    "t=11.800000000 event=tracked counter=balloon_inflate pages=100 moved=100 first_s=10.0 end_s=11.8 "
    "seconds=1.800000000 first_gap_s=0.000100000 end_gap_s=0.000200000 polls=900 spins=40 "
    "period_s=0.002000000 max_gap_s=0.004000000\n"
)


def test_guest_timing_from_agent_output():
    timing = GuestTiming.from_agent(TRACKED)
    assert timing.seconds == pytest.approx(1.8) and timing.moved == 100 and timing.polls == 900
    assert timing.resolution_s == pytest.approx(0.0002)  # the larger of the two gaps


@pytest.mark.parametrize(
    "stdout, message",
    [("t=1.0 event=tracking base=0\n", "no result"), ("t=1.0 event=tracked pages=1 moved=1 seconds=x\n", "incomplete")],
)
def test_guest_timing_refuses_broken_output(stdout, message):
    with pytest.raises(GuestError, match=message):
        GuestTiming.from_agent(stdout)


def test_tracker_arms_then_returns_the_guest_timing():
    ssh = FakeShell(FakeBackground(TRACKED.splitlines()))
    tracker = GuestTracker(ssh, "/tmp/balloon_agent", "inflate", 100, 1000, 60)
    assert ssh.started[-1] == ["/tmp/balloon_agent", "track", "inflate", "100", "1000", "60"]
    assert tracker.result().seconds == pytest.approx(1.8)


def test_tracker_that_never_arms_is_an_error():
    ssh = FakeShell(FakeBackground(["t=1.0 event=error reason=no_counter counter=balloon_inflate"], status=4))
    with pytest.raises(GuestError, match="did not arm"):
        GuestTracker(ssh, "agent", "inflate", 100, 1000, 60)
    with pytest.raises(ValueError):
        GuestTracker(ssh, "agent", "sideways", 100, 1000, 60)


def test_tracker_exit_status_is_checked():
    lines = TRACKED.splitlines()[:1] + ["t=70.0 event=timeout"]
    tracker = GuestTracker(FakeShell(FakeBackground(lines, status=3)), "agent", "deflate", 100, 1000, 60)
    with pytest.raises(GuestError, match="exited 3"):
        tracker.result()


# -- the one move loop (host/balloon/timed_move.py) -----------------------------
def test_mover_arms_the_tracker_for_the_pages_asked_then_times_both_sides():
    target = 256 * MIB
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[target] = [[RAM, RAM - 100 * MIB, target]]
    ssh = FakeShell(FakeBackground(TRACKED.splitlines()))
    move = BalloonMover(ctl, ssh, "/tmp/balloon_agent").move(target)
    assert move.direction == "inflate" and move.reached and move.given_back is None
    assert move.pages_asked == 768 * MIB // 4096
    assert ssh.started[-1] == [
        "/tmp/balloon_agent",
        "track",
        "inflate",
        str(move.pages_asked),
        str(TRACK_PERIOD_US),
        str(int(DEADLINE_S)),
    ]
    assert move.guest is not None and move.guest.seconds == pytest.approx(1.8)
    assert move.to_json()["guest_s"] == pytest.approx(1.8) and move.to_json()["moved_bytes"] == 768 * MIB
    machine.after_balloon[RAM] = [[target, RAM]]
    back = BalloonMover(ctl).move(RAM)  # no agent: timed by the host only
    assert back.direction == "deflate" and back.reached and back.guest is None


def test_mover_gives_the_balloon_back_over_qmp_at_once_when_the_guest_stalls():
    ctl, machine, _ = controller([RAM])
    floor = 160 * MIB
    machine.after_balloon[MIB] = [[RAM, 500 * MIB, floor]]  # stands at its floor
    machine.after_balloon[RAM] = [[floor, RAM]]
    background = FakeBackground(TRACKED.splitlines()[:1])
    move = BalloonMover(ctl, FakeShell(background), "agent").move(MIB)
    assert not move.reached and move.host.stalled and move.host.actual_bytes == floor
    assert move.given_back is not None and move.given_back.reached and move.guest is None
    assert background.killed  # the tracker cancelled, after the balloon came back
    balloons = [a["value"] for c, a in machine.sent if c == "balloon"]
    assert balloons == [MIB, RAM]


def test_find_floor_runs_before_probe_ahead_of_every_probe():
    # the hook (the per-CPU list drain) runs with the balloon at RAM, then at
    # each floor + margin, and never between a probe and its backoff
    floor = 140 * MIB
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, 300 * MIB, floor + 20 * MIB], [floor + 84 * MIB, floor]]
    machine.after_balloon[floor + 84 * MIB] = [[floor + 84 * MIB]]
    machine.after_balloon[floor + 64 * MIB] = [[floor + 64 * MIB]]
    seen: list[list[int]] = []

    def before_probe() -> None:
        seen.append([a["value"] for c, a in machine.sent if c == "balloon"])

    f = find_floor(ctl, margin_bytes=64 * MIB, stall_s=0.5, agree_bytes=32 * MIB, before_probe=before_probe)
    assert f.probes == [floor + 20 * MIB, floor]
    assert seen == [[], [1 << 20, floor + 84 * MIB]]


def test_find_floor_stops_when_before_probe_fails():
    ctl, machine, _ = controller([RAM])

    def refuse() -> None:
        raise GuestError("cpu1 refused to go offline")

    with pytest.raises(GuestError, match="refused"):
        find_floor(ctl, stall_s=0.5, before_probe=refuse)
    assert not [a for c, a in machine.sent if c == "balloon"]  # no probe without its drain


class DrainShell:
    """A guest shell whose commands print ``stdout``."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.ran: list[list[str]] = []

    def start(self, argv: list[str]) -> Any:
        raise AssertionError("the drain runs to its end")

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None) -> Any:
        self.ran.append(argv)
        return types.SimpleNamespace(stdout=self.stdout, status=0)


def test_drain_cycles_every_hotpluggable_cpu():
    shell = DrainShell(
        "percpu_drain cpu=1 offline=1 online=1\npercpu_drain cpu=3 offline=1 online=1\npercpu_drain done\n"
    )
    assert drain_percpu_lists(shell).cpus == (1, 3)
    assert shell.ran == [["sh", "-c", percpu.DRAIN_SCRIPT]]
    # a one-CPU guest has nothing to cycle: no CPU but the boot CPU holds lists
    assert parse_drain("percpu_drain done\n").cpus == ()


@pytest.mark.parametrize(
    ("stdout", "match"),
    [
        ("percpu_drain cpu=1 offline=0 online=1\npercpu_drain done\n", "refused to go offline"),
        ("percpu_drain cpu=1 offline=1 online=0\npercpu_drain done\n", "did not come back online"),
        ("percpu_drain cpu=1 offline=1 online=1\n", "did not finish"),
        ("", "did not finish"),
        ("sh: can't create /sys/devices/system/cpu/cpu1/online\npercpu_drain done\n", "unexpected line"),
    ],
)
def test_drain_refuses_a_cpu_left_undrained_or_offline(stdout: str, match: str) -> None:
    with pytest.raises(GuestError, match=match):
        parse_drain(stdout)


def test_reach_counts_what_the_guest_takes_back():
    # inflating towards 1 MiB, the guest takes 1 MiB back twice (deflate-on-oom)
    floor = 150 * MIB
    ctl, _, _ = controller([RAM, 300 * MIB, floor, floor + MIB, floor, floor + MIB, floor + MIB])
    r = ctl.reach(1 << 20, stall_s=0.5)
    assert r.stalled and r.actual_bytes == floor + MIB
    assert r.given_back_bytes == 2 * MIB
    # a plain inflate gives nothing back
    ctl, _, _ = controller([RAM, RAM - 100 * MIB, 256 * MIB])
    assert ctl.reach(256 * MIB).given_back_bytes == 0


def test_find_floor_does_not_count_a_contested_probe():
    # the first probe ends a tug of war with the OOM notifier 6 MiB above the
    # floor: within 8 MiB of the next, but it is not where the guest stopped
    floor = 140 * MIB
    ctl, machine, _ = controller([RAM])
    first = [RAM, 300 * MIB, floor + 5 * MIB, floor + 6 * MIB, floor + 5 * MIB, floor + 6 * MIB]
    machine.after_balloon[1 << 20] = [first, [floor + 70 * MIB, floor + MIB], [floor + 65 * MIB, floor]]
    for start in (floor + 6 * MIB, floor + MIB, floor):
        machine.after_balloon[start + 64 * MIB] = [[start + 64 * MIB]]
    f = find_floor(ctl, margin_bytes=64 * MIB, stall_s=0.5)
    assert f.probes == [floor + 6 * MIB, floor + MIB, floor]
    assert f.given_back == [2 * MIB, 0, 0]
    assert f.floor_bytes == floor


def test_find_floor_fails_when_every_probe_is_contested():
    ctl, machine, _ = controller([RAM])
    machine.after_balloon[1 << 20] = [[RAM, 200 * MIB, 201 * MIB]] + [[264 * MIB, 200 * MIB, 201 * MIB]] * 4
    machine.after_balloon[265 * MIB] = [[265 * MIB]] * 5
    with pytest.raises(GuestError, match="contested"):
        find_floor(ctl, margin_bytes=64 * MIB, stall_s=0.5)


def test_under_a_host_under_test_the_rss_is_the_guest_qemus_in_l1():
    l1 = LocalShell()
    read = rss.l1_rss_reader(l1, os.getpid())
    assert abs(read() - rss_kib(os.getpid())) < 50_000
    assert l1.commands == [["cat", f"/proc/{os.getpid()}/status"]]
    ctl = BalloonController(types.SimpleNamespace(pid=-1), rss=read)
    assert ctl.rss_kib() > 1000  # never this machine's pid -1
    with pytest.raises(GuestError, match="gone"):
        rss.l1_rss_reader(l1, 2**22 + 7)()
    with pytest.raises(GuestError, match="no VmRSS"):
        rss.parse_vm_rss_kib("Name: kthreadd\n", "L1's /proc/2/status")


def test_a_mover_on_events_gives_a_stopped_guest_the_stall_window_to_give_back_not_its_deadline(monkeypatch):
    ctl, _, _ = controller([RAM])
    stalled = BalloonResult(MIB, MIB, RAM, 500 * MIB, False, True, 120.0, 1.0, 1, 1.0)
    back_within: list[float] = []

    def reach(target: int, deadline_s: float = 60.0, **_: object) -> BalloonResult:
        back_within.append(deadline_s)
        return dataclasses.replace(stalled, actual_bytes=RAM, reached=True, stalled=False)

    monkeypatch.setattr(ctl, "reach_by_events", lambda target, deadline_s: stalled)
    monkeypatch.setattr(ctl, "reach", reach)
    move = BalloonMover(ctl, by_events=True, deadline_s=1200.0).move(MIB)
    assert not move.reached and move.given_back is not None and move.given_back.reached
    assert back_within == [EVENT_STALL_S]
