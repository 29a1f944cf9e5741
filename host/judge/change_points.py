"""The change-point test of ``memqual history``, a series at a time: one
value a run (the median of its replicate medians), the t of the runs before
against after each boundary with its variance moderated by the family's
(variance_prior.py), binary segmentation over the boundaries and at those the
family located (family_scan.py), the steps beyond the threshold, and every
run's equivalence to the first.  Why so: the comment below.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from memqual.host.judge.family_scan import family_scan
from memqual.host.judge.variance_prior import NO_PRIOR, Prior, within

# family-wise alpha per family and the margin band, as compare's
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD

# The change-point test, named on the page: **binary segmentation on the
# runs' medians, a t at every boundary with the run-to-run variance
# moderated by the family's**.  The unit is the run: runs sit hours or days
# apart, the host moves between them (docs/ab-calibration.md measured some
# 10 % between jobs), and the replicates of one run share that run's state,
# so a test on replicates pooled across runs reads run-to-run drift as
# change.  Each run gives one value, the median of its replicate medians (on
# the log scale; relative to the series' mean for a metric with a value at
# or below zero).
#
# In a segment of the series every boundary between two runs is a
# candidate: a two-sample t of the run values before against after, with
# the variance within both sides.  Eight runs leave that variance 6 degrees
# of freedom, and that, not the search over boundaries, is what a series
# alone cannot overcome: at alpha 0.01 the best of 7 boundaries needs
# |t| > 5.55 (its exact null, by simulation) against Bonferroni's 5.56, and
# a 10 % step in 8 runs of 3 % run-to-run drift gives t about 4.2.  So the
# variance is **moderated** by the family's (Smyth's empirical Bayes, as
# limma's moderated t): at each boundary, the within-sides variances of
# every series of the family at that same boundary are fitted as a scaled
# inverse chi-square prior (its degrees of freedom d0 from how much the
# log variances scatter beyond their sampling error; at most the family's
# own degrees of freedom), and a series' variance becomes
# (d0 s0^2 + d s^2) / (d0 + d) with d0 + d degrees of freedom.  Series that
# drift alike lend each other degrees of freedom; series whose spreads
# differ widely (the primaries here span 0.05 % to 36 %) give d0 near 0 and
# each series keeps its own t.  A series alone is its own t.
#
# What moderation cannot buy back is the search: Holm over 10 primaries
# times 7 boundaries asks a series for p < 1.4e-4, and a 10 % step in 8
# runs of 3 % drift gives t about 4.2, found in half the series.  A kernel
# change moves the primaries at the same run, so the family is scanned
# first (``family_scan``: where its runs changed, a null drawn from the
# residuals' covariance so a drift common to a run is no signal), and each
# series is tested at the boundaries the family located (one boundary, not
# seven) with LOCATED_WEIGHT of alpha, and by its own search with the
# rest; when the family located nothing its search has all of alpha (a
# step of one primary alone).  docs/ab-calibration.md measures both.
#
# The segment's p is the smallest of the boundaries' times their number
# (Bonferroni; near exact here, above).  When it is below alpha the
# boundary of the smallest p is a candidate and both sides are searched
# again.  Then each candidate is judged between its neighbours (the
# candidates before and after it): it is a step when the ratio after /
# before of the run values lies beyond the threshold band -- as
# ``memqual compare``'s slower/faster: shown to differ, the estimate beyond
# the margin, not a change shown to exceed the margin.  The step keeps its
# 95 % t-interval for the page.


# The share of alpha a series spends on the boundaries its family located;
# the rest goes to its own search over every boundary (a step of that
# series alone).
LOCATED_WEIGHT = 0.9


@dataclasses.dataclass(frozen=True)
class Step:
    """A change between run ``after - 1`` and run ``after`` (positions in
    the series)."""

    after: int
    ratio: float  # pooled median after / before, within the segment
    ci_low: float
    ci_high: float
    p_value: float
    # A control stepped between the same two runs: the host moved there, so
    # this step is not a decision.
    confounded: bool = False


def run_values(series: Sequence[Sequence[Sequence[float]]]) -> list[float]:
    """One value a run, the unit of the tests: the log of the median of its
    replicate medians, or, when a run's median is at or below zero (a
    count, a fraction), that median relative to the series' mean absolute
    median (the ratio is then 1 + the difference).  A run with no samples
    gives NaN (left out by the tests)."""
    import numpy as np

    medians = [
        float(np.median([float(np.median(r)) for r in run if len(r)])) if any(len(r) for r in run) else math.nan
        for run in series
    ]
    known = [m for m in medians if math.isfinite(m)]
    if known and min(known) > 0.0:
        return [math.log(m) if math.isfinite(m) else math.nan for m in medians]
    ref = (math.fsum(abs(m) for m in known) / len(known)) if known else 1.0
    return [m / (ref or 1.0) for m in medians]


def log_scale(series: Sequence[Sequence[Sequence[float]]]) -> bool:
    import numpy as np

    meds = [float(np.median(r)) for run in series for r in run if len(r)]
    return bool(meds) and min(meds) > 0.0


@dataclasses.dataclass(frozen=True)
class Split:
    """Run values before against after one boundary: the difference of
    their means, its standard error, and the degrees of freedom of the
    spread it was estimated with."""

    difference: float
    se: float
    df: float

    def p_value(self) -> float:
        from scipy import special

        if self.df <= 0.0 or not math.isfinite(self.se):
            return 1.0
        if self.se == 0.0:
            return 1.0 if self.difference == 0.0 else 0.0
        return float(2.0 * special.stdtr(self.df, -abs(self.difference) / self.se))

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        from scipy import special

        if self.df <= 0.0 or not math.isfinite(self.se):
            return (-math.inf, math.inf)
        half = float(special.stdtrit(self.df, 0.5 + confidence / 2.0)) * self.se
        return (self.difference - half, self.difference + half)


def split(before: Sequence[float], after: Sequence[float], prior: Prior = NO_PRIOR) -> Split:
    """The two-sample t of the run values before against after a boundary,
    the variance within both sides, moderated by ``prior`` (NaN, a run with
    no samples, left out)."""
    x = [v for v in before if math.isfinite(v)]
    y = [v for v in after if math.isfinite(v)]
    if not x or not y:
        return Split(0.0, math.inf, 0.0)
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    var, df = within(x, y)
    if df < 1:
        var, df = 0.0, 0.0
    if prior.df > 0.0:
        var, df = (prior.df * prior.variance + df * var) / (prior.df + df), prior.df + df
    if df <= 0.0:
        return Split(my - mx, math.inf, 0.0)
    return Split(my - mx, math.sqrt(var * (1.0 / len(x) + 1.0 / len(y))), df)


def _boundaries(values: Sequence[float], i: int, j: int) -> list[int]:
    """The boundaries inside [i, j) that split its known values in two
    different ways: before each known value but the first."""
    known = [k for k in range(i, j) if math.isfinite(values[k])]
    return known[1:]


def no_change_p(series: Sequence[Sequence[Sequence[float]]]) -> float:
    """The p of "no change anywhere in the series" for a series alone: at
    every boundary between two runs, the t-test of the run values
    (``run_values``) before against after, the smallest p, times the
    boundaries (Bonferroni over the candidates: the best of k - 1 splits,
    not one chosen in advance).  Its error rate on series with run-to-run
    drift is measured (docs/ab-calibration.md, "memqual history").  Under
    no change the runs are exchangeable, so drift that moves each run
    independently is in the variance the test estimates, not in its
    signal."""
    values = run_values(series)
    return _segment_p(values, 0, len(values), None)[0]


def _segment_p(values: Sequence[float], i: int, j: int, prior_at: Any) -> tuple[float, int]:
    """The segment's Bonferroni p and its best boundary (-1: none)."""
    known = [v for v in values[i:j] if math.isfinite(v)]
    if len(known) < 3 and (prior_at is None or len(known) < 2):
        return 1.0, -1  # two runs leave no spread between runs to test against, unless the family lends one
    cuts = _boundaries(values, i, j)
    if not cuts:
        return 1.0, -1
    ps = [split(values[i:k], values[k:j], prior_at(i, j, k) if prior_at else NO_PRIOR).p_value() for k in cuts]
    best = min(range(len(cuts)), key=lambda m: ps[m])
    return min(1.0, ps[best] * len(ps)), cuts[best]


def change_points(
    series: Sequence[Sequence[Sequence[float]]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
) -> list[Step]:
    """Steps in a series of runs alone, each run a list of replicates
    (lists of samples).  See the module docstring for the test."""
    return steps_in(run_values(series), log_scale(series), threshold=threshold, alpha=alpha)


def steps_in(
    values: Sequence[float],
    log: bool,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    prior_at: Any = None,
    located: dict[int, float] | None = None,
) -> list[Step]:
    """Steps in one series' run values (``run_values``, NaN where it has
    no run), its variances moderated by ``prior_at(i, j, k)`` (a
    ``FamilySpread``; None: the series alone).  ``located``: the p of
    this series at each boundary its family located (``located_p``); a
    located boundary spends ``LOCATED_WEIGHT`` of alpha and the series' own
    search the rest.  None: the search spends all of it."""

    def ratio(x: float) -> float:
        return math.exp(x) if log else 1.0 + x

    search_share = 1.0 - LOCATED_WEIGHT if located else 1.0
    candidates: dict[int, float] = {}  # boundary -> the p (over its share) that found it

    def segment(i: int, j: int) -> None:
        p, after = _segment_p(values, i, j, prior_at)
        p = min(1.0, p / search_share)
        if after < 0 or p >= alpha:
            return
        candidates[after] = p
        segment(i, after)
        segment(after, j)

    segment(0, len(values))
    for after, p in (located or {}).items():
        share = min(1.0, p / LOCATED_WEIGHT)
        if share < alpha:
            candidates[after] = min(share, candidates.get(after, 1.0))
    # Each candidate is judged against its neighbours: the runs between
    # the candidate before it and the one after.  Judged against the whole
    # segment instead, a rise followed by a fall (or the reverse) mixes
    # both levels on one side and neither step would show.
    steps: list[Step] = []
    cuts = sorted(candidates)
    for k, after in enumerate(cuts):
        start = cuts[k - 1] if k else 0
        end = cuts[k + 1] if k + 1 < len(cuts) else len(values)
        found = split(values[start:after], values[after:end], prior_at(start, end, after) if prior_at else NO_PRIOR)
        estimate = ratio(found.difference)
        if not (estimate > 1.0 + threshold or estimate < 1.0 - threshold):
            continue  # perhaps significant, but the estimate is inside the band
        low, high = found.interval()
        steps.append(
            Step(after=after, ratio=estimate, ci_low=ratio(low), ci_high=ratio(high), p_value=candidates[after])
        )
    return steps


def family_p(values: Sequence[float], prior_at: Any) -> float:
    """A series' p of "no change anywhere" with its family's prior: the
    whole series as one segment."""
    return _segment_p(values, 0, len(values), prior_at)[0]


def located_changes(values: Sequence[Sequence[float]], *, alpha: float = DEFAULT_ALPHA) -> list[int]:
    """The family's change points: binary segmentation with
    ``family_scan`` at ``alpha`` in each segment."""
    found: list[int] = []

    def segment(i: int, j: int) -> None:
        p, after = family_scan(values, i, j)
        if after < 0 or p >= alpha:
            return
        found.append(after)
        segment(i, after)
        segment(after, j)

    n = max((len(v) for v in values), default=0)
    segment(0, n)
    return sorted(found)


def located_p(values: Sequence[float], located: Sequence[int], prior_at: Any) -> dict[int, float]:
    """A series' p at each boundary its family located, between the
    located boundaries on either side, times their number."""
    out: dict[int, float] = {}
    for m, after in enumerate(located):
        start = located[m - 1] if m else 0
        end = located[m + 1] if m + 1 < len(located) else len(values)
        found = split(values[start:after], values[after:end], prior_at(start, end, after) if prior_at else NO_PRIOR)
        out[after] = min(1.0, found.p_value() * len(located))
    return out


def equivalence_p(series: Sequence[Sequence[Sequence[float]]], threshold: float) -> float:
    """The largest over the runs of the TOST p of "this run's value is
    inside the band against the first run's", with the run-to-run spread
    estimated from the whole series (a change anywhere widens it, which
    only makes equivalence harder to show)."""
    from scipy import special

    values = [v for v in run_values(series) if math.isfinite(v)]
    n = len(values)
    if n < 3:
        return 1.0
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    log = log_scale(series)
    low = math.log(1.0 - threshold) if log else -threshold
    high = math.log(1.0 + threshold) if log else threshold
    se = sd * math.sqrt(2.0)
    worst = 0.0
    for v in values[1:]:
        d = v - values[0]
        if se == 0.0:
            p = 0.0 if low < d < high else 1.0
        else:
            p = max(special.stdtr(n - 1, -(d - low) / se), special.stdtr(n - 1, -(high - d) / se))
        worst = max(worst, float(p))
    return worst
