"""The timing scenario's records, from cycles built by hand (no guest)."""

from __future__ import annotations

import dataclasses

from memqual.host.balloon.agent import GuestClock, GuestTiming
from memqual.host.balloon.device import PAGE, BalloonResult
from memqual.host.balloon.host_thp import THP_COUNTERS
from memqual.host.balloon.timed_move import EVENTS_TIMING, POLLS_TIMING, BalloonMover, Move
from memqual.host.balloon.timing import (
    HOST_UNDER_TEST_KNOBS,
    Cycle,
    Step,
    TimingRun,
    cycle_problems,
    guest_timing_problems,
    plan,
    summary,
)

MIB = 1 << 20
RAM = 1024 * MIB
FULL = 512 * MIB
COUNTERS = {"balloon_inflate": 0, "mem_total_kib": RAM // 1024, "mem_available_kib": 900 * 1024}


def host(start: int, end: int, seconds: float) -> BalloonResult:
    return BalloonResult(end, end, start, end, True, False, seconds, 0.0002, 40, 0.001)


def guest(pages: int, seconds: float) -> GuestTiming:
    return GuestTiming(pages, pages, seconds, 0.0001, 0.0003, 50, 0.00005, 0.0004)


def cycle(step: Step, k: int) -> Cycle:
    size = int(FULL * step.fraction)
    inflate_s, deflate_s = 0.5 + 0.01 * k, 0.2 + 0.01 * k
    pages = size // PAGE
    inflate = Move(
        "inflate", pages, host(RAM, RAM - size, inflate_s), guest(pages, inflate_s * 0.9) if step.tracked else None
    )
    deflate = Move(
        "deflate", pages, host(RAM - size, RAM, deflate_s), guest(pages, deflate_s * 0.9) if step.tracked else None
    )
    after = {**COUNTERS, "balloon_inflate": pages, "mem_total_kib": (RAM - size) // 1024}
    return Cycle(step, size, COUNTERS, 100_000, inflate, after, 60_000, deflate, COUNTERS)


def run() -> TimingRun:
    steps = plan(3, (0.25, 0.5))
    return TimingRun(1024, RAM, FULL, 0, 64, "q35", COUNTERS, [cycle(s, k) for k, s in enumerate(steps)])


def test_one_record_per_figure_each_with_its_own_samples() -> None:
    records = {r.metric: r for r in run().records({"bitmap32": 1.0})}
    assert sorted(records) == ["deflate_guest_s", "deflate_s", "inflate_guest_s", "inflate_s"]
    assert [r.scenario for r in records.values()] == [
        "balloon.inflate",
        "balloon.inflate",
        "balloon.deflate",
        "balloon.deflate",
    ]
    main = [k for k, s in enumerate(plan(3, (0.25, 0.5))) if s.main]
    host_timed = [k for k, s in enumerate(plan(3, (0.25, 0.5))) if s.main and not s.tracked]
    assert records["inflate_s"].samples == [0.5 + 0.01 * k for k in host_timed]
    assert records["deflate_s"].samples == [0.2 + 0.01 * k for k in host_timed]
    assert len(records["inflate_guest_s"].samples) == len(main) - len(host_timed)
    for r in records.values():
        assert (r.unit, r.better) == ("s", "lower")
        assert r.settings["guest_mib"] == 1024
        assert r.extra["inflate_mib"] == 512.0
        assert r.extra["summary"]["n"] == len(r.samples)
        assert r.extra["cv"] >= 0
    assert records["inflate_s"].claim == "balloon-bitmap"
    assert {r.claim for m, r in records.items() if m != "inflate_s"} == {None}


def test_the_claim_record_carries_the_model_and_the_calibration() -> None:
    r = {r.metric: r for r in run().records({"bitmap32": 1.0})}["inflate_s"]
    assert r.extra["model"] == {"bitmap32": 1.0}
    assert len(r.extra["calibration_samples"]) == 5  # every host-timed inflate, all sizes
    assert r.extra["ratio_of_guest"] == 0.5
    assert r.extra["cross_checks"][0]["balloon_inflate_delta"] == FULL // PAGE
    assert "model" not in {r.metric: r for r in run().records(None)}["inflate_s"].extra


def test_guest_timed_records_say_how_they_were_timed() -> None:
    records = {r.metric: r for r in run().records(None)}
    for metric in ("inflate_guest_s", "deflate_guest_s"):
        assert records[metric].extra["timed"].startswith("in the guest")
        assert records[metric].extra["poll_period_s"] == 0.00005
    assert "timed" not in records["deflate_s"].extra


def test_a_good_cycle_has_no_problems_and_each_broken_reading_one() -> None:
    good = cycle(Step(1.0, True), 0)
    assert cycle_problems(good, COUNTERS, 0, same_clock=True) == []
    assert good.after is not None
    missed = dataclasses.replace(good, after={**good.after, "balloon_inflate": 7})
    assert [p.split(":")[0] for p in cycle_problems(missed, COUNTERS, 0, same_clock=True)] == ["balloon_inflate delta"]
    # 256 MiB touched, and QEMU's RSS fell 40,000 KiB: less than a quarter.
    assert "RSS did not fall" in cycle_problems(good, COUNTERS, 256, same_clock=True)[0]
    stopped = dataclasses.replace(good, inflate=dataclasses.replace(good.inflate, host=host(RAM, RAM - MIB, 1.0)))
    stopped = dataclasses.replace(
        stopped,
        inflate=dataclasses.replace(stopped.inflate, host=dataclasses.replace(stopped.inflate.host, reached=False)),
    )
    assert cycle_problems(stopped, COUNTERS, 0, same_clock=True)[0].startswith("inflate to")
    # The guest's window longer than the host's: wrong on one clock, not on two.
    slow_guest = dataclasses.replace(
        good, inflate=dataclasses.replace(good.inflate, guest=guest(good.inflate.pages_asked, 9.0))
    )
    assert "guest timed" in cycle_problems(slow_guest, COUNTERS, 0, same_clock=True)[0]
    assert cycle_problems(slow_guest, COUNTERS, 0, same_clock=False) == []


def test_guest_timing_wants_a_fine_clock_and_moves_longer_than_its_polls() -> None:
    fine, coarse = GuestClock("kvm-clock", 1), GuestClock("jiffies", 4_000_000)
    assert guest_timing_problems(fine, [guest(10, 0.5)]) == []
    assert "coarse" in guest_timing_problems(coarse, [guest(10, 0.5)])[0]
    assert guest_timing_problems(fine, []) == ["no move was timed in the guest"]
    assert "fell between" in guest_timing_problems(fine, [guest(10, 0.0002)])[0]


def test_the_summary_names_the_inflate_and_the_guest_resolution() -> None:
    lines = summary(run(), None)
    assert lines[0].startswith("inflate 512 MiB of 1024 MiB: median")
    assert lines[-1].startswith("guest-timed resolution")


def test_the_records_name_how_the_host_timed_each_move() -> None:
    """A run that waited on QEMU's events (a host under test) is not the
    same measurement as one that polled: its settings say which."""
    polled = {r.metric: r for r in run().records(None)}
    waited = {r.metric: r for r in dataclasses.replace(run(), host_timing=EVENTS_TIMING).records(None)}
    for metric in polled:
        assert polled[metric].settings["timing"] == POLLS_TIMING
        assert waited[metric].settings["timing"] == EVENTS_TIMING
    assert BalloonMover(None, by_events=True).host_timing == EVENTS_TIMING  # type: ignore[arg-type]  # no controller: only its label
    assert BalloonMover(None).host_timing == POLLS_TIMING  # type: ignore[arg-type]  # no controller: only its label


def test_the_guest_timed_inflate_carries_the_host_s_thp_moves_where_read() -> None:
    moved = {name: 0 for name in THP_COUNTERS} | {"thp_split_pmd": 5}
    plain = run()
    read = dataclasses.replace(plain, cycles=[dataclasses.replace(c, host_thp=moved) for c in plain.cycles])
    tracked = sum(1 for c in plain.cycles if c.step.main and c.step.tracked)
    records = {r.metric: r for r in read.records(None)}
    assert records["inflate_guest_s"].extra["host_thp"] == [moved] * tracked
    assert "host_thp" not in records["deflate_guest_s"].extra
    assert records["inflate_s"].extra["cross_checks"][0]["host_thp"] == moved
    assert "host_thp" not in {r.metric: r for r in plain.records(None)}["inflate_guest_s"].extra


def test_a_host_under_test_s_boot_knobs_are_in_the_settings_and_only_there() -> None:
    plain = {r.metric: r for r in run().records(None)}
    on_l1 = {r.metric: r for r in dataclasses.replace(run(), host_knobs=HOST_UNDER_TEST_KNOBS).records(None)}
    for metric in plain:
        assert "host_knobs" not in plain[metric].settings
        assert on_l1[metric].settings["host_knobs"] == "transparent_hugepage=never"
