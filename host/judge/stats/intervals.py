"""Intervals of repeated measurements: the ratio of pooled medians with its
seeded two-stage bootstrap interval over replicates, and the interval of a
pooled median.  Inference only on independent replicates (a fresh guest or
a round).  Every random choice is seeded; no I/O.
docs/claims-and-report.md ("Statistics") gives the choices and why.
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


def two_stage_medians(groups: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """n bootstrap medians of the pooled samples: replicates drawn with
    replacement, then samples within each drawn replicate."""
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
        picked = rng.integers(0, k, size=(size, k))  # stage 1
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
    within that unit, not between units.  The point itself when nothing
    varies; NaN bounds when A's median can be zero."""
    ga, gb = replicate_arrays(a_reps), replicate_arrays(b_reps)
    pooled_a, pooled_b = np.concatenate(ga), np.concatenate(gb)
    point = ratio_of_medians(pooled_a, pooled_b)
    if np.ptp(pooled_a) == 0.0 and np.ptp(pooled_b) == 0.0:
        return (point, point)
    if np.any(pooled_a == 0.0) and np.median(pooled_a) == 0.0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    med_a = two_stage_medians(ga, n_resamples, rng)
    med_b = two_stage_medians(gb, n_resamples, rng)
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
