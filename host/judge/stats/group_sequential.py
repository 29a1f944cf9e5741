"""Group-sequential boundaries that use the looks' correlation: the
error-spending approach of Lan and DeMets with the boundaries found by
recursive numerical integration (Armitage, McPherson and Rowe; Jennison
and Turnbull, "Group Sequential Methods", ch. 19).  Pure functions of
numbers: no I/O.

Why it is built so: docs/architecture.md, "Module notes", host/judge/stats/group_sequential.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import optimize
from scipy import special as _special

# The grid covers the score within this many standard deviations of its
# spread (P(|Z| > 7) is 3e-12, below any share of alpha a look spends).
REACH_SD = 7.0
# Grid points a kernel standard deviation: the error of Simpson's rule
# falls 16-fold a doubling; at 4 the crossing chances are within 3e-5 of
# their own size (against adaptive quadrature and scipy's bivariate
# normal in tests/judge/test_group_sequential.py), far inside what the t taken
# as normal moves them.
POINTS_PER_SD = 4.0
# Points whose weight is below this share of the largest carry no chance a
# boundary could see; dropping them keeps the next convolution small.
NEGLIGIBLE = 1e-16
Z_RANGE = 40.0  # boundaries are searched in [-40, 40]


def _upper(x: np.ndarray | float) -> np.ndarray:
    """P(N(0, 1) >= x), accurate in the far tail."""
    return np.asarray(_special.ndtr(-np.asarray(x, dtype=float)))


def z_of(p: float, two_sided: bool) -> float:
    """The z whose tail is p: |Z| >= z two-sided, Z >= z one-sided."""
    p = min(max(p, 0.0), 1.0)
    if p <= 0.0:
        return math.inf
    return float(-_special.ndtri(p / 2.0)) if two_sided else float(-_special.ndtri(p))


def _simpson(low: float, high: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Simpson's rule on [low, high]: the points and their weights."""
    intervals = max(2, math.ceil((high - low) / step))
    intervals += intervals % 2
    x = np.linspace(low, high, intervals + 1)
    h = (high - low) / intervals
    w = np.full(intervals + 1, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return x, w * (h / 3.0)


@dataclasses.dataclass(frozen=True)
class Path:
    """The score's sub-density at the last look on the paths not crossed:
    ``masses`` at ``centres`` convolved with N(0, ``spread``), restricted to
    |s| < ``bound`` (two-sided) or s < ``bound`` (one-sided).  A Path with
    no look yet has ``information`` 0: a point mass at 0."""

    two_sided: bool
    information: float = 0.0
    centres: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1))
    masses: np.ndarray = dataclasses.field(default_factory=lambda: np.ones(1))
    spread: float = 0.0
    bound: float = math.inf
    looks: int = 0

    def _beyond(self, u: np.ndarray, b: float, sd: float) -> np.ndarray:
        """P(u + N(0, sd^2) beyond the score boundary b), for each u."""
        if self.two_sided:
            return _upper((b - u) / sd) + _upper((b + u) / sd)
        return _upper((b - u) / sd)

    def _band(self, low: float, high: float) -> float:
        """The sub-density's mass with low <= |s| < high (two-sided) or
        low <= s < high (one-sided), at the last look's information."""
        if high <= low:
            return 0.0
        sd = math.sqrt(self.spread)
        u, m = self.centres, self.masses
        between = self._beyond(u, low, sd) - (self._beyond(u, high, sd) if math.isfinite(high) else 0.0)
        return float(m @ between)

    def _not_crossed(self, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """The not-crossed sub-density at the last look as weighted points,
        on a grid fine enough for the kernels on both sides of it (from
        the centres, and to the next look, ``delta`` further on)."""
        if self.spread <= 0.0:
            keep = np.abs(self.centres) < self.bound if self.two_sided else self.centres < self.bound
            return self.centres[keep], self.masses[keep]
        reach = REACH_SD * math.sqrt(self.information)
        high = min(self.bound, reach)
        low = -high if self.two_sided else -reach
        if high <= low:
            return np.zeros(0), np.zeros(0)
        sd = math.sqrt(self.spread)
        x, w = _simpson(low, high, min(sd, math.sqrt(delta)) / POINTS_PER_SD)
        density = np.exp(-0.5 * ((x[:, None] - self.centres[None, :]) / sd) ** 2) @ self.masses
        weights = w * density / (sd * math.sqrt(2.0 * math.pi))
        keep = weights > NEGLIGIBLE * max(float(weights.max(initial=0.0)), NEGLIGIBLE)
        return x[keep], weights[keep]

    def _check(self, information: float) -> None:
        if not (math.isfinite(information) and information > 0.0):
            raise ValueError("a look's information must be a positive number")
        if information < self.information:
            raise ValueError("a look's information cannot be less than the last look's")

    def crossing(self, information: float, z: float) -> float:
        """P(no crossing at the looks so far, beyond z at a look with this
        information), under no effect."""
        return self.crossings(information)(z)

    def crossings(self, information: float) -> Callable[[float], float]:
        """``crossing`` at this information as a function of z, with the
        grid built once (a boundary's search evaluates it some 40 times)."""
        self._check(information)
        root = math.sqrt(information)
        if information == self.information:
            return lambda z: self._band(max(z * root, 0.0) if self.two_sided else z * root, self.bound)
        delta = information - self.information
        u, w = self._not_crossed(delta)
        sd = math.sqrt(delta)
        return lambda z: float(w @ self._beyond(u, z * root, sd)) if u.size else 0.0

    def p_value(self, information: float, p: float) -> float:
        """The increment-scale p of a raw p at this look: the chance of no
        crossing before and a statistic at least this extreme now.  At
        most p (the looks before only remove paths), monotone in p."""
        if p >= 1.0:
            return p
        return min(p, self.crossing(information, z_of(p, self.two_sided)))

    def boundary(self, information: float, level: float) -> float:
        """The z at this look whose first-crossing chance is ``level``."""
        f = self.crossings(information)
        if level <= 0.0:
            return math.inf
        if f(-Z_RANGE) <= level:
            return -Z_RANGE
        if f(Z_RANGE) >= level:
            return Z_RANGE
        return float(optimize.brentq(lambda z: f(z) - level, -Z_RANGE, Z_RANGE, xtol=1e-10, rtol=1e-12))

    def after(self, information: float, z: float) -> Path:
        """This path with a look at ``information`` whose boundary is z."""
        self._check(information)
        b = z * math.sqrt(information)
        if information == self.information:
            return dataclasses.replace(self, bound=min(self.bound, b), looks=self.looks + 1)
        delta = information - self.information
        u, w = self._not_crossed(delta)
        return Path(self.two_sided, information, u, w, delta, b, self.looks + 1)

    def nominal(self, z: float) -> float:
        """The raw p of a boundary z."""
        return float(2.0 * _upper(z)) if self.two_sided else float(_upper(z))


def boundaries(information: list[float], levels: list[float], two_sided: bool = True) -> list[float]:
    """The z boundaries of looks at these informations whose first-crossing
    chances are ``levels`` (the increments of a spending function)."""
    path = Path(two_sided)
    out = []
    for n, level in zip(information, levels, strict=True):
        z = path.boundary(n, level)
        out.append(z)
        path = path.after(n, z)
    return out
