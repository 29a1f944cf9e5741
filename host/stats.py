"""Statistics of repeated measurements: location, spread, A/B comparison.

Everything the claims and the report say about a metric comes from here, so
the choices are written down once:

- Location is the **median** (robust to the odd slow repeat a shared 2-core
  machine produces); the mean and standard deviation are kept too, because the
  seed's kernbench table reports "mean (stdev)".
- Spread is the interquartile range and the median absolute deviation; the
  coefficient of variation is stdev / |mean|.
- The A/B effect is the **ratio of medians** B / A.  Its confidence interval
  is a seeded percentile bootstrap (``scipy.stats.bootstrap``, independent
  resampling of A and B).  Percentile rather than BCa: with 5 repeats BCa
  often degenerates (NaN with a warning) and a qualification report must not
  flip on that.
- Significance is a permutation test of the **difference of means**, as
  Firecracker's A/B tool does (tests/framework/ab_test.py): with n <= 8 per
  side scipy enumerates every permutation, so the p-value is exact and
  deterministic.  A change counts only when p < alpha *and* the relative
  change of the medians is at least ``min_effect`` (a real but tiny shift is
  not worth a verdict).

Every random choice is seeded: the same samples give the same report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as _st

DEFAULT_SEED = 20110223  # the date of seed 000; any fixed value works
DEFAULT_RESAMPLES = 9999
DEFAULT_CONFIDENCE = 0.95
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.05


def _array(samples: Sequence[float]) -> np.ndarray:
    arr = np.asarray(list(samples), dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need at least one sample")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite numbers")
    return arr


def median(samples: Sequence[float]) -> float:
    return float(np.median(_array(samples)))


def iqr(samples: Sequence[float]) -> float:
    """Interquartile range (linear interpolation between order statistics)."""
    q1, q3 = np.percentile(_array(samples), [25, 75])
    return float(q3 - q1)


def mad(samples: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    arr = _array(samples)
    return float(np.median(np.abs(arr - np.median(arr))))


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample stdev / |mean|; NaN for a zero mean,
    0 for a single sample."""
    arr = _array(samples)
    if arr.size < 2:
        return 0.0
    mean = float(np.mean(arr))
    if mean == 0.0:
        return math.nan
    return float(np.std(arr, ddof=1) / abs(mean))


@dataclasses.dataclass(frozen=True)
class Summary:
    """Location and spread of one sample set."""

    n: int
    median: float
    mean: float
    stdev: float  # sample standard deviation (ddof=1); 0 for n == 1
    iqr: float
    mad: float
    cv: float
    minimum: float
    maximum: float

    def to_json(self) -> dict[str, Any]:
        return {k: _finite_or_none(v) for k, v in dataclasses.asdict(self).items()}


def summarize(samples: Sequence[float]) -> Summary:
    arr = _array(samples)
    return Summary(
        n=int(arr.size),
        median=float(np.median(arr)),
        mean=float(np.mean(arr)),
        stdev=float(np.std(arr, ddof=1)) if arr.size > 1 else 0.0,
        iqr=iqr(arr),
        mad=mad(arr),
        cv=cv(arr),
        minimum=float(arr.min()),
        maximum=float(arr.max()),
    )


def ratio_of_medians(a: Sequence[float], b: Sequence[float]) -> float:
    """median(B) / median(A); inf when A's median is 0 and B's is not."""
    ma, mb = median(a), median(b)
    if ma == 0.0:
        return math.nan if mb == 0.0 else math.copysign(math.inf, mb)
    return mb / ma


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(B) / median(A), A and B resampled
    independently.  With no variation in either sample the interval is the
    point itself; with a single sample on one side it still reflects the
    other side's spread.  NaN bounds when A's median can be zero."""
    arr_a, arr_b = _array(a), _array(b)
    point = ratio_of_medians(arr_a, arr_b)
    if np.ptp(arr_a) == 0.0 and np.ptp(arr_b) == 0.0:
        return (point, point)
    if np.any(arr_a == 0.0) and np.median(arr_a) == 0.0:
        return (math.nan, math.nan)

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.median(y, axis=axis) / np.median(x, axis=axis)

    # scipy refuses one-element samples; resampling a single value is the
    # value itself, so repeat it (the bootstrap then varies only the other).
    xa = arr_a if arr_a.size > 1 else np.repeat(arr_a, 2)
    xb = arr_b if arr_b.size > 1 else np.repeat(arr_b, 2)
    res = _st.bootstrap(
        (xa, xb),
        statistic,
        n_resamples=n_resamples,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (low, high)


def permutation_pvalue(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> float:
    """Two-sided permutation test of mean(B) - mean(A) (Firecracker's choice).
    Exact when the number of distinct permutations is at most n_resamples."""
    arr_a, arr_b = _array(a), _array(b)
    if np.ptp(np.concatenate([arr_a, arr_b])) == 0.0:
        return 1.0  # all values equal: no evidence of any difference
    if arr_a.size < 2 or arr_b.size < 2:
        return 1.0  # one repeat has no spread to test against: no evidence

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(y, axis=axis) - np.mean(x, axis=axis)

    res = _st.permutation_test(
        (arr_a, arr_b),
        statistic,
        permutation_type="independent",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(min(1.0, res.pvalue))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A against B: B's median over A's, its CI, and whether the change is
    real (p < alpha) and big enough (relative change >= min_effect)."""

    a: Summary
    b: Summary
    ratio: float  # median(B) / median(A)
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    alpha: float
    min_effect: float

    @property
    def relative_change(self) -> float:
        return self.ratio - 1.0

    @property
    def significant(self) -> bool:
        """p below alpha and the effect at least min_effect: the
        Firecracker rule for calling an A/B difference real."""
        return (
            math.isfinite(self.ratio)
            and self.p_value < self.alpha
            and abs(self.relative_change) >= self.min_effect
        )

    @property
    def direction(self) -> int:
        """+1 when B is significantly larger, -1 when smaller, 0 otherwise."""
        if not self.significant:
            return 0
        return 1 if self.ratio > 1.0 else -1

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratio": _finite_or_none(self.ratio),
            "ci": [_finite_or_none(self.ci_low), _finite_or_none(self.ci_high)],
            "confidence": self.confidence,
            "p_value": self.p_value,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "significant": self.significant,
        }


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Everything about A against B in one object."""
    low, high = bootstrap_ratio_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Comparison(
        a=summarize(a),
        b=summarize(b),
        ratio=ratio_of_medians(a, b),
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        p_value=permutation_pvalue(a, b, n_resamples=n_resamples, seed=seed),
        alpha=alpha,
        min_effect=min_effect,
    )


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
