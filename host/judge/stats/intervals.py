"""Intervals of repeated measurements: the ratio of pooled medians with its
seeded bootstrap interval (two-stage over replicates, or paired by unit),
and the interval of a pooled median.  Inference only on independent
replicates (a fresh guest or a round).  Every random choice is seeded; no
I/O.  docs/claims-and-report.md ("Statistics") gives the choices and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from memqual.host.core.descriptive import Samples, as_array, ratio_of_medians

DEFAULT_SEED = 20110223  # the date of seed 000; any fixed value works
DEFAULT_RESAMPLES = 9999
# Every interval of the suite is a 95 % one: the pages and tables print
# "95% CI", so the level is fixed here rather than a knob that would make
# them wrong.
CONFIDENCE = 0.95


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
    arr_a, arr_b = as_array(a), as_array(b)
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


def replicate_arrays(reps: Sequence[Samples]) -> list[np.ndarray]:
    groups = [as_array(r) for r in reps if len(r)]
    if not groups:
        raise ValueError("need at least one replicate with samples")
    return groups


def replicate_medians(reps: Sequence[Samples]) -> list[float]:
    """One summary per independent unit: its median."""
    return [float(np.median(g)) for g in replicate_arrays(reps)]


def pooled_ratio(a_reps: Sequence[Samples], b_reps: Sequence[Samples]) -> float:
    """median(all of B) / median(all of A)."""
    return ratio_of_medians(np.concatenate(replicate_arrays(a_reps)), np.concatenate(replicate_arrays(b_reps)))


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
    return _two_stage_ratio_ci(replicate_arrays(a_reps), replicate_arrays(b_reps), n_resamples, seed, paired=False)


def paired_ratio_ci(units: Sequence[tuple[Samples, Samples]], *, seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """The same interval when each unit measured both A and B, given as (A
    samples, B samples) per unit: units are drawn jointly, so what a unit
    shares (its host load, its guest) cancels in the ratio, then samples
    inside each side of each drawn unit."""
    ga, gb = [as_array(a) for a, _ in units], [as_array(b) for _, b in units]
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
    return _percentile_interval(two_stage_medians(replicate_arrays(reps), n_resamples, rng))


def ci_method(na: int, nb: int) -> str:
    """What a ``hierarchical_ratio_ci`` of na against nb replicates shows."""
    if na >= 2 and nb >= 2:
        return "two-stage bootstrap"
    return "within-unit only (one replicate on a side: variation between units unseen)"
