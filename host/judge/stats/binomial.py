"""Rates of events in trials: the exact (Clopper-Pearson) interval of a
rate, and the one-sided Fisher exact test that one rate exceeds another.
Used by the boot-fault counts (lab/count_panics.py) and the measured
error rates of the calibration (host/run/calibrate.py)."""

from __future__ import annotations

import math


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval for k successes in n trials (NaN bounds
    for no trial)."""
    from scipy.stats import beta  # heavy: only where an interval is made

    if n <= 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0
    low = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - tail, k + 1, n - k))
    return (low, high)


def fisher_greater(events_a: int, trials_a: int, events_b: int, trials_b: int) -> float:
    """One-sided Fisher exact p that A's rate of events exceeds B's."""
    from scipy.stats import fisher_exact

    table = [[events_a, trials_a - events_a], [events_b, trials_b - events_b]]
    return float(fisher_exact(table, alternative="greater")[1])
