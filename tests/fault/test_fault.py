"""host/fault/ on fakes: fault_probe's lines read and refused, a guest
settled for its clock before it is timed, one sample a guest (the least of
its runs), and the decisions its measured spread supports, through the
real comparison code."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import AgentShell, FakeGuest

from memqual.host.core import clock, fault_probe
from memqual.host.core.errors import GuestError
from memqual.host.core.primary import FINE_MARGIN
from memqual.host.fault import anon
from memqual.host.fault.table import ANON
from memqual.host.judge import families, primaries
from memqual.host.judge.stats import ab_tests
from memqual.host.judge.verdicts import EQUIVALENT, FASTER, SLOWER

TWO_RUNS = (
    "event=run index=0 pages=16384 faults=16385 duration_s=1.834000000 ns_per_page=111938.477\n"
    "event=run index=1 pages=16384 faults=16384 duration_s=1.833700000 ns_per_page=111920.166\n"
    "event=done runs=2\n"
)


def test_the_probe_s_runs_are_read():
    runs = fault_probe.parse_runs(TWO_RUNS, 2)
    assert [run.index for run in runs] == [0, 1]
    assert runs[1].ns_per_page == pytest.approx(111920.166)
    assert runs[0].faults_per_page == pytest.approx(16385 / 16384)


@pytest.mark.parametrize(
    "text, why",
    [
        (TWO_RUNS.replace("event=done runs=2\n", ""), "no done line: the probe stopped"),
        (TWO_RUNS.split("\n", 1)[1], "one run of two"),
        ("event=error reason=mmap errno=12\n", "an error line"),
        (TWO_RUNS.replace("duration_s=1.834000000", "duration_s=0.000000000"), "an empty run"),
    ],
)
def test_a_probe_that_did_not_finish_its_runs_is_a_guest_error(text, why):
    with pytest.raises(GuestError, match="fault_probe"):
        fault_probe.parse_runs(text, 2)


@pytest.mark.parametrize("icount, settle", [(True, 20), (False, 2)])
def test_the_guest_settles_for_its_clock_before_the_timed_runs(icount, settle):
    shell = AgentShell({"64": TWO_RUNS, "uname": "6.1.0-57-amd64\n"})
    guest = anon.measure_guest(FakeGuest(1, shell), 64, 2, icount)
    assert shell.ran[0] == ["sh", "-c", f"sync; sleep {settle}"]
    assert shell.ran[1] == ["/tmp/fault_probe", "64", "2"]
    assert guest.settle_s == settle and guest.kernel == "6.1.0-57-amd64"
    assert guest.least.index == 1


def test_a_guest_is_one_sample_the_least_of_its_runs():
    slow = anon.AnonGuest(fault_probe.parse_runs(TWO_RUNS, 2), 20, "k")
    quick_text = TWO_RUNS.replace("111938.477", "111000.000").replace("111920.166", "111500.000")
    quick = anon.AnonGuest(fault_probe.parse_runs(quick_text, 2), 20, "k")
    record = anon.record([slow, quick], 64, clock.icount(4))
    assert record.samples == [111920.166, 111000.0]
    assert record.replicates == [[111920.166], [111000.0]]
    assert record.settings["runs_a_guest"] == 2
    assert record.settings["vcpus"] == anon.VCPUS
    assert "guest instructions" in record.extra["reads"]
    with pytest.raises(ValueError):
        anon.record([], 64, clock.icount(4))


@pytest.mark.parametrize("label", ["wall", "icount:4"])
def test_the_record_is_the_row_s_primary_on_either_clock(label):
    assert [p.metric for p in ANON.primaries] == ["ns_per_page"]
    found = primaries.primary_of(anon.SCENARIO, "ns_per_page", {"pages": "4k"}, label)
    assert found is not None and found.margin == FINE_MARGIN and found is ANON.primaries[0]
    spread = found.spread_on(label)
    assert spread is not None and spread.blocks >= 6


def _verdict(rng, n, spread, effect):
    """A paired A/B of fault.anon over ``n`` blocks at the log-scale
    ``spread`` of each side, B ``effect`` times A, judged at the row's
    margin by the real decision code."""
    level = rng.normal(0.0, 0.05, n)
    a = np.exp(level + rng.normal(0.0, spread, n)) * 112_000
    b = np.exp(level + rng.normal(0.0, spread, n)) * 112_000 * effect
    blocks = list(range(n))
    test = ab_tests.ratio_test([[float(x)] for x in a], [[float(x)] for x in b], blocks, blocks)
    margin = primaries.margin(anon.SCENARIO, "ns_per_page", {"pages": "4k"}, "icount:4", 0.05)
    return families.decide([test], [primaries.PRIMARY], ["lower"], threshold=0.05, alpha=0.01, margins=[margin])[1][0]


def _rate(seed, trials, verdicts, **kwargs):
    rng = np.random.default_rng(seed)
    return sum(_verdict(rng, **kwargs) in verdicts for _ in range(trials)) / trials


def _icount_sd() -> float:
    found = primaries.primary_of(anon.SCENARIO, "ns_per_page", {"pages": "4k"}, "icount:4")
    assert found is not None and found.spread_icount is not None
    return found.spread_icount.sd


def test_a_1_percent_change_is_slower_from_three_blocks_at_the_measured_icount_spread():
    """At the icount A/A's spread (each side's share: sd / sqrt 2), B 1 %
    slower is `slower` in nearly every run from 3 blocks, and a 1 % gain
    `faster`."""
    side = max(_icount_sd(), 1e-5) / np.sqrt(2)
    assert _rate(61, 200, {SLOWER}, n=3, spread=side, effect=1.01) >= 0.95
    assert _rate(62, 200, {FASTER}, n=3, spread=side, effect=0.99) >= 0.95


def test_a_change_inside_the_margin_is_not_slower():
    """B 0.2 % slower, inside the half-percent margin: never `slower`."""
    side = max(_icount_sd(), 1e-5) / np.sqrt(2)
    assert _rate(66, 200, {SLOWER}, n=3, spread=side, effect=1.002) == 0.0


def test_no_change_is_equivalent_and_never_slower_at_the_measured_icount_spread():
    side = max(_icount_sd(), 1e-5) / np.sqrt(2)
    assert _rate(63, 200, {EQUIVALENT}, n=3, spread=side, effect=1.0) >= 0.90
    assert _rate(64, 400, {SLOWER, FASTER}, n=3, spread=side, effect=1.0) <= 0.01


def test_at_the_wall_clock_s_spread_the_same_change_is_not_decided():
    """The flip: at the wall clock's measured spread the same 1 % change
    over 3 blocks is not called slower in most runs."""
    found = primaries.primary_of(anon.SCENARIO, "ns_per_page", {"pages": "4k"}, "wall")
    assert found is not None and found.spread_wall is not None
    side = found.spread_wall.sd / np.sqrt(2)
    assert _rate(65, 200, {SLOWER}, n=3, spread=side, effect=1.01) <= 0.5


if __name__ == "__main__":
    # The rates themselves, for docs/fault.md: python tests/fault/test_fault.py 2000
    import sys

    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    icount = max(_icount_sd(), 1e-5) / np.sqrt(2)
    found = primaries.primary_of(anon.SCENARIO, "ns_per_page", {"pages": "4k"}, "wall")
    assert found is not None and found.spread_wall is not None
    wall = found.spread_wall.sd / np.sqrt(2)
    for name, seed, verdicts, spread, effect in (
        ("B 1 % slower -> slower", 61, {SLOWER}, icount, 1.01),
        ("B 1 % faster -> faster", 62, {FASTER}, icount, 0.99),
        ("B = A -> equivalent", 63, {EQUIVALENT}, icount, 1.0),
        ("B = A -> slower or faster", 64, {SLOWER, FASTER}, icount, 1.0),
        ("B 0.2 % slower -> slower", 66, {SLOWER}, icount, 1.002),
        ("wall: B 1 % slower -> slower", 65, {SLOWER}, wall, 1.01),
    ):
        rate = _rate(seed, trials, verdicts, n=3, spread=spread, effect=effect)
        print(f"{name}: {rate:.4f} of {trials} (3 blocks, seed {seed})")
