"""Claims at small n: how often the real verdict code says "the direction
holds" when there is no effect, at every unit count the profiles produce.

Each case runs ``claims.evaluate.evaluate`` on records shaped like the scenario's,
with a fixed seed, and fails when the false directions exceed what a true
rate of 2.5 % gives in 99 % of such runs.  docs/claims-calibration.md."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats as st

from memqual.host.balloon.table import REQUEST_SIZE
from memqual.host.core import profiles
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import DIRECTION_ONLY, MIN_REPLICATES, REPRODUCED, UNDERPOWERED, Claim
from memqual.host.ksm.table import VOLATILE_SCAN

NOMINAL = 0.025
SEED = 20110223


def _claim(cid: str) -> Claim:
    return next(c for c in load() if c.id == cid)


def _records(claim: Claim, a: np.ndarray, b: np.ndarray) -> list[Measurement]:
    m = claim.measure
    assert m.a is not None and m.b is not None
    common = dict(scenario=m.scenario, metric=m.metric, unit=m.unit, better="lower", samples=[], claim=claim.id)
    return [
        Measurement(replicates=a.tolist(), variant=dict(m.a.variant), **common),  # type: ignore[arg-type]  # the dict's values are those fields' types
        Measurement(replicates=b.tolist(), variant=dict(m.b.variant), **common),  # type: ignore[arg-type]  # idem
    ]


def null_trials(claim: Claim, units: int, trials: int, *, tails: str = "normal", seed: int = SEED):
    """The share of trials, with B equal to A, whose verdict CI lies wholly
    above 1, and the share whose verdict says the direction holds.  Each
    unit has its own level (a guest on a host minute, shared by A and B) and
    each side of it its own noise; ``tails="t3"`` draws that noise from
    Student's t with 3 degrees of freedom (one odd guest now and then)."""
    rng = np.random.default_rng(seed)
    per = 2
    level = np.exp(rng.normal(0.0, 0.3, size=(trials, units, 1)))

    def noise() -> np.ndarray:
        if tails == "t3":
            return np.exp(0.08 * rng.standard_t(3, size=(trials, units, per)))
        return np.exp(rng.normal(0.0, 0.1, size=(trials, units, per)))

    # Unpaired, A's and B's units are different guests: each its own level.
    b_level = level if claim.measure.paired else np.exp(rng.normal(0.0, 0.3, size=(trials, units, 1)))
    a, b = 100.0 * level * noise(), 100.0 * b_level * noise()
    above = holds = 0
    for t in range(trials):
        v = evaluate([claim], _records(claim, a[t], b[t]))[0]
        assert v.ci is not None
        above += v.ci[0] > 1.0
        holds += v.verdict in (REPRODUCED, DIRECTION_ONLY)
    return above / trials, holds / trials


def _allowed(trials: int) -> float:
    """The most false directions a true rate of 2.5 % gives in 99 % of runs
    of ``trials``, as a share."""
    return float(st.binom.ppf(0.99, trials, NOMINAL)) / trials


# Every unit count the profiles produce (e2e/test_ksm.py's guests per
# variant, e2e/test_balloon_driver.py's guests; quick and full), each with a
# claim that gets it.  Claims of one family share the verdict code and the
# records' shape, so one of them a count measures both.  An A/B's arm has
# one guest a block: its count is the blocks, 3 (the least a verdict takes)
# and up, which the quick and full counts cover.
CLAIM_PROFILES = (profiles.QUICK, profiles.FULL)
PROFILE_UNITS = {
    **{VOLATILE_SCAN.sizes_for(p).guests: "ksm-volatile-4k" for p in CLAIM_PROFILES},
    **{REQUEST_SIZE.sizes_for(p).guests: "balloon-bitmap" for p in CLAIM_PROFILES},
}


@pytest.mark.parametrize("units, cid", sorted(PROFILE_UNITS.items()))
def test_no_effect_gives_a_direction_at_most_at_the_nominal_rate(units: int, cid: str):
    trials = 2000
    above, holds = null_trials(_claim(cid), units, trials)
    assert above <= _allowed(trials), f"{cid}, {units} units: CI wholly above 1 in {above:.1%}"
    assert holds <= above


def test_heavy_tailed_units_stay_at_the_nominal_rate():
    """Noise with the tails of t(3) at the smallest count a profile gives."""
    trials = 1000
    above, _ = null_trials(
        _claim("balloon-bitmap"), min(REQUEST_SIZE.sizes_for(p).guests for p in CLAIM_PROFILES), trials, tails="t3"
    )
    assert above <= _allowed(trials)


@pytest.mark.parametrize("units", [3, 5])
def test_an_unpaired_claim_stays_at_the_nominal_rate(units: int):
    """The same for a claim whose A and B come from different units
    (Welch's interval of the log unit medians)."""
    claim = _claim("ksm-volatile-4k")
    unpaired = dataclasses.replace(claim, measure=dataclasses.replace(claim.measure, paired=False))
    trials = 600
    above, _ = null_trials(unpaired, units, trials, seed=SEED + units)
    assert above <= _allowed(trials)


def test_a_unit_count_that_cannot_decide_is_underpowered_with_the_count_it_needs():
    claim = _claim("ksm-volatile-4k")
    rng = np.random.default_rng(1)
    a = 10.0 * np.exp(rng.normal(0, 0.01, size=(2, 2)))
    v = evaluate([claim], _records(claim, a, a * 8.0))[0]
    assert v.verdict == UNDERPOWERED and v.replicates_needed == MIN_REPLICATES
    assert f"at least {MIN_REPLICATES} independent units" in v.reason


def test_an_effect_the_units_cannot_establish_says_how_many_would():
    """A real 10 % effect on 3 units with a 10 % spread: not established,
    with the units a side that this spread would need."""
    claim = _claim("balloon-bitmap")
    rng = np.random.default_rng(4)
    a = 100.0 * np.exp(rng.normal(0, 0.3, size=(3, 1)))
    b = a * 1.1 * np.exp(rng.normal(0, 0.1, size=(3, 1)))
    v = evaluate([claim], _records(claim, a, b))[0]
    if v.ci is not None and v.ci[0] <= 1.0 and v.ratio is not None and v.ratio > 1.0:
        assert v.replicates_needed is not None and v.replicates_needed > 3
        assert f"about {v.replicates_needed} units a side would establish" in v.reason
    else:  # the seed gave an established or reversed effect: the hint must be absent
        assert "would establish" not in v.reason
