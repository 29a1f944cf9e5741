"""The bisect's error rates, measured on synthetic truth through the real
bisect (run.Bisector: its probes, looks, alpha spending, budget and
search; bisect_evidence.evidence_of: compare's decision of one metric).  A fake
runner stands in for avocado: each step is one job of one block, K1 (arm
A) and the probe (arm B), each one replicate of 3 samples.  Fixed seeds,
bounded trials; the figures are in docs/ab-calibration.md and
docs/bisect-history-export.md."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from memqual.host.core import record
from memqual.host.judge import bisect_evidence
from memqual.host.run import blocks
from memqual.host.run.bisect import run, series

KERNELS = 8
SPREAD = 0.03 / math.sqrt(2)  # each replicate's log-normal spread, either arm: B/A of a block spreads 3 %
DRIFT = 0.10  # the host's level from block to block, shared by both arms of a block
STEP = 1.10  # the injected step: 10 % slower from the first bad kernel on
STEP_S = 120.0  # simulated seconds a job (one block of K1 and the probe)


@dataclasses.dataclass
class Truth:
    """What the fake avocado measures: kernel index >= ``first_bad`` is
    ``effect`` times slower; None: no step anywhere."""

    first_bad: int | None
    rng: np.random.Generator
    effect: float = STEP
    spread: float = SPREAD
    now: float = 0.0
    jobs: int = 0

    def clock(self) -> float:
        return self.now

    def __call__(self, arms, first, count, directory):
        records = []
        self.jobs += 1
        # One block a job: both arms at the host's level of that block.
        level = math.exp(self.rng.normal(0.0, DRIFT))
        for block, arm in blocks.block_order(first, count):
            if arm not in arms:
                continue
            index = int(arms[arm].cmdline_extra.rsplit("=", 1)[1])
            bad = self.first_bad is not None and index >= self.first_bad
            value = level * (self.effect if bad else 1.0) * math.exp(self.rng.normal(0.0, self.spread))
            samples = [value * math.exp(e) for e in self.rng.normal(0.0, 0.01, 3)]
            m = record.Measurement(
                scenario="balloon.deflate", metric="deflate_s", unit="s", better="lower", samples=samples
            )
            blocks.stamp(m, arm, block)
            records.append(m)
        self.now += STEP_S
        return records, "PASS 1", 0, str(directory)


def _bisect(tmp: Path, truth: Truth, max_rounds: int = 10) -> run.Bisector:
    """The defaults of memqual bisect (threshold 5 %, alpha 5 %, 10 blocks
    a probe); the budget (60 simulated minutes, 30 steps) never binds
    before --max-rounds."""
    kernels = tuple(series.KernelSpec("6.1.0-57-amd64", f"memqual.k={i}") for i in range(KERNELS))
    settings = run.Settings(kernels=kernels, metric="deflate_s", threshold=0.05, budget_min=60.0, max_rounds=max_rounds)
    return run.Bisector(settings, tmp, truth, say=lambda line: None, clock=truth.clock)


@dataclasses.dataclass
class Rates:
    trials: int
    right: int = 0  # the first bad kernel named, and it is the true one
    culprit: int = 0  # a kernel (or a range) named as the first bad
    undecided: int = 0  # a probe skipped undecided
    blocks: list[int] = dataclasses.field(default_factory=list)  # per bisect, all probes
    blocks_per_probe: list[int] = dataclasses.field(default_factory=list)

    def share(self, n: int) -> float:
        return n / self.trials


def measure(tmp: Path, trials: int, step: bool, seed: int, spread: float = SPREAD, max_rounds: int = 10) -> Rates:
    rng = np.random.default_rng(seed)
    rates = Rates(trials)
    for t in range(trials):
        first_bad = int(rng.integers(1, KERNELS)) if step else None
        truth = Truth(first_bad, rng, spread=spread)
        b = _bisect(tmp / f"t{t}", truth, max_rounds)
        outcome = b.run()
        rates.culprit += outcome.kind in ("first bad", "range")
        rates.right += outcome.kind == "first bad" and outcome.first_bad == first_bad
        rates.undecided += any(not p.evidence.decided for p in b.probes.values())
        rates.blocks.append(truth.jobs)
        rates.blocks_per_probe += [p.rounds for p in b.probes.values()]
    return rates


@pytest.fixture
def quiet(monkeypatch):
    """Neither bisect.json nor the page after every step: thousands of
    steps here, and neither file is part of a decision."""
    monkeypatch.setattr(run.Bisector, "save", lambda self: None)


def test_no_step_points_at_a_culprit_in_at_most_alpha_of_bisects(tmp_path, quiet):
    rates = measure(tmp_path, 200, step=False, seed=31)
    assert rates.share(rates.culprit) <= bisect_evidence.PROBE_ALPHA, rates.culprit


def test_a_10_percent_step_is_found_at_the_right_kernel_in_80_percent_of_bisects(tmp_path, quiet):
    rates = measure(tmp_path, 100, step=True, seed=32)
    assert rates.share(rates.right) >= 0.80, (rates.right, rates.undecided)
    # Never a wrong kernel named as the first bad with confidence: a miss
    # is a skipped (undecided) probe and a range that holds the right one.
    assert rates.culprit - rates.right <= rates.undecided
