"""The A/B decisions of ``memqual compare``, ``--until-decided``, bisect and
``memqual history``: a t-test of log ratios of replicate medians
(``ratio_test``, whose t a claim's interval also takes, ratio_ci.py),
Benjamini-Hochberg over a family, and alpha spent over planned looks or
over a budget's time.  Pure functions of numbers: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np
from scipy import special as _special

from memqual.host.core.descriptive import Samples
from memqual.host.judge.stats.intervals import CONFIDENCE

# The A/B decision test: a t-test of log ratios of replicate medians.
#
# Why a t-test and not permutation.py's test: an exact permutation
# test of n against n units cannot give p below 2/C(2n, n) (1/462 at 6 a
# side), which no Holm-corrected level over a dozen metrics at 0.01 lets
# through.  On the log scale the replicate medians of a timing are close
# to normal (a multiplicative noise), and the t-test's error rates at the
# block counts a 20-minute run gives are measured through the real code
# in tests/judge/test_ab_calibration.py (docs/ab-calibration.md), not assumed.
#
# - Blocked (every replicate of both sides names its block, and the
#   blocks are shared): one log ratio log(B/A) per block, a paired t-test
#   and its t-interval.  Drift between blocks (the host's load moving over
#   minutes) is common to A and B inside a block and cancels.  A block
#   that holds several replicates of a side gives that side's median of
#   replicate medians.
# - Not blocked (older files, one-sided runs): Welch's t-test on the log
#   replicate medians, with Welch-Satterthwaite degrees of freedom.
# - A metric with a median at or below zero (a fraction that can be 0, a
#   count) is tested on the linear scale relative to A's mean instead of
#   the log scale; its ratio is then 1 + the relative difference.


@dataclasses.dataclass(frozen=True)
class RatioTest:
    """The test of one metric's B / A: the estimate and its standard error
    on the test's scale (log, or linear relative to A), the degrees of
    freedom, and how it was made."""

    estimate: float
    se: float
    df: float
    scale: str  # "log" or "relative"
    paired: bool
    n_a: int
    n_b: int
    n_blocks: int  # blocks in the paired test; 0 unpaired

    @property
    def method(self) -> str:
        scale = "log replicate medians" if self.scale == "log" else "replicate medians relative to A"
        if self.paired:
            return f"paired t on {self.n_blocks} blocks' {scale} (B - A per block)"
        return f"Welch t on {scale}"

    @property
    def units(self) -> int:
        """The independent units per side the standard error rests on."""
        return self.n_blocks if self.paired else min(self.n_a, self.n_b)

    def ratio_of(self, value: float) -> float:
        return math.exp(value) if self.scale == "log" else 1.0 + value

    def band(self, threshold: float) -> tuple[float, float]:
        """The threshold band [1 - t, 1 + t] on the test's scale."""
        if self.scale == "log":
            return (math.log(1.0 - threshold) if threshold < 1.0 else -math.inf, math.log(1.0 + threshold))
        return (-threshold, threshold)

    @property
    def testable(self) -> bool:
        return self.df > 0 and math.isfinite(self.se)

    def p_difference(self) -> float:
        """Two-sided p of no difference (B / A = 1)."""
        if not self.testable:
            return 1.0
        if self.se == 0.0:
            return 1.0 if self.estimate == 0.0 else 0.0
        return float(2.0 * _special.stdtr(self.df, -abs(self.estimate) / self.se))

    def p_equivalence(self, threshold: float) -> float:
        """The two one-sided tests' p (TOST): the larger of the p of
        "B / A <= 1 - t" and of "B / A >= 1 + t".  Below alpha means the
        (1 - 2 alpha) interval lies inside the band."""
        low, high = self.band(threshold)
        if not self.testable:
            return 1.0
        if self.se == 0.0:
            return 0.0 if low < self.estimate < high else 1.0
        p_low = _special.stdtr(self.df, -(self.estimate - low) / self.se)
        p_high = _special.stdtr(self.df, -(high - self.estimate) / self.se)
        return float(max(p_low, p_high))

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The t-interval of B / A."""
        if not self.testable:
            return (math.nan, math.nan)
        half = float(_special.stdtrit(self.df, 0.5 + confidence / 2.0)) * self.se
        return (self.ratio_of(self.estimate - half), self.ratio_of(self.estimate + half))

    def units_needed(self, threshold: float, alpha_difference: float, alpha_equivalence: float) -> int | None:
        """About how many units a side (blocks when paired) would decide
        this metric if the estimate and the spread stayed as observed:
        the smallest count at which either the difference is significant
        beyond the threshold, or the TOST shows equivalence.  None when no
        count up to 200 would (an estimate on the band's edge), or when the
        spread is unknown (a side with one unit)."""
        if not self.testable or self.se == 0.0:
            return None
        now = max(self.units, 2)
        sd = self.se * math.sqrt(now)
        low, high = self.band(threshold)
        n = np.arange(now + 1, 201)
        df = n - 1 if self.paired else 2 * n - 2
        se = sd / np.sqrt(n)
        significant = np.abs(self.estimate) > _special.stdtrit(df, 1.0 - alpha_difference / 2.0) * se
        if not (self.estimate >= high or self.estimate <= low):
            significant[:] = False
        reach = _special.stdtrit(df, 1.0 - alpha_equivalence) * se
        equivalent = (low < self.estimate - reach) & (self.estimate + reach < high)
        hits = np.flatnonzero(significant | equivalent)
        return int(n[hits[0]]) if hits.size else None


def _side_medians(reps: Sequence[Samples]) -> list[float]:
    # Plain Python: a replicate holds a handful of samples and a metric a
    # handful of replicates, where numpy's per-call overhead would dominate
    # (the calibration runs this some hundred thousand times).
    out = [statistics.median(float(x) for x in r) for r in reps if len(r)]
    if not all(math.isfinite(x) for x in out):
        raise ValueError("samples must be finite numbers")
    return out


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    # Scaled by the largest magnitude first: squares of values far apart
    # (1e-100 against 1e100 on the relative scale) would overflow; the
    # variance may come back inf, never an OverflowError.
    n = len(values)
    scale = max(abs(v) for v in values) or 1.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / n
    var = math.fsum((v - mean) ** 2 for v in scaled) / (n - 1) if n > 1 else 0.0
    return mean * scale, var * scale * scale


def ratio_test(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    a_blocks: Sequence[int] | None = None,
    b_blocks: Sequence[int] | None = None,
) -> RatioTest:
    """The t-test of B / A on replicate medians: paired by block when both
    sides name every replicate's block and share at least two blocks,
    Welch's otherwise (see above)."""
    ma, mb = _side_medians(a_reps), _side_medians(b_reps)
    if not ma or not mb:
        raise ValueError("need at least one replicate with samples a side")
    if min(ma) > 0.0 and min(mb) > 0.0:
        ya, yb, scale = [math.log(x) for x in ma], [math.log(x) for x in mb], "log"
    else:
        ref = abs(math.fsum(ma) / len(ma)) or max(max(abs(x) for x in ma + mb), 1.0)
        ya, yb, scale = [x / ref for x in ma], [x / ref for x in mb], "relative"
    na, nb = len(ya), len(yb)
    if (
        a_blocks is not None
        and b_blocks is not None
        and len(a_blocks) == na
        and len(b_blocks) == nb
        and len(set(a_blocks) & set(b_blocks)) >= 2
    ):
        shared = sorted(set(a_blocks) & set(b_blocks))
        d = [
            statistics.median(y for y, blk in zip(yb, b_blocks, strict=True) if blk == k)
            - statistics.median(y for y, blk in zip(ya, a_blocks, strict=True) if blk == k)
            for k in shared
        ]
        mean, var = _mean_var(d)
        n = len(d)
        return RatioTest(mean, math.sqrt(var / n), float(n - 1), scale, True, na, nb, n)
    (mean_a, var_a), (mean_b, var_b) = _mean_var(ya), _mean_var(yb)
    estimate = mean_b - mean_a
    if na < 2 or nb < 2:
        return RatioTest(estimate, math.inf, 0.0, scale, False, na, nb, 0)
    va, vb = var_a / na, var_b / nb
    se = math.sqrt(va + vb)
    if not math.isfinite(se):  # spread beyond float's range: nothing can be decided
        return RatioTest(estimate, math.inf, 0.0, scale, False, na, nb, 0)
    # Welch-Satterthwaite, as shares of va + vb: the squares of va and vb themselves may overflow.
    total = va + vb
    df = float(na + nb - 2) if se == 0.0 else 1.0 / ((va / total) ** 2 / (na - 1) + (vb / total) ** 2 / (nb - 1))
    return RatioTest(estimate, se, df, scale, False, na, nb, 0)


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the input order:
    rejecting those below alpha keeps the expected share of false
    discoveries among the rejected at most alpha (independent or positively
    dependent tests), and under no effect at all it is Simes' test, whose
    chance of any rejection is at most alpha."""
    ps = [float(p) for p in pvalues]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i], reverse=True)
    adjusted = [1.0] * m
    running = 1.0
    for rank_from_top, i in enumerate(order):
        k = m - rank_from_top  # 1-based rank ascending
        running = min(running, ps[i] * m / k)
        adjusted[i] = min(1.0, running)
    return adjusted


def spent_alpha(alpha: float, look: int, planned: int, rho: float = 2.0) -> float:
    """The alpha a look may spend in a sequential run of ``planned`` looks
    (look 1 the first): the increment of the power spending function
    alpha * (k / planned) ** rho (rho 2 is close to O'Brien-Fleming's
    boundaries in where it spends: little early, most at the end).  The
    increments sum to alpha, so however many looks a run takes (up to
    ``planned``), the chance that any look makes a wrong decision is at
    most alpha (Bonferroni over the looks; the looks are positively
    correlated, so the true rate is lower: measured in
    tests/judge/test_ab_calibration.py).  Past ``planned`` nothing is left."""
    if look < 1 or look > planned:
        return 0.0
    return alpha * ((look / planned) ** rho - ((look - 1) / planned) ** rho)


def spent_alpha_by_time(alpha: float, before: float, now: float, rho: float = 2.0) -> float:
    """The alpha a look may spend when looks fall wherever a budget's time
    puts them: the increment of alpha * t ** rho from the fraction of the
    budget spent at the previous look (``before``) to this look's
    (``now``), each clipped to [0, 1].  Lan and DeMets' spending on
    calendar time: the looks need not be planned, and however many there
    are the increments sum to at most alpha (Bonferroni over the looks,
    as ``spent_alpha``).  A look that knows it is the last passes
    ``now=1`` and spends what is left."""
    if not (math.isfinite(before) and math.isfinite(now)):
        raise ValueError("the budget's fractions must be finite")
    low, high = min(max(before, 0.0), 1.0), min(max(now, 0.0), 1.0)
    return max(0.0, alpha * (high**rho - low**rho))
