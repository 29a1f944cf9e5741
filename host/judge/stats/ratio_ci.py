"""B / A from a few independent units: t-intervals on log ratios.

Paired (one log ratio per unit, a one-sample t-interval) or unpaired
(Welch's interval on the units' log medians), each the t of
``ab_tests.ratio_test`` on the units' medians (a unit's samples enter
only through its median), with the units a side an effect would need.
Why not a bootstrap of 3 to 8 units, and when the interval holds its
rate: docs/claims-calibration.md, "Why t-intervals on log ratios".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st

from memqual.host.judge.stats import ab_tests
from memqual.host.judge.stats.intervals import CONFIDENCE


@functools.lru_cache(maxsize=256)
def t_quantile(df: float) -> float:
    """The two-sided 95 % quantile of Student's t (cached: the calibration
    asks for the same few thousands of times)."""
    return float(_st.t.ppf(0.5 + CONFIDENCE / 2, df))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean of independent units;
    NaN bounds for a single unit."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class RatioInterval:
    """B / A with its t-interval, and how it was made."""

    ratio: float
    low: float
    high: float
    units_a: int
    units_b: int
    df: float  # degrees of freedom of the t quantile
    spread: float  # standard error of the log ratio
    method: str

    def units_needed(self, *, limit: int = 64) -> int | None:
        """With the spread measured here, the smallest number of units a
        side whose interval would exclude 1 at this ratio (None when the
        ratio is 1, or more than ``limit`` would be needed).  A planning
        figure from the observed spread, not a promise."""
        effect = abs(math.log(self.ratio)) if self.ratio > 0 and math.isfinite(self.ratio) else 0.0
        if effect == 0.0 or not math.isfinite(self.spread):
            return None
        n_now = min(self.units_a, self.units_b)
        per_unit = self.spread * math.sqrt(n_now)  # the spread of one unit's log ratio
        if per_unit == 0.0:
            return n_now
        for n in range(2, limit + 1):
            if t_quantile(n - 1) * per_unit / math.sqrt(n) < effect:
                return n
        return None


def _unit_medians(reps: Sequence[Sequence[float]]) -> np.ndarray:
    values = np.array([float(np.median(r)) for r in reps if len(r)])
    if values.size == 0:
        raise ValueError("need at least one unit with samples")
    if np.any(values <= 0.0):
        raise ValueError("a log ratio needs positive figures")
    return values


def _interval(point: float, se: float, df: float, *, units: tuple[int, int], method: str) -> RatioInterval:
    if se == 0.0:
        low = high = point
    else:
        q = t_quantile(df)
        low, high = point - q * se, point + q * se
    return RatioInterval(
        ratio=math.exp(point),
        low=math.exp(low),
        high=math.exp(high),
        units_a=units[0],
        units_b=units[1],
        df=df,
        spread=se,
        method=method,
    )


def paired_log_ratio(a_reps: Sequence[Sequence[float]], b_reps: Sequence[Sequence[float]]) -> RatioInterval:
    """Unit i measured A (``a_reps[i]``) and B (``b_reps[i]``): the
    one-sample t-interval of the per-unit log ratios, back on the ratio
    scale.  Needs 2 units or more."""
    if len(a_reps) != len(b_reps):
        raise ValueError("a paired design needs A and B from every unit")
    ma, mb = _unit_medians(a_reps), _unit_medians(b_reps)
    n = ma.size
    if mb.size != n:
        raise ValueError("a paired design needs A and B from every unit")
    if n < 2:
        raise ValueError("a t-interval needs at least 2 units")
    # The A/B decisions' paired test with each unit its own block: the same
    # t on the same log ratios, made once.
    units = list(range(n))
    test = ab_tests.ratio_test([[x] for x in ma], [[x] for x in mb], units, units)
    return _interval(
        test.estimate,
        test.se,
        test.df,
        units=(n, n),
        method=f"paired t-interval of {n} per-unit log ratios ({n - 1} df)",
    )


def welch_log_ratio(a_reps: Sequence[Sequence[float]], b_reps: Sequence[Sequence[float]]) -> RatioInterval:
    """A and B from different units: Welch's t-interval of the difference of
    the mean log unit medians, back on the ratio scale.  Needs 2 units a
    side or more."""
    ma, mb = _unit_medians(a_reps), _unit_medians(b_reps)
    na, nb = ma.size, mb.size
    if min(na, nb) < 2:
        raise ValueError("a t-interval needs at least 2 units a side")
    # The A/B decisions' unpaired test (Welch-Satterthwaite df): the same t
    # on the same log unit medians, made once.
    test = ab_tests.ratio_test([[x] for x in ma], [[x] for x in mb])
    return _interval(
        test.estimate,
        test.se,
        test.df,
        units=(na, nb),
        method=f"Welch t-interval of log unit medians ({na}+{nb} units, {test.df:.1f} df)",
    )
