"""The group-sequential recursion (host/judge/stats/group_sequential.py) against
what is known exactly: one look is the plain normal, two looks' crossing
chances are bivariate-normal integrals, equal-information designs have
the tabled Pocock and O'Brien-Fleming constants, and the increment-scale
p is at most the raw p and monotone in it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from memqual.host.judge.stats import group_sequential as gs


@pytest.mark.parametrize("two_sided", [True, False])
@pytest.mark.parametrize("information", [1.0, 2.0, 7.0, 60.0])
@pytest.mark.parametrize("level", [0.05, 0.01, 1e-4, 1e-7])
def test_one_look_is_the_plain_level(two_sided, information, level):
    path = gs.Path(two_sided)
    z = path.boundary(information, level)
    assert path.nominal(z) == pytest.approx(level, rel=1e-8)
    assert path.p_value(information, level) == pytest.approx(level, rel=1e-8)


def _two_looks_exact(n1: float, n2: float, z1: float, z2: float, two_sided: bool) -> float:
    """P(not beyond z1 at look 1, beyond z2 at look 2) by adaptive
    quadrature over look 1's statistic (Z2 = r Z1 + sqrt(1 - r^2) W)."""
    r = math.sqrt(n1 / n2)
    s = math.sqrt(1.0 - r * r)

    def inner(x: float) -> float:
        up = stats.norm.sf((z2 - r * x) / s)
        return stats.norm.pdf(x) * (up + stats.norm.cdf((-z2 - r * x) / s) if two_sided else up)

    low = -z1 if two_sided else -12.0
    return integrate.quad(inner, low, z1, epsabs=1e-15, epsrel=1e-12)[0]


# (n1, n2, z1, z2): blocks at the two looks and the boundaries there.
TWO_LOOKS = [
    (2, 5, 2.5, 2.3),
    (3, 4, 3.0, 2.9),
    (10, 11, 2.8, 2.6),
    (3, 30, 3.0, 2.0),
    (40, 41, 3.5, 3.4),
]


@pytest.mark.parametrize("two_sided", [True, False])
@pytest.mark.parametrize(("n1", "n2", "z1", "z2"), TWO_LOOKS)
def test_two_looks_against_the_bivariate_normal(two_sided, n1, n2, z1, z2):
    got = gs.Path(two_sided).after(n1, z1).crossing(n2, z2)
    assert got == pytest.approx(_two_looks_exact(n1, n2, z1, z2, two_sided), rel=1e-4)


def test_two_looks_against_scipy_multivariate_normal():
    # P(|Z1| < z1, |Z2| >= z2) = P(|Z1| < z1) - P(|Z1| < z1, |Z2| < z2): the box by its corners.
    n1, n2, z1, z2 = 4.0, 9.0, 2.6, 2.4
    r = math.sqrt(n1 / n2)
    mvn = stats.multivariate_normal([0.0, 0.0], [[1.0, r], [r, 1.0]])
    box = mvn.cdf([z1, z2]) - mvn.cdf([-z1, z2]) - mvn.cdf([z1, -z2]) + mvn.cdf([-z1, -z2])
    exact = (2.0 * stats.norm.cdf(z1) - 1.0) - box
    assert gs.Path(True).after(n1, z1).crossing(n2, z2) == pytest.approx(exact, rel=1e-3)
    one_sided = stats.norm.cdf(z1) - mvn.cdf([z1, z2])
    assert gs.Path(False).after(n1, z1).crossing(n2, z2) == pytest.approx(one_sided, rel=1e-3)


def _total(information: list[float], zs: list[float], two_sided: bool = True) -> float:
    path, total = gs.Path(two_sided), 0.0
    for n, z in zip(information, zs, strict=True):
        total += path.crossing(n, z)
        path = path.after(n, z)
    return total


@pytest.mark.parametrize("scale", [1.0, 3.0, 20.0])
def test_equal_information_has_the_tabled_constants(scale):
    # Jennison and Turnbull, Table 2.1 and 2.3: K = 5 equally spaced looks,
    # two-sided 0.05: Pocock's constant 2.413, O'Brien-Fleming's 2.040 sqrt(5/k).
    info = [scale * k for k in range(1, 6)]
    assert _total(info, [2.413] * 5) == pytest.approx(0.05, abs=1e-4)
    assert _total(info, [2.040 * math.sqrt(5 / k) for k in range(1, 6)]) == pytest.approx(0.05, abs=1e-4)


def test_boundaries_spend_the_levels_given():
    info = [2.0, 3.0, 5.0, 6.0, 6.0, 9.0]
    levels = [1e-4, 3e-4, 1e-3, 2e-3, 2e-3, 4e-3]
    for two_sided in (True, False):
        zs = gs.boundaries(info, levels, two_sided)
        path = gs.Path(two_sided)
        for n, z, level in zip(info, zs, levels, strict=True):
            assert path.crossing(n, z) == pytest.approx(level, rel=1e-6)
            path = path.after(n, z)
        # The correlation gives back what Bonferroni wastes: the nominal
        # levels after the first are above the increments.
        nominal = [gs.Path(two_sided).nominal(z) for z in zs]
        assert nominal[0] == pytest.approx(levels[0], rel=1e-6)
        assert all(p > level for p, level in zip(nominal[1:], levels[1:], strict=True))


def test_a_look_with_no_new_blocks_is_the_same_statistic():
    # No new information: crossing now means lying between this look's
    # boundary and the last one's, exactly.
    path = gs.Path(True).after(5.0, 2.5)
    expected = 2.0 * (stats.norm.cdf(2.5) - stats.norm.cdf(2.2))
    assert path.crossing(5.0, 2.2) == pytest.approx(expected, rel=1e-9)
    assert path.crossing(5.0, 2.7) == 0.0


@pytest.mark.parametrize("two_sided", [True, False])
def test_the_increment_scale_p_is_at_most_p_and_monotone(two_sided):
    path = gs.Path(two_sided)
    for n, z in ((2.0, 3.2), (3.0, 3.0), (5.0, 2.9), (6.0, 2.8)):
        path = path.after(n, z)
    ps = np.geomspace(1e-9, 1.0, 200)
    got = [path.p_value(8.0, float(p)) for p in ps]
    assert all(g <= p for g, p in zip(got, ps, strict=True))
    assert all(b >= a for a, b in zip(got, got[1:], strict=False))
    # Far beyond the boundaries before, a path almost surely crossed one.
    assert got[0] < 1e-3 * ps[0]


def test_a_look_needs_more_information_than_the_last():
    path = gs.Path(True).after(5.0, 2.5)
    with pytest.raises(ValueError, match="less than"):
        path.crossing(4.0, 2.0)
    with pytest.raises(ValueError, match="positive"):
        gs.Path(True).crossing(0.0, 2.0)
