"""memqual balloon measure without a guest: its checks (exit 2 before
anything is built or booted), the summary of its moves, the table."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from test_balloon_controller import run_cli  # the balloon subcommand through its own parser

from memqual.host.balloon import measure as bmeas
from memqual.host.core.errors import BadInput

MIB = 1 << 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"memory_mib": 1024, "target_mib": 2048}, "not below the guest's 1024 MiB"),
        ({"memory_mib": 1024, "target_mib": 1024}, "nothing would be inflated"),
        ({"memory_mib": 1024, "target_mib": 0}, "more than 0"),
        ({"memory_mib": 1024, "target_mib": -5}, "more than 0"),
        ({"memory_mib": 128, "target_mib": 64}, "at least 256 MiB"),
        ({"memory_mib": 1024, "target_mib": 256, "repeats": 0}, "1 to 100"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(BadInput, match=message) as info:
        bmeas.MeasureConfig(**kwargs).check()
    assert "\n" not in str(info.value)


def test_cli_refuses_before_building_or_booting(monkeypatch, capsys):
    def must_not_run(*args, **kwargs):
        raise AssertionError("built or booted despite bad input")

    monkeypatch.setattr("memqual.images.build.build", must_not_run)
    monkeypatch.setattr(bmeas, "measure", must_not_run)
    assert run_cli(["balloon", "measure", "--memory", "1024", "--target", "4096"]) == 2


def move(reached: bool, host_s: float, guest_s: float | None, moved_mib: int = 768, actual_mib: float = 256.0):
    return {
        "reached": reached,
        "stalled": not reached,
        "moved_bytes": moved_mib * MIB,
        "actual_bytes": int(actual_mib * MIB),
        "host_s": host_s,
        "host_resolution_s": 0.0015,
        "guest_s": guest_s,
        "guest_resolution_s": 0.0002 if guest_s else None,
    }


def test_result_summarises_reached_moves_and_says_where_a_stall_stopped():
    config = bmeas.MeasureConfig(memory_mib=1024, target_mib=256, repeats=3)
    moves = [
        {"repeat": 1, "inflate": move(True, 2.0, 1.9), "deflate": move(True, 0.4, 0.38)},
        {"repeat": 2, "inflate": move(True, 1.6, 1.55), "deflate": move(True, 0.5, 0.45)},
    ]
    started = {"warm": True, "accel": "tcg", "boot_to_ssh_s": 0.5}
    result = bmeas._result(config, 1024 * MIB, moves, started)
    assert result["reached"] and result["repeats_done"] == 2
    assert result["inflate"]["host_s"] == {"median": 1.8, "min": 1.6, "max": 2.0, "n": 2}
    assert result["inflate"]["gbps_guest"] == pytest.approx(768 * MIB / 1e9 / 1.725, rel=0.02)
    stalled = moves[:1] + [
        {"repeat": 2, "inflate": move(False, 3.0, None, 600, 159.6), "deflate": move(True, 0.3, None, 600)}
    ]
    result = bmeas._result(config, 1024 * MIB, stalled, started)
    assert not result["reached"] and result["stopped_at_mib"] == pytest.approx(159.6, abs=0.01)
    assert result["inflate"]["host_s"]["n"] == 1  # only reached moves are timed
    buf = io.StringIO()
    bmeas.print_result(result, Console(file=buf, width=120))
    assert "stopped giving pages at 159.6 MiB" in buf.getvalue()
    assert "guest (counters)" in buf.getvalue()


TIMER_LIST = """\
Timer List Version: v0.9
HRTIMER_MAX_CLOCK_BASES: 8
now at 4412795341 nsecs

cpu: 0
 clock 0:
  .base:       (____ptrval____)
  .index:      0
  .resolution: 1 nsecs
  .get_time:   ktime_get
"""


def test_the_guest_clock_is_read_from_the_clocksource_and_timer_list() -> None:
    from memqual.host.balloon.agent import GuestClock

    assert GuestClock.parse("tsc\n", TIMER_LIST) == GuestClock("tsc", 1)
    # Without high-resolution timers the resolution is a tick: 4 ms at HZ=250.
    coarse = GuestClock.parse("jiffies\n", TIMER_LIST.replace("1 nsecs", "4000000 nsecs"))
    assert coarse.resolution_ns == 4_000_000


def test_a_timer_list_without_a_resolution_is_an_error() -> None:
    from memqual.host.balloon.agent import GuestClock
    from memqual.host.core.errors import GuestError

    with pytest.raises(GuestError, match="resolution"):
        GuestClock.parse("tsc\n", "Timer List Version: v0.9\n")
