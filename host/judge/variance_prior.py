"""The family's run-to-run variance as a prior for one series' (Smyth's
empirical Bayes, as limma's moderated t): the prior's moment fit, the
variance within both sides of a boundary, and ``FamilySpread``, the prior
at each boundary of a family's series, worth as many series as their
residuals are independent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Prior:
    """The family's run-to-run variance at one boundary, as a prior for one
    series' (a scaled inverse chi-square: ``variance`` s0^2 on ``df`` d0
    degrees of freedom).  ``df`` 0: none, each series its own t."""

    df: float
    variance: float


NO_PRIOR = Prior(0.0, 0.0)


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0), by Newton's method as limma's."""
    from scipy import special

    x = 0.5 + 1.0 / y if y < 1e6 else 1.0 / math.sqrt(y)
    for _ in range(60):
        tri = float(special.polygamma(1, x))
        step = tri * (1.0 - tri / y) / float(special.polygamma(2, x))
        x += step
        if x <= 0.0:
            x = 1e-8
        if abs(step) < 1e-10 * x:
            break
    return x


def fit_prior(variances: Sequence[tuple[float, float]], independent: float | None = None) -> Prior:
    """Smyth's (2004) moment fit of a prior to the series' (variance,
    degrees of freedom) pairs: the log variances' scatter beyond what their
    own sampling gives is the prior's; a prior is capped at the degrees of
    freedom the family's variances hold, less one series': ``independent``
    (default: as many as there are) is how many independent series those
    variances are worth.  Fewer than three series with a variance above
    zero: none."""
    from scipy import special

    pairs = [(v, d) for v, d in variances if d > 0.0 and v > 0.0 and math.isfinite(v)]
    if len(pairs) < 3:
        return NO_PRIOR
    e = [math.log(v) - float(special.digamma(d / 2.0)) + math.log(d / 2.0) for v, d in pairs]
    g = len(e)
    mean = math.fsum(e) / g
    excess = (
        math.fsum((x - mean) ** 2 for x in e) / (g - 1)
        - math.fsum(float(special.polygamma(1, d / 2.0)) for _, d in pairs) / g
    )
    worth = g if independent is None else max(1.0, min(float(g), independent))
    cap = math.fsum(d for _, d in pairs) / g * (worth - 1.0)
    if cap <= 0.0:
        return NO_PRIOR
    d0 = cap if excess <= 0.0 else min(cap, 2.0 * _trigamma_inverse(excess))
    s0 = math.exp(mean + float(special.digamma(d0 / 2.0)) - math.log(d0 / 2.0))
    return Prior(d0, s0)


def within(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """The variance within both sides and its degrees of freedom."""
    df = len(x) + len(y) - 2
    if not x or not y or df < 1:
        return math.nan, 0.0
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    ss = math.fsum((v - mx) ** 2 for v in x) + math.fsum((v - my) ** 2 for v in y)
    return ss / df, float(df)


class FamilySpread:
    """The prior at each boundary of each segment, fitted to the
    within-sides variances of every series of one family at that boundary
    (run values aligned on the group's runs, NaN where a series has no
    run).  Under no change the series' variances there are independent
    scaled chi-squares; a series with a step elsewhere inflates its own,
    which only widens the prior."""

    def __init__(self, values: Sequence[Sequence[float]]) -> None:
        self.values = [list(v) for v in values]
        self._cache: dict[tuple[int, int, int], Prior] = {}

    def __call__(self, i: int, j: int, k: int) -> Prior:
        key = (i, j, k)
        if key not in self._cache:
            pairs = []
            for v in self.values:
                x = [a for a in v[i:k] if math.isfinite(a)]
                y = [a for a in v[k:j] if math.isfinite(a)]
                pairs.append(within(x, y))
            self._cache[key] = fit_prior(pairs, self.independent(i, j, k))
        return self._cache[key]

    def independent(self, i: int, j: int, k: int) -> float:
        """How many independent series the family's variances at this
        boundary are worth: G / (1 + (G - 1) r2), r2 the mean over pairs of
        series of their residuals' squared correlation less what it is
        between independent series (1 / the residuals' degrees of
        freedom).  A drift that moves every series of a run alike makes
        their variances one draw, not G (r2 near 1): without this the prior
        would lend a common drift the degrees of freedom of G series."""
        import numpy as np

        block = np.array([v[i:j] for v in self.values], dtype=float)  # series x runs
        cut = k - i
        resid = np.full_like(block, np.nan)
        for side in (slice(0, cut), slice(cut, None)):
            part = block[:, side]
            with np.errstate(invalid="ignore"):
                counts = np.isfinite(part).sum(axis=1, keepdims=True)
                means = np.nansum(part, axis=1, keepdims=True) / np.maximum(counts, 1)
            resid[:, side] = part - means
        known = np.isfinite(resid)
        r = np.where(known, resid, 0.0)
        norms = np.sqrt((r * r).sum(axis=1))
        use = norms > 0.0
        g = int(use.sum())
        if g < 2:
            return float(g)
        r, known = r[use] / norms[use, None], known[use]
        r2 = (r @ r.T) ** 2
        dof = np.maximum(known.astype(float) @ known.T.astype(float) - 2.0, 2.0)  # runs both have, less two means
        excess = np.clip((r2 - 1.0 / dof) / (1.0 - 1.0 / dof), 0.0, 1.0)
        mean = float((excess.sum() - np.trace(excess)) / (g * (g - 1)))
        return g / (1.0 + (g - 1) * mean)
