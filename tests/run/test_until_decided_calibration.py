"""--until-decided's error rates and what its futility rule buys, measured
on synthetic truth through the real run loop (run/ab_run.py
add_blocks_until_decided), the real Tracker (spending on the budget's
clock, freezing, futility) and the real per-metric decision
(families.decide and metric_stats, what compare_runs runs per
metric).  Only the clock, the jobs and the records' merging are
simulated: a block of a scenario costs its seconds and draws its values.
Fixed seeds.  pytest runs a bounded subset (some 5 s): each rate's
binomial 95 % interval must hold the full run's figure, and that figure
its target.  ``tox -e calibrate`` (MEMQUAL_CALIBRATION_SCALE set) runs the
docs' trials and the comparisons between rules; the figures are in
docs/ab-calibration.md."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import types
from collections import defaultdict

import numpy as np
import pytest
from rich.console import Console

from memqual.host.core.record import Measurement
from memqual.host.judge import comparison, families, primaries
from memqual.host.judge import until_decided as until
from memqual.host.judge.stats import ab_tests
from memqual.host.judge.verdicts import EQUIVALENT, FASTER, SLOWER, UNDECIDED
from memqual.host.run import ab_run, calibrate

ALPHA, THRESHOLD = 0.01, 0.05
# `tox -e calibrate` runs these at the docs' trials (docs/ab-calibration.md):
# MEMQUAL_CALIBRATION_SCALE times each test's base runs.  Unset, pytest runs
# the bounded subset.
SCALE = float(os.environ.get("MEMQUAL_CALIBRATION_SCALE", "0"))
CALIBRATING = SCALE > 0
# The full run's rates (tox -e calibrate, scale 1; docs/ab-calibration.md).
FULL = {"A/A": 0 / 300, "6 % worse: equivalent": 0 / 200, "floor": 12 / 60}
CALIBRATION_ONLY = pytest.mark.skipif(
    not CALIBRATING, reason="a comparison of rules at the docs' trials: tox -e calibrate runs it"
)


def runs_of(base: int, subset: int) -> int:
    """The runs a test takes: its base times the scale when calibrating,
    the bounded subset under plain pytest."""
    return int(base * SCALE) if CALIBRATING else subset


def holds(rate: calibrate.Rate, full: float) -> None:
    """The subset's 95 % interval holds the full run's rate."""
    low, high = rate.interval()
    assert low <= full <= high, rate.line()


BUDGET_S = 25 * 60.0
ONCE_S = 200.0  # the once-per-arm checks, after the last look: kept from the budget

# Ten scenarios, one primary each, shaped on the 6.1/6.12 run here: the sd
# of a block's log(B / A) and a block's seconds (A + B).  Four are near
# deterministic (counts, fractions), six are TCG timings and sizes.
SD = (0.0005, 0.0005, 0.001, 0.002, 0.044, 0.071, 0.045, 0.058, 0.066, 0.074)
COST_S = (24.0, 22.0, 40.0, 20.0, 30.0, 26.0, 20.0, 36.0, 50.0, 30.0)
FLOOR = 5  # the scenario of sd 0.071: a floor-like primary
JOB_S = 10.0  # a job's own cost beyond its tests and the look after it (3-23 s measured)


@dataclasses.dataclass
class SimulatedRun:
    """The clock, the jobs and the records of one until-decided run."""

    rng: np.random.Generator
    effects: tuple[float, ...]
    clock: float = 0.0
    state: ab_run.BlockedRun = dataclasses.field(default_factory=ab_run.BlockedRun)

    def name(self, i: int) -> str:
        return f"e2e/test_sim.py:Sim.test_s{i}"

    def block(self, number: int, scenarios: list[int]) -> None:
        drift = self.rng.normal(0.0, 0.05)  # the host, shared by A and B of a block
        for i in scenarios:
            noise = self.rng.normal(0.0, SD[i] / math.sqrt(2), 2)
            for arm, factor, e in (("A", 1.0, noise[0]), ("B", self.effects[i], noise[1])):
                value = float((1.0 + i) * factor * math.exp(drift + e))
                self.state.records.append(
                    Measurement(
                        scenario=f"sim.s{i}",
                        metric="m",
                        unit="s",
                        better="lower",
                        samples=[value],
                        blocks=[number],
                        arm=arm,
                    )
                )
            self.state.test_seconds.setdefault(self.name(i), []).extend([COST_S[i] / 2] * 2)
            self.state.scenario_tests.setdefault(f"sim.s{i}", set()).add(self.name(i))
        self.clock += sum(COST_S[i] for i in scenarios) + JOB_S

    def job(self, selection: str, first: int, count: int, references: tuple[str, ...] = ()) -> None:
        wanted = [i for i in range(len(SD)) if self.name(i) + "$" in references]
        for number in range(first, first + count):
            self.block(number, wanted)


def fast_comparisons(records_a, records_b, *, threshold, alpha, sequential=None):
    """What until.compare_so_far gives, without merging records into a results
    file: one paired ratio test a scenario, decided as compare_runs
    decides (Holm over the primaries, TOST)."""
    by: defaultdict[str, tuple[dict[int, float], dict[int, float]]] = defaultdict(lambda: ({}, {}))
    for side, records in ((0, records_a), (1, records_b)):
        for m in records:
            by[m.scenario][side][m.blocks[0]] = m.samples[0]
    keys = sorted(by)
    tests, reps = [], []
    for k in keys:
        a, b = by[k]
        blocks = sorted(set(a) & set(b))
        ra, rb = [[a[n]] for n in blocks], [[b[n]] for n in blocks]
        tests.append(ab_tests.ratio_test(ra, rb, blocks, blocks))
        reps.append((ra, rb))
    roles = [primaries.PRIMARY] * len(keys)
    given = [sequential(k, t) for k, t in zip(keys, tests, strict=True)] if sequential else [None] * len(keys)
    decided, verdicts = families.decide(
        tests, roles, ["lower"] * len(keys), threshold=threshold, alpha=alpha, sequential=given
    )
    return [
        comparison.MetricComparison(
            key=k,
            scenario=k,
            metric="m",
            unit="s",
            better="lower",
            comparison=families.metric_stats(t, ra, rb, d, v, threshold=threshold, sequential=g),
            verdict=v,
            role=primaries.PRIMARY,
        )
        for k, t, (ra, rb), d, v, g in zip(keys, tests, reps, decided, verdicts, given, strict=True)
    ]


def simulate(monkeypatch, tmp_path, rng, effects, futility=True, group_sequential=True) -> dict[str, str]:
    """One run: blocks 1-2 of every scenario, then the real loop with the
    once-per-arm checks' time kept from the budget (they run after it);
    the frozen verdict of every primary.  ``group_sequential``
    False: each look at its own share of alpha (Bonferroni over the
    looks), the rule before the boundaries used the looks' correlation."""
    run = SimulatedRun(rng, effects)
    run.clock = 0.0
    run.block(1, list(range(len(SD))))
    run.block(2, list(range(len(SD))))
    run.clock -= JOB_S  # blocks 1-2 are one job
    run.state.blocks = 2
    tracker = until.Tracker(threshold=THRESHOLD, alpha=ALPHA, group_sequential=group_sequential)
    if not futility:
        monkeypatch.setattr(until, "FUTILITY_MARGIN", math.inf)
    monkeypatch.setattr(ab_run, "make_tracker", lambda config=None: tracker)
    monkeypatch.setattr(until, "compare_so_far", fast_comparisons)
    monkeypatch.setattr(ab_run.time, "monotonic", lambda: run.clock)
    config = types.SimpleNamespace(budget_min=BUDGET_S / 60.0, output=tmp_path)
    ab_run.add_blocks_until_decided(config, run.state, run.job, 0.0, Console(file=io.StringIO()), reserve_s=ONCE_S)  # type: ignore[arg-type]  # a namespace with the two fields the loop reads
    monkeypatch.undo()
    return {m.scenario: (m.frozen or UNDECIDED) for m in tracker.metrics.values()}


def test_no_effect_flags_a_primary_in_at_most_alpha_of_runs(monkeypatch, tmp_path):
    """A/A: looks on the budget's clock, futility, freezing: the share of
    runs in which any of the ten primaries comes out slower or faster."""
    rng = np.random.default_rng(31)
    runs = runs_of(300, 24)
    flagged = 0
    for _ in range(runs):
        verdicts = simulate(monkeypatch, tmp_path, rng, (1.0,) * len(SD))
        flagged += any(v in (SLOWER, FASTER) for v in verdicts.values())
    rate = calibrate.Rate("until-decided loop, A/A, 10 primaries: any slower or faster", flagged, runs, 31)
    print(rate.line())
    holds(rate, FULL["A/A"])
    assert FULL["A/A"] <= ALPHA and (not CALIBRATING or rate.rate <= ALPHA)


def test_a_change_beyond_the_threshold_is_not_called_equivalent(monkeypatch, tmp_path):
    """B 6 % worse on every primary (beyond the 5 % band): `equivalent`
    would be wrong, in at most alpha of runs."""
    rng = np.random.default_rng(32)
    runs = runs_of(200, 16)
    wrong = 0
    for _ in range(runs):
        verdicts = simulate(monkeypatch, tmp_path, rng, (1.06,) * len(SD))
        wrong += any(v == EQUIVALENT for v in verdicts.values())
    rate = calibrate.Rate("until-decided loop, B 6 % worse: any equivalent", wrong, runs, 32)
    print(rate.line())
    holds(rate, FULL["6 % worse: equivalent"])
    assert FULL["6 % worse: equivalent"] <= ALPHA and (not CALIBRATING or rate.rate <= ALPHA)


_FLOOR_RUNS: dict[tuple[bool, bool], tuple[float, float]] = {}


def _floor_runs(
    monkeypatch, tmp_path, futility: bool, group_sequential: bool = True, runs: int = 0
) -> tuple[float, float]:
    """The share of runs that find the floor-like change (60 times the
    scale), and the mean primaries decided a run (the same seed for every
    rule, and kept: two tests share the group-sequential runs with
    futility)."""
    if (futility, group_sequential) not in _FLOOR_RUNS:
        runs = runs or runs_of(60, 0)
        rng = np.random.default_rng(33)
        effects = tuple(0.92 if i == FLOOR else 1.0 for i in range(len(SD)))
        found = decided = 0
        for _ in range(runs):
            verdicts = simulate(
                monkeypatch, tmp_path, rng, effects, futility=futility, group_sequential=group_sequential
            )
            found += verdicts.get(f"sim.s{FLOOR}") == FASTER
            decided += sum(v != UNDECIDED for v in verdicts.values())
        rule = f"futility {futility}, group-sequential {group_sequential}"
        print(calibrate.Rate(f"until-decided loop, floor-like 8 % lower, {rule}: found", found, runs, 33).line())
        _FLOOR_RUNS[futility, group_sequential] = (found / runs, decided / runs)
    return _FLOOR_RUNS[futility, group_sequential]


def test_the_floor_like_change_is_found_at_the_full_runs_rate(monkeypatch, tmp_path):
    """A bounded subset of the floor-like runs below (futility, the
    boundaries): its interval holds the full run's rate."""
    runs = runs_of(60, 12)
    found, decided = _floor_runs(monkeypatch, tmp_path, True, runs=runs)
    holds(calibrate.Rate("floor found", round(found * runs), runs, 33), FULL["floor"])
    assert decided >= 4.0  # the four near-deterministic primaries at least


@CALIBRATION_ONLY
def test_futility_spends_the_budget_where_a_decision_can_come(monkeypatch, tmp_path):
    """A floor-like primary (block sd 0.071, 26 s a block) 8 % lower on B,
    five other TCG-like primaries unchanged and too noisy to decide in the
    budget: leaving those out gives the floor the blocks, and it is found
    more often than when every undecided scenario keeps running."""
    with_futility = _floor_runs(monkeypatch, tmp_path, True)
    without = _floor_runs(monkeypatch, tmp_path, False)
    print(f"floor found, primaries decided: with futility {with_futility}, without {without}")
    assert with_futility[0] > without[0]
    assert with_futility[1] >= 4.0 and without[1] >= 4.0  # the four near-deterministic ones at least


@CALIBRATION_ONLY
def test_boundaries_from_8_blocks_find_about_what_bonferroni_finds(monkeypatch, tmp_path):
    """The same floor-like change, the same draws: each metric's boundaries
    from its looks' correlation (group_sequential.py, from 8 blocks on)
    against each look tested at its own share of alpha (Bonferroni over
    the looks).  Below 8 blocks both test at the plain share, and a
    25-minute budget gives the floor few looks past 8: neither finds the
    change measurably more often (at 4x these trials, 17.1 % against
    20.8 % of 240 runs), but both find it, and each rate lies in the
    other's 95 % interval."""
    sequential = _floor_runs(monkeypatch, tmp_path, True)
    bonferroni = _floor_runs(monkeypatch, tmp_path, True, group_sequential=False)
    print(f"floor found, primaries decided: group-sequential {sequential}, Bonferroni over the looks {bonferroni}")
    runs = runs_of(60, 0)
    for rate, other in ((sequential[0], bonferroni[0]), (bonferroni[0], sequential[0])):
        low, high = calibrate.Rate("floor", round(rate * runs), runs, 33).interval()
        assert low <= other <= high and rate > 0.0
