"""Statistics of repeated measurements: location and spread (the median
first), the ratio of pooled medians with its seeded two-stage bootstrap
interval, permutation tests on replicate medians with their power floor,
and Holm.  Inference only on independent replicates (a fresh guest or a
round).  docs/claims-and-report.md ("Statistics") gives the choices and why.
Every random choice is seeded; no I/O.  The A/B decision tests are
ab_tests.py's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

# Samples as callers hold them: a list, or an array this module made.
Samples: TypeAlias = Sequence[float] | np.ndarray

DEFAULT_SEED = 20110223  # the date of seed 000; any fixed value works
DEFAULT_RESAMPLES = 9999
# Permutations of replicate medians are cheap (a few numbers each), so the
# budget is large enough to enumerate every split up to 10 against 10
# (184756): a Monte Carlo p near a Holm-corrected level would otherwise
# decide a verdict by its own sampling noise.
DEFAULT_PERMUTATIONS = 200_000
# Every interval of the suite is a 95 % one: the pages and tables print
# "95% CI", so the level is fixed here rather than a knob that would make
# them wrong.
CONFIDENCE = 0.95
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.05


def _array(samples: Samples) -> np.ndarray:
    arr = np.asarray(list(samples), dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need at least one sample")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite numbers")
    return arr


def median(samples: Samples) -> float:
    return float(np.median(_array(samples)))


def iqr(samples: Samples) -> float:
    """Interquartile range (linear interpolation between order statistics)."""
    q1, q3 = np.percentile(_array(samples), [25, 75])
    return float(q3 - q1)


def mad(samples: Samples) -> float:
    """Median absolute deviation from the median (unscaled)."""
    arr = _array(samples)
    return float(np.median(np.abs(arr - np.median(arr))))


def cv(samples: Samples) -> float:
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


def summarize(samples: Samples) -> Summary:
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


def ratio_of_medians(a: Samples, b: Samples) -> float:
    """median(B) / median(A); inf when A's median is 0 and B's is not."""
    ma, mb = median(a), median(b)
    if ma == 0.0:
        return math.nan if mb == 0.0 else math.copysign(math.inf, mb)
    return mb / ma


def bootstrap_ratio_ci(
    a: Samples,
    b: Samples,
    *,
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
    # Imported here: scipy.stats costs 0.5-1.5 s to import, paid by every
    # e2e test that records a measurement, when only a report's CIs use it.
    from scipy import stats as scipy_stats

    res = scipy_stats.bootstrap(
        (xa, xb),
        statistic,
        n_resamples=n_resamples,
        vectorized=True,
        paired=False,
        confidence_level=CONFIDENCE,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (low, high)


@dataclasses.dataclass(frozen=True)
class PermutationResult:
    """A two-sided permutation test and how it was computed."""

    p_value: float
    exact: bool  # every arrangement enumerated (else Monte Carlo)
    n_arrangements: int  # C(na + nb, na)
    n_resamples: int  # arrangements evaluated: all of them when exact

    @property
    def method(self) -> str:
        if self.exact:
            return f"exact ({self.n_arrangements} arrangements)"
        return f"Monte Carlo ({self.n_resamples} of {self.n_arrangements} arrangements)"


def permutation_test(
    a: Samples,
    b: Samples,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> PermutationResult:
    """Two-sided permutation test of mean(B) - mean(A) on the values given.

    Exact when C(na + nb, na) <= n_resamples: every split of the pooled
    values into groups of na and nb is enumerated (itertools.combinations)
    and p is the share at least as extreme as the observed one.  Otherwise
    n_resamples random splits, and p = (1 + hits) / (1 + n_resamples), so a
    Monte Carlo p is never 0 (Phipson and Smyth 2010)."""
    arr_a, arr_b = _array(a), _array(b)
    na, nb = arr_a.size, arr_b.size
    pooled = np.concatenate([arr_a, arr_b])
    total = math.comb(na + nb, na)
    if np.ptp(pooled) == 0.0:
        # All values equal: no evidence of any difference.
        return PermutationResult(1.0, True, total, total)
    observed = abs(float(arr_b.mean() - arr_a.mean()))
    # Ties in floating point: an arrangement as extreme as the observed one
    # must count even if its sums round differently.
    tolerance = 1e-12 * max(1.0, float(np.max(np.abs(pooled)))) * (na + nb)
    grand = float(pooled.sum())
    if total <= n_resamples:
        idx = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(na + nb), na)),
            dtype=np.intp,
            count=total * na,
        ).reshape(total, na)
        sum_a = pooled[idx].sum(axis=1)
        stat = np.abs((grand - sum_a) / nb - sum_a / na)
        hits = int(np.count_nonzero(stat >= observed - tolerance))
        return PermutationResult(float(min(1.0, hits / total)), True, total, total)
    rng = np.random.default_rng(seed)
    hits = 0
    done = 0
    chunk = max(1, 2_000_000 // (na + nb))  # bound the memory of one batch
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        perm = rng.permuted(np.broadcast_to(pooled, (size, na + nb)), axis=1)
        sum_a = perm[:, :na].sum(axis=1)
        stat = np.abs((grand - sum_a) / nb - sum_a / na)
        hits += int(np.count_nonzero(stat >= observed - tolerance))
        done += size
    return PermutationResult(float(min(1.0, (1 + hits) / (1 + n_resamples))), False, total, n_resamples)


def _replicates(reps: Sequence[Samples]) -> list[np.ndarray]:
    groups = [_array(r) for r in reps if len(r)]
    if not groups:
        raise ValueError("need at least one replicate with samples")
    return groups


def replicate_medians(reps: Sequence[Samples]) -> list[float]:
    """One summary per independent unit: its median."""
    return [float(np.median(g)) for g in _replicates(reps)]


def replicate_permutation_test(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    *,
    n_resamples: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> PermutationResult:
    """The permutation test on replicate medians: the units that were
    independently drawn are what is permuted, never the samples nested in
    them."""
    return permutation_test(replicate_medians(a_reps), replicate_medians(b_reps), n_resamples=n_resamples, seed=seed)


def min_attainable_p(na: int, nb: int, n_resamples: int | None = None) -> float:
    """The smallest two-sided p a permutation test of na against nb units
    can give, with distinct values.  Exact: 2 / C(na + nb, na) for equal
    sizes (the observed split and its mirror are equally extreme), and
    1 / C(na + nb, na) for unequal ones (no mirror split exists).  With a
    budget smaller than the arrangements the test is Monte Carlo, whose
    floor is 1 / (n_resamples + 1)."""
    if na < 1 or nb < 1:
        return 1.0
    total = math.comb(na + nb, na)
    if n_resamples is not None and total > n_resamples:
        return 1.0 / (n_resamples + 1)
    return min(1.0, (2.0 if na == nb else 1.0) / total)


def replicates_needed(alpha_eff: float, *, limit: int = 64) -> int | None:
    """The smallest n such that n replicates a side have an exact floor
    ``min_attainable_p(n, n)`` below alpha_eff: fewer can never be
    significant at that level.  None when alpha_eff is so small that even
    ``limit`` a side would not do (or not positive)."""
    if not alpha_eff > 0.0:
        return None
    for n in range(1, limit + 1):
        if 2.0 / math.comb(2 * n, n) < alpha_eff:
            return n
    return None


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    Sorted ascending, the k-th smallest (k from 1) is multiplied by m - k + 1;
    a running maximum keeps the adjusted values monotone in the raw ones;
    capped at 1.  Rejecting every hypothesis whose adjusted p is below alpha
    is Holm's procedure: the chance of *any* false flag among the m is at
    most alpha (family-wise control), with no assumption on how the metrics
    depend on each other."""
    ps = [float(p) for p in pvalues]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [1.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * ps[i]))
        adjusted[i] = running
    return adjusted


def pooled_ratio(a_reps: Sequence[Samples], b_reps: Sequence[Samples]) -> float:
    """median(all of B) / median(all of A)."""
    return ratio_of_medians(np.concatenate(_replicates(a_reps)), np.concatenate(_replicates(b_reps)))


def two_stage_medians(
    groups: list[np.ndarray], n: int, rng: np.random.Generator, chosen: np.ndarray | None = None
) -> np.ndarray:
    """n bootstrap medians of the pooled samples: replicates drawn with
    replacement, then samples within each drawn replicate.  ``chosen`` (n
    rows of replicate indices) gives the first stage when the caller draws
    it, to share it between two sides measured by the same units."""
    k = len(groups)
    lengths = np.array([g.size for g in groups])
    width = int(lengths.max())
    padded = np.full((k, width), np.nan)
    for i, g in enumerate(groups):
        padded[i, : g.size] = g
    out = np.empty(n)
    chunk = max(1, 4_000_000 // (k * width))  # bound one batch's memory
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        picked = rng.integers(0, k, size=(size, k)) if chosen is None else chosen[start : start + size]  # stage 1
        lens = lengths[picked][..., None]  # (size, k, 1)
        pos = np.floor(rng.random((size, k, width)) * lens).astype(np.intp)  # stage 2
        values = padded[picked[..., None], pos]
        if lengths.min() == width:
            flat = values.reshape(size, k * width)
            lo, hi = (k * width - 1) // 2, k * width // 2
            flat = np.partition(flat, [lo, hi], axis=1)
            out[start : start + size] = 0.5 * (flat[:, lo] + flat[:, hi])
            continue
        # A drawn replicate contributes as many samples as it has: the
        # padding sorts last and the median is read at each row's own count.
        values = np.where(np.arange(width) < lens, values, np.inf).reshape(size, k * width)
        values.sort(axis=1)
        count = lens[:, :, 0].sum(axis=1)
        rows = np.arange(size)
        out[start : start + size] = 0.5 * (values[rows, (count - 1) // 2] + values[rows, count // 2])
    return out


def hierarchical_ratio_ci(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Two-stage percentile bootstrap CI of median(pooled B) / median(pooled
    A), A and B resampled independently.  With one replicate on a side that
    side's first stage is degenerate: the interval then shows only the noise
    within that unit, not between units (see ``ci_method``).  The point
    itself when nothing varies; NaN bounds when A's median can be zero."""
    return _two_stage_ratio_ci(_replicates(a_reps), _replicates(b_reps), n_resamples, seed, paired=False)


def paired_ratio_ci(units: Sequence[tuple[Samples, Samples]], *, seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """The same interval when each unit measured both A and B, given as (A
    samples, B samples) per unit: units are drawn jointly, so what a unit
    shares (its host load, its guest) cancels in the ratio, then samples
    inside each side of each drawn unit."""
    ga, gb = [_array(a) for a, _ in units], [_array(b) for _, b in units]
    if not units or not all(g.size for g in ga + gb):
        raise ValueError("a paired design needs both sides' samples from every unit")
    return _two_stage_ratio_ci(ga, gb, DEFAULT_RESAMPLES, seed, paired=True)


def _two_stage_ratio_ci(
    ga: list[np.ndarray], gb: list[np.ndarray], n_resamples: int, seed: int, paired: bool
) -> tuple[float, float]:
    pooled_a, pooled_b = np.concatenate(ga), np.concatenate(gb)
    point = ratio_of_medians(pooled_a, pooled_b)
    if np.ptp(pooled_a) == 0.0 and np.ptp(pooled_b) == 0.0:
        return (point, point)
    if np.any(pooled_a == 0.0) and np.median(pooled_a) == 0.0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(ga), size=(n_resamples, len(ga))) if paired else None
    med_a = two_stage_medians(ga, n_resamples, rng, chosen)
    med_b = two_stage_medians(gb, n_resamples, rng, chosen)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = med_b / med_a
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size < n_resamples * 0.99:
        return (math.nan, math.nan)  # A's median is zero too often to bound
    return _percentile_interval(ratios)


def _percentile_interval(values: np.ndarray) -> tuple[float, float]:
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def median_ci(
    reps: Sequence[Samples], *, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> tuple[float, float]:
    """Two-stage bootstrap CI of the pooled median: replicates resampled,
    then samples inside each drawn replicate."""
    rng = np.random.default_rng(seed)
    return _percentile_interval(two_stage_medians(_replicates(reps), n_resamples, rng))


def ci_method(na: int, nb: int) -> str:
    """What a ``hierarchical_ratio_ci`` of na against nb replicates shows."""
    if na >= 2 and nb >= 2:
        return "two-stage bootstrap"
    return "within-unit only (one replicate on a side: variation between units unseen)"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A against B: B's median over A's, its CI, and whether the change is
    real (p < alpha) and big enough (relative change >= min_effect).

    From ``compare_replicates`` it also says how many independent units
    each side had, how p was computed, the lowest p those counts can give,
    and whether it is ``underpowered`` (that floor not below alpha: it can
    never be significant), with the replicates a side that would do.
    ``p_adjusted`` is set when the comparison is one of a family (host/
    compare.py applies Holm); significance then uses it."""

    a: Summary
    b: Summary
    ratio: float  # median(B) / median(A)
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    alpha: float
    min_effect: float
    n_replicates_a: int = 1
    n_replicates_b: int = 1
    p_method: str = ""
    ci_method: str = ""
    min_attainable_p: float = 0.0
    underpowered: bool = False
    replicates_needed: int | None = None
    p_adjusted: float | None = None

    @property
    def relative_change(self) -> float:
        return self.ratio - 1.0

    @property
    def significant(self) -> bool:
        """p (adjusted, when it is one of a family) below alpha and the
        effect at least min_effect: the Firecracker rule for calling an A/B
        difference real.  Never when underpowered."""
        p = self.p_value if self.p_adjusted is None else self.p_adjusted
        return (
            math.isfinite(self.ratio)
            and not self.underpowered
            and p < self.alpha
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
            "p_adjusted": self.p_adjusted,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "significant": self.significant,
            "n_replicates_a": self.n_replicates_a,
            "n_replicates_b": self.n_replicates_b,
            "p_method": self.p_method,
            "ci_method": self.ci_method,
            "min_attainable_p": self.min_attainable_p,
            "underpowered": self.underpowered,
            "replicates_needed": self.replicates_needed,
        }


def compare(
    a: Samples,
    b: Samples,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """A against B on flat samples, each sample taken as independent: right
    only for figures with no nesting (a model's outputs).  Measurements go
    through ``compare_replicates``."""
    arr_a, arr_b = _array(a), _array(b)
    # A side with a single value has no spread to test against: p is 1.
    testable = arr_a.size > 1 and arr_b.size > 1
    return _comparison(
        arr_a,
        arr_b,
        bootstrap_ratio_ci(arr_a, arr_b, n_resamples=n_resamples, seed=seed),
        permutation_test(arr_a, arr_b, n_resamples=n_resamples, seed=seed).p_value if testable else 1.0,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates=(len(a), len(b)),
        p_method="sample-level permutation",
        ci_method="sample-level bootstrap",
    )


def compare_replicates(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    n_permutations: int = DEFAULT_PERMUTATIONS,
) -> Comparison:
    """A against B, each a list of replicates (independent units), each a
    list of samples: the ratio of pooled medians, its two-stage bootstrap
    CI (n_resamples), the permutation p on replicate medians (exact up to
    n_permutations arrangements), the replicate counts, and whether those
    counts can reach p < alpha at all."""
    ga, gb = _replicates(a_reps), _replicates(b_reps)
    ci = hierarchical_ratio_ci(ga, gb, n_resamples=n_resamples, seed=seed)
    perm = replicate_permutation_test(ga, gb, n_resamples=n_permutations, seed=seed)
    comparison = _comparison(
        np.concatenate(ga),
        np.concatenate(gb),
        ci,
        perm.p_value,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates=(len(ga), len(gb)),
        p_method=f"permutation of replicate medians, {perm.method}",
        ci_method=ci_method(len(ga), len(gb)),
    )
    # What these replicate counts can show at all (the flat comparison
    # takes every sample as a unit and has no such floor).
    floor = min_attainable_p(len(ga), len(gb), n_permutations)
    return dataclasses.replace(
        comparison,
        min_attainable_p=floor,
        underpowered=floor >= alpha,
        replicates_needed=replicates_needed(alpha),
    )


def _comparison(
    a: np.ndarray,
    b: np.ndarray,
    ci: tuple[float, float],
    p_value: float,
    *,
    alpha: float,
    min_effect: float,
    n_replicates: tuple[int, int],
    p_method: str,
    ci_method: str,
) -> Comparison:
    """The Comparison of the pooled samples ``a`` and ``b`` with the CI and
    p each kind of comparison computed its own way."""
    return Comparison(
        a=summarize(a),
        b=summarize(b),
        ratio=ratio_of_medians(a, b),
        ci_low=ci[0],
        ci_high=ci[1],
        confidence=CONFIDENCE,
        p_value=p_value,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates_a=n_replicates[0],
        n_replicates_b=n_replicates[1],
        p_method=p_method,
        ci_method=ci_method,
    )


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
